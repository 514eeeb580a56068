// Placement without sockets: hand-built tables of free cores in, agent ids out
// (leader/placement.h). Expected placements are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <set>

#include "leader/placement.h"

using namespace dltrain::leader;

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
  reg.at("a").orphans[orphan_key("job-1", "worker-0", 2)] = TaskHold{1, {}};
  EXPECT_TRUE(reg.holds_orphan("a", "job-1", "worker-0"));
  EXPECT_FALSE(reg.holds_orphan("a", "job-1", "worker-1"));
  EXPECT_FALSE(reg.holds_orphan("a", "job-10", "worker-0"));
  EXPECT_EQ(orphan_key("job-1", "worker-0", 2), "job-1/worker-0/2");
}

// ---------------------------------------------------------------- GPUs (docs/gpu.md)

namespace {
dltrain::wire::GpuInfo gpu(int index, const std::string& model = "NVIDIA H200") { return {{}, index, model, "GPU-" + std::to_string(index), 143771}; }
}  // namespace

TEST(GpuPlacement, GpuWorkersFillOneAgentFirstAndTakeItsLowestFreeGpus) {
  // Two PS shards (CPU) and three workers of 1 GPU. "a" has GPUs 0-3 with 1 and 3 free,
  // "b" GPUs 0-1 free, "c" none. The first worker goes to the agent with the most free
  // GPUs (a and b tie at 2: the first, a), the second stays with it (this job's workers
  // together, and a is then full), the third goes to b, the only one left with room.
  // The shards go to the most free cores: c (8), then c again (6, against b's 2 and a's 0).
  const std::vector<AgentSlots> agents{{"a", 4, {3, 1}}, {"b", 4, {0, 1}}, {"c", 8, {}}};
  const auto p = place(agents, job_needs(2, 3, 2, 1));
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->size(), 5u);
  EXPECT_EQ((*p)[0].agent, "c");
  EXPECT_EQ((*p)[1].agent, "c");
  EXPECT_TRUE((*p)[0].gpus.empty());
  EXPECT_EQ((*p)[2].agent, "a");
  EXPECT_EQ((*p)[2].gpus, std::vector<int>({1}));
  EXPECT_EQ((*p)[3].agent, "a");
  EXPECT_EQ((*p)[3].gpus, std::vector<int>({3}));
  EXPECT_EQ((*p)[4].agent, "b");
  EXPECT_EQ((*p)[4].gpus, std::vector<int>({0}));
}

TEST(GpuPlacement, NeverTwoTasksOnOneGpuAndAWorkerGetsAllItsGpusOnOneAgent) {
  // Three workers of 2 GPUs on agents of 3 and 3 GPUs: one fits on each (3 = 2 + 1
  // left over), the third finds no agent with 2 free although 2 GPUs are free in all.
  const std::vector<AgentSlots> agents{{"a", 16, {0, 1, 2}}, {"b", 16, {0, 1, 2}}};
  EXPECT_FALSE(place(agents, job_needs(0, 3, 1, 2)).has_value());
  EXPECT_FALSE(fits(agents, job_needs(0, 3, 1, 2)));
  const auto two = place(agents, job_needs(0, 2, 1, 2));
  ASSERT_TRUE(two.has_value());
  std::set<std::pair<std::string, int>> used;
  for (const auto& t : *two) {
    ASSERT_EQ(t.gpus.size(), 2u);
    for (const int g : t.gpus) EXPECT_TRUE(used.insert({t.agent, g}).second) << t.agent << " GPU " << g << " twice";
  }
  EXPECT_EQ((*two)[0].gpus, std::vector<int>({0, 1}));
}

TEST(GpuPlacement, AGpuTaskAlsoNeedsItsCores) {
  // "a" has a free GPU but no free core; "b" has both.
  const auto p = place({{"a", 0, {0}}, {"b", 1, {5}}}, job_needs(0, 1, 1, 1));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)[0].agent, "b");
  EXPECT_EQ((*p)[0].gpus, std::vector<int>({5}));
  EXPECT_FALSE(place({{"a", 0, {0}}}, job_needs(0, 1, 1, 1)).has_value());
}

