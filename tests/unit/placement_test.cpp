// Placement without sockets: hand-built tables of free cores in, agent ids out
// (agent/placement.h). Expected placements are worked out by hand in the comments.
#include <gtest/gtest.h>

#include "agent/placement.h"

using namespace dltrain::agent;

TEST(Placement, EachTaskGoesToTheAgentWithTheMostFreeCores) {
  // a:4 b:2 c:3, one core per task: a (4 → 3); a and c tie at 3, the first in table
  // order wins: a (3 → 2); c has the most: c (3 → 2); a, b, c tie at 2: a.
  const auto p = place({{"a", 4}, {"b", 2}, {"c", 3}}, 4, 1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (std::vector<std::string>{"a", "a", "c", "a"}));
}

TEST(Placement, ThreadsPerTaskAreTakenWholeOnOneAgent) {
  // 2 cores per task: a:3 → one task (1 left); b:4 → two; no agent has 2 for a fourth.
  const auto three = place({{"a", 3}, {"b", 4}}, 3, 2);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(*three, (std::vector<std::string>{"b", "a", "b"}));
  EXPECT_FALSE(place({{"a", 3}, {"b", 4}}, 4, 2).has_value());
  EXPECT_FALSE(place({}, 1, 1).has_value());
  EXPECT_EQ(place({{"a", 1}}, 0, 1)->size(), 0u);
}

TEST(Placement, FitsCountsWholeTaskSlotsOfIdleAgents) {
  // 4 one-core agents hold 4 one-core tasks, not 5 (4 workers + 1 PS shard).
  EXPECT_TRUE(fits({1, 1, 1, 1}, 4, 1));
  EXPECT_FALSE(fits({1, 1, 1, 1}, 5, 1));
  // 3 cores hold one 2-core task, not two: slots are per agent.
  EXPECT_FALSE(fits({3}, 2, 2));
  EXPECT_TRUE(fits({3, 2}, 2, 2));
}

TEST(Placement, AReassignedJobStaysWhereItsAgentsLiveAndMovesTheRest) {
  // ps-0 on a (alive, 2 free), worker-0 on lost agent x, worker-1 finished (skipped),
  // worker-2 on b (alive, 1 free). 1 core each: ps-0 stays on a (a: 1 left), worker-2
  // stays on b (b: 0), worker-0 moves to the agent with the most free: a (1) vs c (1) →
  // a, the first in table order.
  const std::vector<AgentSlots> agents{{"a", 2}, {"b", 1}, {"c", 1}};
  const std::vector<Replacing> tasks{{"a", false, {}}, {"x", false, {}}, {"b", true, {}}, {"b", false, {}}};
  const auto r = place_again(agents, tasks, 1);
  EXPECT_EQ(r.placement, (std::vector<std::string>{"a", "a", "", "b"}));
  EXPECT_TRUE(r.unplaced.empty());
}

TEST(Placement, AnAgentStillRunningAnOrphanOfTheTaskIsAvoided) {
  // worker-0 ran on a, which still runs its orphan: it must not stay there, nor go back;
  // b is the only other choice.
  const std::vector<AgentSlots> agents{{"a", 4}, {"b", 1}};
  const auto r = place_again(agents, {{"a", false, {"a"}}}, 1);
  EXPECT_EQ(r.placement, (std::vector<std::string>{"b"}));
  // With b full there is no place: the task is listed as unplaced.
  const auto none = place_again({{"a", 4}, {"b", 0}}, {{"a", false, {"a"}}}, 1);
  EXPECT_EQ(none.placement, (std::vector<std::string>{""}));
  EXPECT_EQ(none.unplaced, (std::vector<std::size_t>{0}));
}

TEST(Placement, TheRegistryOffersOnlyConnectedLiveAgents) {
  AgentRegistry reg;
  // No session: registered but not connected, so not live.
  reg["a"] = AgentRec{"a", "10.0.0.1", 4, 3, 0, "cpu", {}, {}, false, false, {}};
  EXPECT_FALSE(reg.live("a"));
  EXPECT_TRUE(reg.slots().empty());
  EXPECT_EQ(reg.free_cores(), 0);
  EXPECT_EQ(reg.hardware_class(), "cpu");
  reg.release_cores("a", 1);
  EXPECT_EQ(reg.at("a").free_cores, 4);
  reg.release_cores("nobody", 1);  // ignored
  reg.at("a").orphans[orphan_key("job-1", "worker-0", 2)] = 1;
  EXPECT_TRUE(reg.holds_orphan("a", "job-1", "worker-0"));
  EXPECT_FALSE(reg.holds_orphan("a", "job-1", "worker-1"));
  EXPECT_FALSE(reg.holds_orphan("a", "job-10", "worker-0"));
  EXPECT_EQ(orphan_key("job-1", "worker-0", 2), "job-1/worker-0/2");
}
