// The leader's scheduler (leader/scheduler.h) over plain counts: the queue and its
// admission rule, each case worked out by hand from the agents' cores and GPUs.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "leader/scheduler.h"

using namespace dltrain::leader;

namespace {

// Each job's needs, by id.
using Needs = std::map<std::string, std::vector<TaskNeed>>;

std::vector<TaskNeed> cpu_tasks(int n) { return std::vector<TaskNeed>(static_cast<std::size_t>(n), TaskNeed{1, 0, false, {}}); }

std::vector<std::string> ids(const std::vector<Admitted>& a) {
  std::vector<std::string> out;
  for (const auto& x : a) out.push_back(x.job);
  return out;
}

std::vector<std::string> queued(const Scheduler& s) { return {s.jobs().begin(), s.jobs().end()}; }

std::vector<Admitted> admit(Scheduler& s, const std::vector<AgentSlots>& idle, const std::vector<AgentSlots>& free,
                            const Needs& needs) {
  return s.admit(idle, free, [&](const std::string& job) { return needs.at(job); });
}

}  // namespace

TEST(Scheduler, TheQueueKeepsArrivalOrderOnceEachAndSaysWhereAJobStands) {
  Scheduler s;
  s.enqueue("job-1");
  s.enqueue("job-2");
  s.enqueue("job-1");  // already queued
  s.enqueue("job-3");
  EXPECT_EQ(queued(s), (std::vector<std::string>{"job-1", "job-2", "job-3"}));
  EXPECT_EQ(s.position("job-1"), 1u);
  EXPECT_EQ(s.position("job-3"), 3u);
  EXPECT_EQ(s.position("job-9"), 0u);
  EXPECT_TRUE(s.remove("job-2"));
  EXPECT_FALSE(s.remove("job-2"));
  EXPECT_EQ(s.position("job-3"), 2u);
  EXPECT_EQ(s.size(), 2u);
}

// Agents a and b of 2 cores each, all free: job-1 (3 tasks) takes 3 cores, job-2 (1)
// the fourth; job-3 (1) fits the idle cluster but nothing is free: it stays first.
TEST(Scheduler, JobsStartInOrderWhileTheFreeCoresLastAndEachPlacementIsTakenFromThem) {
  Scheduler s;
  for (const char* j : {"job-1", "job-2", "job-3"}) s.enqueue(j);
  const std::vector<AgentSlots> idle{{"a", 2, {}}, {"b", 2, {}}};
  const auto started = admit(s, idle, idle, {{"job-1", cpu_tasks(3)}, {"job-2", cpu_tasks(1)}, {"job-3", cpu_tasks(1)}});
  EXPECT_EQ(ids(started), (std::vector<std::string>{"job-1", "job-2"}));
  ASSERT_EQ(started[0].placement.size(), 3u);
  ASSERT_EQ(started[1].placement.size(), 1u);
  // Three of a's and b's four cores to job-1, the last one to job-2: two tasks per agent.
  std::map<std::string, int> per_agent;
  for (const auto& a : started) {
    for (const auto& p : a.placement) ++per_agent[p.agent];
  }
  EXPECT_EQ(per_agent, (std::map<std::string, int>{{"a", 2}, {"b", 2}}));
  EXPECT_EQ(queued(s), (std::vector<std::string>{"job-3"}));
}

// One core free of four: job-1 (2 tasks) fits the cluster, not the free core, so job-2 (1
// task), which would fit, waits behind it.
TEST(Scheduler, AJobThatFitsTheClusterButNotItsFreeCoresIsNotOvertaken) {
  Scheduler s;
  s.enqueue("job-1");
  s.enqueue("job-2");
  const auto started = admit(s, {{"a", 2, {}}, {"b", 2, {}}}, {{"a", 1, {}}, {"b", 0, {}}},
                             {{"job-1", cpu_tasks(2)}, {"job-2", cpu_tasks(1)}});
  EXPECT_TRUE(started.empty());
  EXPECT_EQ(queued(s), (std::vector<std::string>{"job-1", "job-2"}));
}

// job-1 needs 5 cores of a 4-core cluster: it waits for agents to join without blocking
// job-2, which starts.
TEST(Scheduler, AJobTooLargeForTheWholeClusterBlocksNobody) {
  Scheduler s;
  s.enqueue("job-1");
  s.enqueue("job-2");
  const std::vector<AgentSlots> idle{{"a", 2, {}}, {"b", 2, {}}};
  const auto started = admit(s, idle, idle, {{"job-1", cpu_tasks(5)}, {"job-2", cpu_tasks(1)}});
  EXPECT_EQ(ids(started), (std::vector<std::string>{"job-2"}));
  EXPECT_EQ(queued(s), (std::vector<std::string>{"job-1"}));
}