TEST(GpuPlacement, APlacementAgainKeepsATaskOnItsAgentOnlyWithItsGpusFree) {
  // worker-0 ran on "a", which has no free GPU now, so it cannot stay; worker-1 stays
  // on "b" and takes b's only free GPU, so worker-0 finds no place.
  const std::vector<AgentSlots> agents{{"a", 4, {}}, {"b", 4, {2}}};
  const auto r = place_again(agents, {{"a", false, {}, 1}, {"b", false, {}, 1}}, 1);
  EXPECT_EQ(r.placement[1], "b");
  EXPECT_EQ(r.gpus[1], std::vector<int>({2}));
  ASSERT_EQ(r.unplaced, std::vector<std::size_t>({0}));
  // With a second free GPU on b, worker-0 goes there too, with the other index.
  const auto r2 = place_again({{"a", 4, {}}, {"b", 4, {2, 7}}}, {{"a", false, {}, 1}, {"b", false, {}, 1}}, 1);
  EXPECT_TRUE(r2.unplaced.empty());
  EXPECT_EQ(r2.placement[0], "b");
  EXPECT_EQ(r2.gpus[1], std::vector<int>({2}));
  EXPECT_EQ(r2.gpus[0], std::vector<int>({7}));
}

TEST(GpuPlacement, TheRegistryTakesAndGivesBackGpusAndNamesTheGpuModelInTheHardwareClass) {
  AgentRegistry reg;
  auto& a = reg["a"];
  a.id = "a";
  a.cores = 8;
  a.free_cores = 8;
  a.hardware_class = "cpu";
  a.gpus = {gpu(0), gpu(1), gpu(2)};
  a.free_gpus = {0, 1, 2};
  reg.take("a", TaskHold{2, {1}});
  EXPECT_EQ(reg.at("a").free_cores, 6);
  EXPECT_EQ(reg.at("a").free_gpus, std::vector<int>({0, 2}));
  reg.release("a", TaskHold{2, {1}});
  reg.release("a", TaskHold{0, {1, 9}});  // already free, and not offered: both ignored
  EXPECT_EQ(reg.at("a").free_cores, 8);
  EXPECT_EQ(reg.at("a").free_gpus, std::vector<int>({0, 1, 2}));
  EXPECT_EQ(reg.hardware_class(), "cpu");
  EXPECT_EQ(reg.hardware_class(true), "cpu/NVIDIA H200");
}

TEST(GpuPlacement, TheWorkersOfALocalGroupJobArePackedOnOneAgent) {
  // Three CPU workers with pack (local_group = true) on two idle agents of 4 cores: all
  // three on "a" (the first of the tie, then the one holding the job's workers); the PS
  // shard then goes to the most free cores, "b". Without pack they spread: a, b, a.
  const std::vector<AgentSlots> agents{{"a", 4, {}}, {"b", 4, {}}};
  const auto packed = place(agents, job_needs(1, 3, 1, 0, true));
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ((*packed)[0].agent, "b");
  for (int w = 1; w <= 3; ++w) EXPECT_EQ((*packed)[static_cast<std::size_t>(w)].agent, "a") << w;
  const auto spread = place(agents, job_needs(1, 3, 1, 0, false));
  ASSERT_TRUE(spread.has_value());
  EXPECT_EQ((*spread)[0].agent, "a");
  EXPECT_EQ((*spread)[1].agent, "b");
  EXPECT_EQ((*spread)[2].agent, "a");
  EXPECT_EQ((*spread)[3].agent, "b");
}

