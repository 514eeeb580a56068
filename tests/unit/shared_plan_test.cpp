// The shared plan (leader/shared_plan.h) alone. Every expected allocation is worked out by
// hand from the six steps in the header; remaining work is in worker-seconds.
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

// A scaling curve instead of linear scaling: 1,200 worker-seconds, speedup 1, 1.9, 2.0,
// 2.02 at 1…4 workers. Spare slots: 1 → 2 saves 1,200 − 631.6 = 568.4 s, 2 → 3 saves
// 631.6 − 600 = 31.6 s (> 30), 3 → 4 saves 600 − 594.1 = 5.9 s (< 30): 3 workers, one
// slot left idle, 600 s predicted. Linear, the same job takes all 4 (300 s).
TEST(SharedPlan, AScalingCurveStopsTheGrowWhereAWorkerNoLongerPays) {
  auto a = job("A", "u", 1, 4, 1, 1200);
  a.speedup = {1, 1.9, 2.0, 2.02};
  const auto p = plan_shares({a}, 4);
  EXPECT_EQ(p.at("A").workers, 3);
  EXPECT_NEAR(p.at("A").finish_s, 600, 1e-9);
  EXPECT_FALSE(p.at("A").misses_deadline);
  const auto linear = plan_shares({job("A", "u", 1, 4, 1, 1200)}, 4);
  EXPECT_EQ(linear.at("A").workers, 4);
  EXPECT_NEAR(linear.at("A").finish_s, 300, 1e-9);
}

// Step 6 keeps the cluster's throughput: A (3,000 worker-s, linear) runs 3, B (900) runs
// 1, 4 slots. B is the shorter (900 s against 1,000 s). Linear, B takes a worker (B at 2:
// 450 s < A at 2: 1,500 s; saves 450 s; adds 1 = takes 1), then another (B at 3: 300 s <
// A at 1: 3,000 s; adds 1 = takes 1): A 1, B 3. With B's speedup 1, 1.1, 1.2, 1.3 the
// worker would add 0.1 where it takes 1: nothing moves.
TEST(SharedPlan, AWorkerMovesToTheShorterJobOnlyIfItDoesAsMuchThere) {
  const auto linear = plan_shares({job("A", "u", 1, 4, 3, 3000), job("B", "u", 1, 4, 1, 900)}, 4);
  EXPECT_EQ(linear.at("A").workers, 1);
  EXPECT_EQ(linear.at("B").workers, 3);
  auto b = job("B", "u", 1, 4, 1, 900);
  b.speedup = {1, 1.1, 1.2, 1.3};
  const auto p = plan_shares({job("A", "u", 1, 4, 3, 3000), b}, 4);
  EXPECT_EQ(p.at("A").workers, 3);
  EXPECT_EQ(p.at("B").workers, 1);
}

// A deadline sets a floor: 4 slots, A runs 4 of [1, 4] with 8,000 worker-s; B arrives
// with 1,200 and 500 s to its deadline. Admitted at 1 (A gives 1: A 3); B needs 3 workers
// (1,200 / 3 = 400 s <= 500; 2 give 600 s): A gives 2 more. Step 6 cannot take B below 3,
// and A has no slot above its min: A 1, B 3, B's deadline met with 400 s predicted.
TEST(SharedPlan, ADeadlineGrowsItsJobToTheFewestWorkersThatMeetIt) {
  auto b = job("B", "u", 1, 4, 0, 1200);
  b.deadline_left_s = 500;
  const auto p = plan_shares({job("A", "u", 1, 4, 4, 8000), b}, 4);
  EXPECT_EQ(p.at("A").workers, 1);
  EXPECT_EQ(p.at("B").workers, 3);
  EXPECT_EQ(p.at("B").reason, "its deadline needs 3 workers");
  EXPECT_NEAR(p.at("B").finish_s, 400, 1e-9);
  EXPECT_FALSE(p.at("B").misses_deadline);
  EXPECT_FALSE(p.at("A").misses_deadline);  // no deadline: never missed
}

