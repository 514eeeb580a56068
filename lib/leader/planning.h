// The leader's adapter to the planner (private to lib/leader/; the second method,
// docs/planner.md): what the policy (planner/policy.h) is asked for a job on this
// cluster (its live agents, the stored history and the previous plan), whether a job's
// PS shard fits any agent's memory, and the history rows a job leaves behind. The leader
// applies its answers (queue, explore, fail); a cluster-wide planner replaces this part.
// Not thread-safe: the leader's io thread owns it.
#pragma once

#include <optional>
#include <string>

#include "config/options.h"
#include "job/job_spec.h"
#include "leader/job_record.h"
#include "leader/placement.h"
#include "planner/planner.h"
#include "store/store.h"
#include "wire/task_events.h"

namespace dltrain::leader {

/// The planner as the leader uses it.
class Planning {
 public:
  /// `agents` and `opt` are the leader's and must outlive this; no store until use_store.
  Planning(const AgentRegistry& agents, const config::AgentOptions& opt) : agents_(agents), opt_(opt) {}
  /// The store whose history and previous plans the planner reads and whose history it
  /// adds to (null: none; the planner then plans from its priors).
  void use_store(store::Store* db) { db_ = db; }

  /// The planner's plan for `spec` on the live agents (task slots by cores, and by GPUs
  /// for a cuda job) given the history of its model and data set and the plan it chose
  /// last for such a job; `exploration_seconds` already spent exploring it. A previous
  /// plan that cannot be decoded is ignored (logged).
  planner::Plan plan_for(const JobSpec& spec, double exploration_seconds) const;
  /// The job's speedup at 1..max_workers workers (its images/s at w ÷ at 1) from the
  /// planner's epoch-time model (planner::Predictors::time) of its model, data set, batch
  /// size and method, for the shared plan (ShareJob::speedup): the model's curve between
  /// the fewest and the most workers measured, linear in workers outside them (at the
  /// per-worker rate of the nearer end). Empty — the plan then assumes linear scaling —
  /// without a store, with fewer than two distinct worker counts measured, or without a
  /// prediction. Reads the store; not cached.
  std::vector<double> speedup(const JobSpec& spec, int max_workers) const;
  /// For a job with a target_accuracy: the most workers, at most max_workers, whose global
  /// batch (workers × batch_size) the planner's accuracy model predicts to reach the
  /// target, less its safety margin (margin_sigmas × the fit's RMS residual), within the
  /// global batches the history measured (beyond them the model only bounds accuracy from
  /// above, and the planner does not count on it). Nullopt — no cap — without a target, a
  /// store or the model's data, or when no worker count reaches the target (the plan
  /// cannot help it then). Reads the store; not cached.
  std::optional<int> accuracy_cap(const JobSpec& spec, int max_workers) const;
  /// Both, from one read of the store and one fit of the models (what the shared plan asks).
  struct ShareModels {
    std::vector<double> speedup;      ///< speedup(): empty = linear
    std::optional<int> accuracy_cap;  ///< accuracy_cap(): none = no cap
  };
  ShareModels share_models(const JobSpec& spec, int max_workers) const;
  /// Why `spec` cannot run here because its largest PS shard's parameter state
  /// (planner/ps_memory.h: parameters, momentum, one x_seen per sparse-downlink worker)
  /// exceeds the memory_mb of every live agent; nullopt when it fits, no agent is live
  /// (nothing to compare with yet) or the model is TorchScript (its size is unknown here).
  std::optional<std::string> ps_memory_problem(const JobSpec& spec) const;
  /// Stores `choice` as the plan of jobs like `spec` (the hint against flapping).
  void remember(const JobSpec& spec, const planner::Config& choice);
  /// The history row of epoch `ev` of `j` (not of an exploration run).
  void record_epoch(JobRec& j, const wire::events::EpochEnd& ev);
  /// The history row of finished `j` (its whole run, or an exploration run's speed);
  /// none for a resumed job.
  void record_final(const JobRec& j);

 private:
  /// The planner's request for `spec` on the live agents, with `history` (plan_for's).
  planner::PlanRequest request_for(const JobSpec& spec, double exploration_seconds,
                                   const std::vector<store::Observation>& history) const;
  const AgentRegistry& agents_;
  const config::AgentOptions& opt_;
  store::Store* db_ = nullptr;
};

}  // namespace dltrain::leader
