// The shared plan (docs/operations.md, "The shared plan"): how the leader divides the
// cluster's cores, and its GPUs, among the elastic jobs, queued and running, whenever a job
// arrives or ends or an agent comes or goes. Pure: no leader state, unit-tested alone
// (tests/unit/shared_plan_test.cpp); the leader applies its answer with resize() and by
// sizing queued jobs before admission (leader_scale.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::leader {

/// One elastic job as the plan sees it.
struct ShareJob {
  std::string id;
  std::string owner;
  int priority = 0;       ///< its owner's priority ([users.NAME] priority)
  int min_workers = 1;    ///< [elastic] bounds, 1 <= min <= max
  int max_workers = 1;
  int workers = 0;        ///< workers it runs with now; 0 = queued
  /// Work left, in seconds at one worker: the time one worker would need for the rest of
  /// the job (> 0). At w workers (within its [elastic] bounds) the plan expects
  /// remaining / speedup(w).
  double remaining = 0;
  /// What a resize costs this job, s (>= 0): a worker's start as measured, with margin;
  /// < 0 = not measured: SharePlanOptions::resize_cost_s.
  double resize_cost_s = -1;
  /// speedup[w − 1]: the job's rate (images/s) at w workers ÷ its rate at 1 worker, > 0,
  /// from the planner's epoch-time model of the job's model and data set or, in the
  /// trace-driven benchmark, the calibrated scale model (bench/sched). Empty: linear
  /// (speedup w). Past its end the last entry holds: no gain from more workers. The plan
  /// expects remaining / speedup(w) seconds at w workers.
  std::vector<double> speedup;
  /// Slots one worker takes, >= 1: its threads_per_task cores when the slots are cores,
  /// its gpus_per_worker when they are GPUs. Shares, the fair share and the free slots
  /// count slots; bounds and decisions count workers.
  int slots_per_worker = 1;
  /// Seconds left until the job's deadline ([job] deadline, counted from submission: a
  /// queued job's wait uses it up too), <= 0 when already past; none = no deadline.
  std::optional<double> deadline_left_s;
};

/// The speedup at `workers` of a curve as ShareJob::speedup holds it (speedup[w − 1]; the
/// last entry past its end; empty: linear, `workers`); workers < 1 counts as 1. Pure.
double speedup_at(const std::vector<double>& curve, int workers);

/// The plan's knobs.
struct SharePlanOptions {
  /// A resize costs about this much of a job's time (a new worker loads its data and
  /// model, a leaver finishes its step), for a job whose cost is not measured
  /// (ShareJob::resize_cost_s < 0): a slot goes to a job only when it saves the job more
  /// than this, so that the plan does not flap. Seconds, >= 0.
  double resize_cost_s = 30;
};

/// What the plan gives one job, and why.
struct ShareDecision {
  int workers = 0;     ///< 0: it waits (queued) — never below min_workers otherwise
  std::string reason;  ///< "admitted at min_workers", "gives 1 to job-5", "shortest remaining", ...
  /// Predicted seconds to its end at `workers` (remaining / speedup(workers)); 0 when it
  /// waits: the plan does not predict when it will start.
  double finish_s = 0;
  /// It has a deadline that the plan does not meet: it waits, or even its deadline floor
  /// (below) could not be reached or would not be enough.
  bool misses_deadline = false;
};

/// The plan for `jobs` (running and queued, in arrival order) on `slots` slots (the cores,
/// or the GPUs, that elastic jobs' workers may hold; a worker takes its job's
/// slots_per_worker of them), in six steps that change only what must change or gains
/// more than a resize costs (the hysteresis of the plan). Time left at w workers is
/// remaining / speedup(w). Slots the running jobs hold beyond `slots` after step 2 (the
/// leader takes a queued job's PS cores out of `slots`) are not freed by the later steps.
///  1. a running job keeps its workers (at least its min_workers); one with a deadline
///     keeps as its floor what it holds of the size its deadline needs (step 3);
///  2. queued jobs, by priority, then deadline (earliest first, any before none), then
///     arrival, are admitted at min_workers: with the free slots, or by shrinking running
///     jobs above their floor (the one with the most time left first); a job that does
///     not fit even so waits;
///  3. deadlines, earliest first (ElasticFlow's admission by deadline, ASPLOS'23, with
///     the job's own scaling curve): an admitted job whose deadline its workers miss
///     grows to the fewest workers that meet it (its floor, at most max_workers) with
///     free slots, then slots of jobs above their own floor (most time left first), if
///     they suffice (a partial grow would cost the others and still miss). A job no
///     size within its bounds can finish in time gets no floor and is reported in
///     misses_deadline. Steps 2, 4 and 6 never take a job below its floor;
///  4. fairness: a user whose jobs hold fewer slots than slots / users (the users with
///     admitted jobs) and want more takes them from users who stay at or above that
///     share, one worker at a time (its slots_per_worker; only where the gives free
///     enough to place it), from the job with the most time left above its floor — no user's jobs
///     are slower than with their fair share (Themis's finish-time fairness, NSDI'20,
///     with equal shares);
///  5. spare slots go, one worker at a time, to the job of highest priority, then shortest time
///     left (shortest-remaining-time first, which minimises the average completion
///     time of jobs that scale alike), while that saves it more than resize_cost_s;
///  6. then a worker moves from the job with the most time left (more than the taker's,
///     above its floor, and of a user that keeps its fair share without it, or of the
///     same user; its slots with the free ones hold the new worker) to the one with the
///     least that has such a donor (below its max) while the short one stays the shorter after the move,
///     gains more than resize_cost_s, and the worker adds at least as much to the short
///     job's speedup per slot as it took from the long one's (the cluster's throughput
///     never drops): shortest-remaining-time first among admitted jobs; then step 5
///     again, for slots a move between jobs of different slots_per_worker left free.
/// Returns a decision per job id. Pure.
std::map<std::string, ShareDecision> plan_shares(const std::vector<ShareJob>& jobs, int slots,
                                                 const SharePlanOptions& options = {});

}  // namespace dltrain::leader