// A deadline no size within the bounds meets (200 s would need 6 of at most 4 workers)
// gets no floor and is reported: the plan treats the job as any other (admitted at 1,
// then shortest-remaining-time first moves A's workers to it: B 3, A 1; 400 s > 200 s).
TEST(SharedPlan, ADeadlineNoSizeMeetsIsReportedAsMissed) {
  auto b = job("B", "u", 1, 4, 0, 1200);
  b.deadline_left_s = 200;
  const auto p = plan_shares({job("A", "u", 1, 4, 4, 8000), b}, 4);
  EXPECT_EQ(p.at("B").workers, 3);
  EXPECT_EQ(p.at("A").workers, 1);
  EXPECT_TRUE(p.at("B").misses_deadline);
  EXPECT_NEAR(p.at("B").finish_s, 400, 1e-9);
  // A queued job with a deadline that does not even fit waits, and misses it.
  auto c = job("C", "u", 2, 4, 0, 100);
  c.deadline_left_s = 1000;
  const auto q = plan_shares({job("A", "u", 4, 4, 4, 8000), c}, 4);
  EXPECT_EQ(q.at("C").workers, 0);
  EXPECT_TRUE(q.at("C").misses_deadline);
  EXPECT_EQ(q.at("C").finish_s, 0);
}

// A deadline's floor ranks above the fair share: alice's D (1,200 worker-s, 400 s to its
// deadline) runs 1, bob's E (30,000) runs 3, 4 slots. D needs 3 (400 s): E gives 2. Bob
// then holds 1 < 4 / 2, but alice's only job is at its floor: nothing goes back.
TEST(SharedPlan, ADeadlineFloorIsNotTakenForTheFairShare) {
  auto d = job("D", "alice", 1, 4, 1, 1200);
  d.deadline_left_s = 400;
  const auto p = plan_shares({d, job("E", "bob", 1, 4, 3, 30000)}, 4);
  EXPECT_EQ(p.at("D").workers, 3);
  EXPECT_EQ(p.at("E").workers, 1);
  EXPECT_FALSE(p.at("D").misses_deadline);
}

// Queued jobs of equal priority with deadlines go before those without, earliest first:
// one slot, three queued jobs of min 1 (X none, Y 5,000 s, Z 3,000 s left): Z is admitted.
TEST(SharedPlan, QueuedJobsWithEarlierDeadlinesAreAdmittedFirst) {
  auto y = job("Y", "u", 1, 1, 0, 100);
  y.deadline_left_s = 5000;
  auto z = job("Z", "u", 1, 1, 0, 100);
  z.deadline_left_s = 3000;
  const auto p = plan_shares({job("X", "u", 1, 1, 0, 100), y, z}, 1);
  EXPECT_EQ(p.at("Z").workers, 1);
  EXPECT_EQ(p.at("X").workers, 0);
  EXPECT_EQ(p.at("Y").workers, 0);
}

// An admission does not break a running job's deadline: 4 slots, R runs 4 of [1, 4] with
// 1,200 worker-s and 400 s to its deadline (it needs 3: 400 s; 2 give 600 s); Q arrives
// needing 2. R can give only 1 without missing: Q waits, R keeps 4 (300 s).
TEST(SharedPlan, AnArrivalWaitsRatherThanBreakARunningJobsDeadline) {
  auto r = job("R", "u", 1, 4, 4, 1200);
  r.deadline_left_s = 400;
  const auto p = plan_shares({r, job("Q", "v", 2, 4, 0, 600)}, 4);
  EXPECT_EQ(p.at("R").workers, 4);
  EXPECT_FALSE(p.at("R").misses_deadline);
  EXPECT_EQ(p.at("Q").workers, 0);
  EXPECT_EQ(p.at("Q").reason, "waits: 2 workers do not fit");
}

// Shares count slots: 8 slots; alice's A runs 4 workers of 2 slots each (8 slots, [1, 4],
// 8,000 worker-s); bob's B (1 slot a worker, [1, 4], 400) arrives. A gives 1 worker (2
// slots) for B's admission (A 3 = 6 slots, B 1, 1 slot free). Fair share 8 / 2 = 4 slots:
// B takes the free slot (B 2), then A gives another worker (alice 6 − 2 = 4, still her
// share) and B takes 2 more (B 4: its max). A 2 workers (4 slots), B 4 (4 slots).
TEST(SharedPlan, FairSharesCountSlotsNotWorkers) {
  auto a = job("A", "alice", 1, 4, 4, 8000);
  a.slots_per_worker = 2;
  const auto p = plan_shares({a, job("B", "bob", 1, 4, 0, 400)}, 8);
  EXPECT_EQ(p.at("A").workers, 2);
  EXPECT_EQ(p.at("B").workers, 4);
}