TEST(ShardSpread, OneShardBesideTheWorkersOfEveryMachineWithRoom) {
  // ps_shards = "auto" on four agents of 2 cores, 4 workers of 1 core: place() puts
  // shard 0 on a (all tie at 2: the first), then the workers on b, c, d (2 free each
  // against a's 1) and a. Left free: a 0, b 1, c 1, d 1. The workers' machines in rank
  // order are b, c, d, a; a already holds shard 0 and no core: shards 1-3 go to b, c, d.
  const std::vector<AgentSlots> free{{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}};
  const auto needs = job_needs(1, 4, 1, 0);
  const auto p = place(free, needs);
  ASSERT_TRUE(p.has_value());
  std::vector<std::string> where;
  for (const auto& x : *p) where.push_back(x.agent);
  ASSERT_EQ(where, (std::vector<std::string>{"a", "b", "c", "d", "a"}));
  EXPECT_EQ(spread_shards(free, needs, *p, 1, 1, 256), (std::vector<std::string>{"b", "c", "d"}));
  // At most max_shards in all (the model's partitions): shard 0 and one more.
  EXPECT_EQ(spread_shards(free, needs, *p, 1, 1, 2), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(spread_shards(free, needs, *p, 1, 1, 1).empty());
}

TEST(ShardSpread, AMachineFullOfWorkersGetsNoShardAndTwoWorkersShareOne) {
  // Agents of one core each (the tests' clusters): no core is left beside any worker,
  // so the job keeps its one shard.
  const std::vector<AgentSlots> ones{{"a", 1}, {"b", 1}, {"c", 1}};
  const auto two = job_needs(1, 2, 1, 0);
  const auto p = place(ones, two);
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(spread_shards(ones, two, *p, 1, 1, 256).empty());
  // 2 cores per task on a:6 b:4: shard 0 on a (6 → 4); worker 0 on a (a and b tie at 4:
  // the first), worker 1 on b (4 against a's 2), worker 2 on a (a and b tie at 2).
  // Left: a 0, b 2. a holds shard 0; b has its 2 cores for one shard of 2.
  const std::vector<AgentSlots> big{{"a", 6}, {"b", 4}};
  const auto three = job_needs(1, 3, 2, 0);
  const auto q = place(big, three);
  ASSERT_TRUE(q.has_value());
  std::vector<std::string> where;
  for (const auto& x : *q) where.push_back(x.agent);
  ASSERT_EQ(where, (std::vector<std::string>{"a", "a", "b", "a"}));
  EXPECT_EQ(spread_shards(big, three, *q, 1, 2, 256), (std::vector<std::string>{"b"}));
  // With 3 cores a shard needs, b's 2 are not enough.
  EXPECT_TRUE(spread_shards(big, three, *q, 1, 3, 256).empty());
}

TEST(ShardSpread, GpuWorkersPackedOnOneMachineGetAShardBesideThem) {
  // Two workers of 1 GPU packed on g (8 cores, GPUs 0-1); shard 0 on c, the agent with
  // the most free cores (16). g keeps 6 cores: one shard goes beside the GPU workers.
  const std::vector<AgentSlots> free{{"g", 8, {0, 1}}, {"c", 16, {}}};
  const auto needs = job_needs(1, 2, 1, 1);
  const auto p = place(free, needs);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ((*p)[0].agent, "c");
  ASSERT_EQ((*p)[1].agent, "g");
  ASSERT_EQ((*p)[2].agent, "g");
  EXPECT_EQ(spread_shards(free, needs, *p, 1, 1, 256), (std::vector<std::string>{"g"}));
}

TEST(ShardSpread, AShardNeverTakesTheLastCoreOfAFreeGpu) {
  // One worker of 1 GPU on g (2 cores, GPUs 0-1); shard 0 on c (4 cores against g's 2).
  // g keeps 1 core and GPU 1: a shard there would leave GPU 1 no core, so none goes.
  const std::vector<AgentSlots> free{{"g", 2, {0, 1}}, {"c", 4, {}}};
  const auto needs = job_needs(1, 1, 1, 1);
  const auto p = place(free, needs);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ((*p)[0].agent, "c");
  ASSERT_EQ((*p)[1].agent, "g");
  EXPECT_TRUE(spread_shards(free, needs, *p, 1, 1, 256).empty());
  // With 3 cores, g keeps 2: one for GPU 1, one for a shard.
  const std::vector<AgentSlots> roomy{{"g", 3, {0, 1}}, {"c", 4, {}}};
  const auto q = place(roomy, needs);
  ASSERT_TRUE(q.has_value());
  ASSERT_EQ((*q)[1].agent, "g");
  EXPECT_EQ(spread_shards(roomy, needs, *q, 1, 1, 256), (std::vector<std::string>{"g"}));
}

TEST(ShardPlacement, AShardedDataSetsWorkersGoOnlyToAgentsWithACacheAndPreferTheirShards) {
  // a: 4 free cores, no shard cache; b and c: 2 free each, with caches; c holds 100 bytes
  // of worker 0's shards, nobody holds worker 1's. The PS shard (no data) goes to the most
  // free cores: a (4 → 3). Worker 0: a is out (no cache); c holds its shards → c (2 → 1).
  // Worker 1: b (2 free) over c (1 free), nothing cached → b. Without reads_shards the
  // same workers would go to a, the most free cores.
  const std::vector<AgentSlots> agents{{"a", 4, {}, false}, {"b", 2, {}, true}, {"c", 2, {}, true}};
  std::vector<TaskNeed> needs{{1, 0, false, {}, false}, {1, 0, false, {{"c", 100}}, true}, {1, 0, false, {}, true}};
  const auto p = place(agents, needs);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)[0].agent, "a");
  EXPECT_EQ((*p)[1].agent, "c");
  EXPECT_EQ((*p)[2].agent, "b");
  for (auto& n : needs) n.reads_shards = false;
  EXPECT_EQ((*place(agents, needs))[2].agent, "a");
  // Three such workers fit b and c (2 + 2 cores), five do not, though a has 4 more.
  const std::vector<TaskNeed> three(3, TaskNeed{1, 0, false, {}, true}), five(5, TaskNeed{1, 0, false, {}, true});
  EXPECT_TRUE(fits(agents, three));
  EXPECT_FALSE(fits(agents, five));
  EXPECT_FALSE(fits({{"a", 64, {}, false}}, three));
}