// One agent with 4 cores and GPUs 0 and 1; three jobs of one GPU worker each: the first
// gets GPU 0, the second GPU 1, the third waits (cores are left, GPUs are not).
TEST(Scheduler, GpusTakenByOneJobAreNotOfferedToTheNext) {
  Scheduler s;
  for (const char* j : {"job-1", "job-2", "job-3"}) s.enqueue(j);
  const std::vector<AgentSlots> idle{{"g", 4, {0, 1}}};
  const auto one_gpu = job_needs(0, 1, 1, 1);
  const auto started = admit(s, idle, idle, {{"job-1", one_gpu}, {"job-2", one_gpu}, {"job-3", one_gpu}});
  ASSERT_EQ(ids(started), (std::vector<std::string>{"job-1", "job-2"}));
  EXPECT_EQ(started[0].placement[0].gpus, (std::vector<int>{0}));
  EXPECT_EQ(started[1].placement[0].gpus, (std::vector<int>{1}));
  EXPECT_EQ(queued(s), (std::vector<std::string>{"job-3"}));
}

TEST(Scheduler, OnlyAJobWithNoneQueuedBehindItSpreadsAndItsShardsAreTaken) {
  // a:2 b:2; ps_shards = "auto" jobs: 1 shard + 2 workers. place(): shard 0 on a (a
  // tie: the first), workers on b (2 against a's 1) and a (a tie at 1); b keeps a core.
  const std::vector<AgentSlots> agents{{"a", 2}, {"b", 2}};
  const auto spread = [](const std::string&) { return std::optional(ShardSpread{1, 1, 256}); };
  {
    // With job 2 (one task) queued behind it, job 1 does not spread: b's last core goes
    // to job 2.
    Scheduler s;
    s.enqueue("job-1");
    s.enqueue("job-2");
    const Needs needs{{"job-1", cpu_tasks(3)}, {"job-2", cpu_tasks(1)}};
    const auto a = s.admit(agents, agents, [&](const std::string& job) { return needs.at(job); }, spread);
    ASSERT_EQ(ids(a), (std::vector<std::string>{"job-1", "job-2"}));
    EXPECT_TRUE(a[0].added_shards.empty());
    EXPECT_TRUE(a[1].added_shards.empty());  // none of b's cores left beside job 2's task
    ASSERT_EQ(a[1].placement.size(), 1u);
    EXPECT_EQ(a[1].placement[0].agent, "b");
  }
  {
    // Alone in the queue, job 1 puts a second shard on b: a machine of its workers
    // without a shard of it and with a core left.
    Scheduler s;
    s.enqueue("job-1");
    const Needs needs{{"job-1", cpu_tasks(3)}};
    const auto a = s.admit(agents, agents, [&](const std::string& job) { return needs.at(job); }, spread);
    ASSERT_EQ(ids(a), (std::vector<std::string>{"job-1"}));
    EXPECT_EQ(a[0].added_shards, (std::vector<std::string>{"b"}));
  }
}

TEST(SchedulerQuotas, AJobItsOwnersQuotaDoesNotAllowWaitsWithoutBlockingOtherUsers) {
  // One agent of 8 cores. alice may run 1 job at once and hold 4 cores; bob has no bounds.
  // Queue: a1 (alice, 2 tasks), a2 (alice, 2), b1 (bob, 2), a3 (alice, 5 tasks).
  // a1: fits, alice 0 jobs → admitted (alice: 1 job, 2 cores). a2: alice would run 2 jobs
  // → passed over. b1: bob unbounded → admitted. a3: 5 cores > alice's 4 → passed over.
  // Free after: 8 − 2 − 2 = 4 cores.
  Scheduler s;
  for (const char* j : {"a1", "a2", "b1", "a3"}) s.enqueue(j);
  const Needs needs{{"a1", cpu_tasks(2)}, {"a2", cpu_tasks(2)}, {"b1", cpu_tasks(2)}, {"a3", cpu_tasks(5)}};
  const std::vector<AgentSlots> agent{{"x", 8}};
  AdmitQuotas q;
  q.owner_of = [](const std::string& job) { return job[0] == 'a' ? std::string("alice") : std::string("bob"); };
  q.by_user["alice"] = Quota{4, 0, 1, 0, 0, 0};
  const auto first = s.admit(agent, agent, [&](const std::string& j) { return needs.at(j); }, {}, q);
  EXPECT_EQ(ids(first), (std::vector<std::string>{"a1", "b1"}));
  EXPECT_EQ(queued(s), (std::vector<std::string>{"a2", "a3"}));
  // a1 ended: alice runs nothing. 8 free cores: a2 (2 cores, 1 job) is admitted; a3 still
  // needs 5 > 4 cores of alice's quota (the leader refuses such a job at submit; here it
  // only waits).
  q.by_user["alice"] = Quota{4, 0, 1, 0, 0, 0};
  const auto second = s.admit(agent, agent, [&](const std::string& j) { return needs.at(j); }, {}, q);
  EXPECT_EQ(ids(second), (std::vector<std::string>{"a2"}));
  EXPECT_EQ(queued(s), (std::vector<std::string>{"a3"}));
}