// A move between jobs of different sizes: 5 slots; A runs 2 workers of 2 slots ([1, 2],
// 2,000 worker-s: 1,000 s left); B (1 slot, [1, 3], 300) arrives and takes the free slot.
// B is the shorter (300 s): a worker of A (2 slots, 0.5 of its rate per slot) moves to B
// (1 per slot; B at 2: 150 s < A at 1: 2,000 s; saves 150 s), freeing 1 slot more, which
// the spare-slot pass then gives to B as well (150 → 100 s saves 50 s > 30): A 1, B 3.
TEST(SharedPlan, AMoveBetweenJobsOfDifferentSlotSizesUsesTheSlotsItFrees) {
  auto a = job("A", "u", 1, 2, 2, 2000);
  a.slots_per_worker = 2;
  const auto p = plan_shares({a, job("B", "u", 1, 3, 0, 300)}, 5);
  EXPECT_EQ(p.at("A").workers, 1);
  EXPECT_EQ(p.at("B").workers, 3);
  EXPECT_NEAR(p.at("B").finish_s, 100, 1e-9);
}

namespace {
ShareJob sized(ShareJob j, int slots_per_worker) {
  j.slots_per_worker = slots_per_worker;
  return j;
}
}  // namespace

// Step 4 gives nothing it cannot use: 9 slots, alice's A runs 6 of 1 slot ([1, 8], 600
// worker-s), bob's B 1 of 3 slots ([1, 3], 30,000). Share 9 / 2 = 4: bob (3) is below,
// but alice can give only 2 slots and stay at 4, and B's next worker needs 3: nothing
// moves (no idle slots), and no later step moves anything either (A, the shorter, has
// no donor with more time left; B's only donor would be A, which has less).
TEST(SharedPlan, AFairShareGiveThatCannotPlaceTheWorkerIsNotMade) {
  const auto p = plan_shares({job("A", "alice", 1, 8, 6, 600), sized(job("B", "bob", 1, 3, 1, 30000), 3)}, 9);
  EXPECT_EQ(p.at("A").workers, 6);
  EXPECT_EQ(p.at("A").reason, "keeps its workers");
  EXPECT_EQ(p.at("B").workers, 1);
}

// Slots held beyond those planned (the cores of a queued job's PS shards taken out) are
// not the later steps' to free: 6 slots planned (8 cores less Q's 2 PS cores), alice's A
// runs 6 ([1, 8]), bob's B 2 ([1, 4]), carol's Q needs 6 and waits. Fair share over the 8
// held: 4 each, worker for worker: A 4, B 4.
TEST(SharedPlan, SlotsHeldBeyondThePlannedOnesAreTradedWorkerForWorker) {
  const auto p = plan_shares({job("A", "alice", 1, 8, 6, 60000), job("B", "bob", 1, 4, 2, 20000),
                              job("Q", "carol", 6, 8, 0, 100)},
                             6);
  EXPECT_EQ(p.at("Q").workers, 0);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("B").workers, 4);
}

// Step 6 goes on past a shortest job no donor fits: 8 slots, all held; S (4 slots a
// worker, [1, 2], 100 s left) is the shortest but no donor frees 4 slots; B (1 slot,
// [1, 4], 300 worker-s: 150 s) takes a worker from A (1 slot, 10,000 worker-s: 5,000 s):
// B at 3 has 100 s, saves 50 s. Then nothing has a donor with more time left: S 1, B 3, A 1.
TEST(SharedPlan, AShortJobNoDonorFitsDoesNotStopTheMovesOfOthers) {
  const auto p = plan_shares({sized(job("S", "u", 1, 2, 1, 100), 4), job("B", "u", 1, 4, 2, 300),
                              job("A", "u", 1, 4, 2, 10000)},
                             8);
  EXPECT_EQ(p.at("S").workers, 1);
  EXPECT_EQ(p.at("B").workers, 3);
  EXPECT_EQ(p.at("A").workers, 1);
}

// A worker moves only from a job with more time left than the taker's, so the plan does
// not flap: 6 slots, A runs its max 4 (4,000 worker-s: 1,000 s), B 2 of [1, 3] (3,000:
// 1,500 s). B is the only taker, and A has less time left: nothing moves, now or when
// planned again.
TEST(SharedPlan, NoWorkerMovesFromAJobWithLessTimeLeft) {
  const auto p = plan_shares({job("A", "u", 1, 4, 4, 4000), job("B", "u", 1, 3, 2, 3000)}, 6);
  EXPECT_EQ(p.at("A").workers, 4);
  EXPECT_EQ(p.at("B").workers, 2);
}
