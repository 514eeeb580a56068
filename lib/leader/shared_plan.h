// The shared plan (docs/operations.md, "The shared plan"): how the leader divides the
// cluster's worker slots among the elastic jobs, queued and running, whenever a job
// arrives or ends or an agent comes or goes. Pure: no leader state, unit-tested alone
// (tests/unit/shared_plan_test.cpp); the leader applies its answer with resize() and by
// sizing queued jobs before admission (leader_scale.cpp).
#pragma once

#include <map>
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
  /// Work left, in worker-seconds: the time one worker would need for the rest of the job
  /// (> 0). At w workers the plan expects remaining / w (the job's [elastic] bounds are
  /// where it scales).
  double remaining = 0;
  /// What a resize costs this job, s (>= 0): a worker's start as measured, with margin;
  /// < 0 = not measured: SharePlanOptions::resize_cost_s.
  double resize_cost_s = -1;
};

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
};

/// The plan for `jobs` (running and queued, in arrival order) on `slots` worker slots
/// (the cores, in threads_per_task units, that elastic jobs' workers may hold), in five
/// steps that change only what must change or gains more than a resize costs (the
/// hysteresis of the plan):
///  1. a running job keeps its workers (at least its min_workers);
///  2. queued jobs, by priority then arrival, are admitted at min_workers: with the free
///     slots, or by shrinking running jobs above their min (the one with the most work
///     left first); a job that does not fit even so waits;
///  3. fairness: a user whose jobs hold fewer slots than slots / users (the users with
///     admitted jobs) and want more takes them from users above that share, one slot
///     at a time, from the job with the most work left above its min — no user's jobs
///     are slower than with their fair share (Themis's finish-time fairness, NSDI'20,
///     with equal shares);
///  4. spare slots go, one at a time, to the job of highest priority, then shortest time
///     left (remaining / workers: shortest-remaining-time first, which minimises the
///     average completion time of jobs that scale linearly), while that saves it more
///     than resize_cost_s;
///  5. then a worker moves from the job with the most time left (above its min, and of a
///     user that keeps its fair share without it, or of the same user) to the one with
///     the least (below its max) while the short one stays the shorter after the move and
///     gains more than resize_cost_s: shortest-remaining-time first among admitted jobs.
/// Returns a decision per job id. Pure.
std::map<std::string, ShareDecision> plan_shares(const std::vector<ShareJob>& jobs, int slots,
                                                 const SharePlanOptions& options = {});

}  // namespace dltrain::leader