TEST(SchedulerQuotas, AUsersLaterJobDoesNotOvertakeOneHeldByTheirQuota) {
  // One agent of 8 cores; dave may hold 4 cores and already holds 2. Queue: d1 (4 tasks:
  // 2 + 4 > 4, held), d2 (1 task: 2 + 1 ≤ 4 would fit, but waits behind d1), e1 (eve,
  // unbounded, 1 task) → admitted.
  Scheduler s;
  for (const char* j : {"d1", "d2", "e1"}) s.enqueue(j);
  const Needs needs{{"d1", cpu_tasks(4)}, {"d2", cpu_tasks(1)}, {"e1", cpu_tasks(1)}};
  const std::vector<AgentSlots> agent{{"x", 8}};
  AdmitQuotas q;
  q.owner_of = [](const std::string& job) { return job[0] == 'd' ? std::string("dave") : std::string("eve"); };
  q.by_user["dave"] = Quota{4, 0, 0, 2, 0, 1};
  const auto a = s.admit(agent, {{"x", 6}}, [&](const std::string& j) { return needs.at(j); }, {}, q);
  EXPECT_EQ(ids(a), std::vector<std::string>{"e1"});
  EXPECT_EQ(queued(s), (std::vector<std::string>{"d1", "d2"}));
}

TEST(SchedulerQuotas, JobsAdmittedInOnePassCountAgainstTheQuotaAndGpusAreBounded) {
  // Two GPU agents of 2 GPUs and 4 cores each; carol may hold 2 GPUs, any number of jobs.
  // c1: 1 worker with 2 GPUs → admitted (carol: 2 GPUs). c2: 1 worker with 1 GPU → 3 > 2,
  // passed over, though GPUs are free.
  Scheduler s;
  s.enqueue("c1");
  s.enqueue("c2");
  const Needs needs{{"c1", {TaskNeed{1, 2, true, {}}}}, {"c2", {TaskNeed{1, 1, true, {}}}}};
  const std::vector<AgentSlots> agents{{"g1", 4, {0, 1}}, {"g2", 4, {0, 1}}};
  AdmitQuotas q;
  q.owner_of = [](const std::string&) { return std::string("carol"); };
  q.by_user["carol"] = Quota{0, 2, 0, 0, 0, 0};
  const auto a = s.admit(agents, agents, [&](const std::string& j) { return needs.at(j); }, {}, q);
  EXPECT_EQ(ids(a), std::vector<std::string>{"c1"});
  EXPECT_EQ(queued(s), std::vector<std::string>{"c2"});
}

TEST(SchedulerPriorities, AJobGoesAheadOfLowerPrioritiesAndBehindItsEquals) {
  // Arrivals: a (0), b (0), c (5), d (-1), e (5), f (0). Order: c, e (5, as they came),
  // a, b, f (0), d (-1).
  Scheduler s;
  s.enqueue("a");
  s.enqueue("b");
  s.enqueue("c", 5);
  s.enqueue("d", -1);
  s.enqueue("e", 5);
  s.enqueue("f", 0);
  EXPECT_EQ(queued(s), (std::vector<std::string>{"c", "e", "a", "b", "f", "d"}));
  EXPECT_EQ(s.position("a"), 3u);
  // Taken out and queued again (a restart's restore): its priority goes with it.
  EXPECT_TRUE(s.remove("c"));
  s.enqueue("c", 5);
  EXPECT_EQ(queued(s), (std::vector<std::string>{"e", "c", "a", "b", "f", "d"}));
  // Admission keeps the no-overtaking rule over this order: one 4-core agent, every job
  // 3 cores: e starts, c blocks the rest.
  Needs needs;
  for (const char* j : {"a", "b", "c", "d", "e", "f"}) needs[j] = cpu_tasks(3);
  const std::vector<AgentSlots> agent{{"x", 4}};
  EXPECT_EQ(ids(admit(s, agent, agent, needs)), std::vector<std::string>{"e"});
  EXPECT_EQ(queued(s).front(), "c");
}