TEST(ShardPlacement, PackedGpuWorkersWeighTheCacheAfterTheJobsOtherWorkers) {
  // g1 and g2: 2 GPUs and 4 cores each, both with caches. Worker 0 (1 GPU): nothing of the
  // job is placed yet; g2 holds 50 bytes of its shards → g2, GPU 0. Worker 1: g1 holds 10
  // bytes of its shards, but g2 holds one of the job's GPU workers already (a larger local
  // group) → g2, GPU 1.
  const std::vector<AgentSlots> agents{{"g1", 4, {0, 1}, true}, {"g2", 4, {0, 1}, true}};
  const std::vector<TaskNeed> needs{{1, 1, true, {{"g2", 50}}, true}, {1, 1, true, {{"g1", 10}}, true}};
  const auto p = place(agents, needs);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)[0].agent, "g2");
  EXPECT_EQ((*p)[0].gpus, std::vector<int>{0});
  EXPECT_EQ((*p)[1].agent, "g2");
  EXPECT_EQ((*p)[1].gpus, std::vector<int>{1});
}

TEST(ShardPlacement, AReplacedWorkerOfAShardedDataSetNeedsAnAgentWithACache) {
  // The worker's agent x is gone; a has room but no cache: unplaced (it waits), while a
  // PS shard of the same job moves to a.
  const std::vector<AgentSlots> agents{{"a", 4, {}, false}};
  const std::vector<Replacing> tasks{{"x", false, {}, 0, false}, {"x", false, {}, 0, true}};
  const auto r = place_again(agents, tasks, 1);
  EXPECT_EQ(r.placement, (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(r.unplaced, std::vector<std::size_t>{1});
}
