// The shared plan (leader/shared_plan.h) alone. Every expected allocation is worked out by
// hand from the four steps in the header; remaining work is in worker-seconds.
#include <gtest/gtest.h>

#include "leader/shared_plan.h"

using namespace dltrain::leader;

namespace {
ShareJob job(const std::string& id, const std::string& owner, int min, int max, int workers, double remaining,
             int priority = 0) {
  return ShareJob{id, owner, priority, min, max, workers, remaining};
}
}  // namespace

// 8 slots. A runs with 6 of [1, 6]; B arrives needing min 3: 2 are free, A gives 1 (A 5,
// B 3, no spare slot). Then shortest-remaining-time first: B has 600 / 3 = 200 s left, A
// 6000 / 5 = 1,200 s; one more worker saves B 50 s (> 30) and B at 4 (150 s) stays
// shorter than A at 4 (1,500 s): A 4, B 4 (B's max).
TEST(SharedPlan, AnArrivalShrinksTheRunningJobThenSpareSlotsGoToTheShortest) {
  const auto p = plan_shares({job("A", "u", 1, 6, 6, 6000), job("B", "u", 3, 4, 0, 600)}, 8);
  EXPECT_EQ(p.at("B").workers, 4);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("B").reason, "shortest time left: takes a worker from A");
}

// A job that does not fit even after every running job is at its min waits; nothing moves.
TEST(SharedPlan, AJobThatCannotFitWaitsAndNothingMoves) {
  const auto p = plan_shares({job("A", "u", 3, 4, 4, 6000), job("B", "u", 2, 4, 0, 600)}, 4);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("B").workers, 0);
  EXPECT_EQ(p.at("B").reason, "waits: 2 workers do not fit");
}

// Hysteresis: a running job keeps its size when the spare slot would save it less than a
// resize costs (1,200 worker-seconds at 4 workers: 300 s; at 5: 240 s; saves 60 s > 30 s
// gives it; with resize_cost_s = 100 it keeps 4).
TEST(SharedPlan, ASpareSlotGoesOnlyWhereItSavesMoreThanAResizeCosts) {
  EXPECT_EQ(plan_shares({job("A", "u", 1, 8, 4, 1200)}, 5).at("A").workers, 5);
  SharePlanOptions o;
  o.resize_cost_s = 100;
  const auto p = plan_shares({job("A", "u", 1, 8, 4, 1200)}, 5, o);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("A").reason, "keeps its workers");
}

// Fairness: 6 slots, alice's job holds all 6; bob's arrives at min 1 (alice gives 1);
// bob's share is 6 / 2 = 3, so alice gives 2 more: 3 and 3.
TEST(SharedPlan, AUserBelowTheFairShareTakesFromOneAboveIt) {
  const auto p = plan_shares({job("A", "alice", 1, 6, 6, 60000), job("B", "bob", 1, 6, 0, 60000)}, 6);
  EXPECT_EQ(p.at("A").workers, 3);
  EXPECT_EQ(p.at("B").workers, 3);
}

// Priorities: two queued jobs, one slot each at min; the higher priority is admitted
// first even though it arrived later.
TEST(SharedPlan, QueuedJobsAreAdmittedByPriorityThenArrival) {
  const auto p = plan_shares({job("A", "u", 1, 1, 0, 100), job("B", "v", 1, 1, 0, 100, 10)}, 1);
  EXPECT_EQ(p.at("B").workers, 1);
  EXPECT_EQ(p.at("A").workers, 0);
}

// A job's own measured resize cost replaces the default: 1,200 worker-seconds at 4 (300 s)
// vs 5 (240 s) saves 60 s: not worth it at a cost of 90 s, worth it at 2 s even with the
// default of 100.
TEST(SharedPlan, AJobsMeasuredResizeCostReplacesTheDefault) {
  SharePlanOptions o;
  o.resize_cost_s = 100;
  auto a = job("A", "u", 1, 8, 4, 1200);
  a.resize_cost_s = 2;
  EXPECT_EQ(plan_shares({a}, 5, o).at("A").workers, 5);
  a.resize_cost_s = 90;
  EXPECT_EQ(plan_shares({a}, 5, {}).at("A").workers, 4);
}

// Shortest remaining time first within fairness: 8 slots, alice's A (10,000 worker-s) has
// 5, bob's B (300) 1 and D (8,000) 2. Shares are 4 each: bob takes one from alice (A 4,
// B 2). Then B, the shortest, takes a worker from bob's own D (B at 3 has 100 s left,
// saving 50 s; D at 1 still has the most), not from A: alice would fall below her share.
TEST(SharedPlan, TheShortestJobTakesWorkersOnlyWhereTheGiverKeepsItsShare) {
  const auto p = plan_shares(
      {job("A", "alice", 1, 8, 5, 10000), job("B", "bob", 1, 3, 1, 300), job("D", "bob", 1, 8, 2, 8000)}, 8);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("B").workers, 3);
  EXPECT_EQ(p.at("D").workers, 1);
  EXPECT_EQ(p.at("B").reason, "shortest time left: takes a worker from D");
}
