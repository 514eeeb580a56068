// The leader's scheduler: the queue of jobs waiting for cores and GPUs, and admission
// over plain counts (placement.h), without records, sockets or a store, so that its rule
// is unit-tested alone (tests/unit/scheduler_test.cpp). The leader owns one and launches
// what it admits (leader.cpp).
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "leader/placement.h"

namespace dltrain::leader {

/// A job admission let start, with where its tasks go (one Placed per need, in order).
struct Admitted {
  std::string job;
  std::vector<Placed> placement;
  /// ps_shards = "auto": the agents of the PS shards spread_shards added beside the
  /// workers, after the placement's shards (their cores taken like the placement's).
  std::vector<std::string> added_shards;
};

/// What spread_shards needs of a queued job with ps_shards = "auto": its shards in
/// job_needs (the first tasks), the cores one takes, and the most the job may have.
struct ShardSpread {
  int shards = 1;
  int shard_cores = 1;
  int max_shards = 1;
};

/// One user's quotas (config::UserOptions; 0 = no bound) and what that user's running
/// jobs hold now: the cores and GPUs of their tasks, and how many jobs run.
struct Quota {
  int max_cores = 0, max_gpus = 0, max_jobs = 0;
  int cores = 0, gpus = 0, jobs = 0;
  /// Would one more job needing `more` (totals()) stay within bounds?
  bool allows(const NeedTotals& more) const {
    return (max_cores == 0 || cores + more.cores <= max_cores) && (max_gpus == 0 || gpus + more.gpus <= max_gpus) &&
           (max_jobs == 0 || jobs + 1 <= max_jobs);
  }
};

/// The quota rule of an admission pass: each queued job's owner, and each user's Quota
/// (users without an entry have no bounds).
struct AdmitQuotas {
  std::function<std::string(const std::string&)> owner_of;
  std::map<std::string, Quota> by_user;
};

/// The queue (job ids, first come first served) and its admission rule: in queue order,
/// a job that could not run even on an idle cluster (`fits` on the idle agents) is
/// passed over without blocking the others (agents may still join); the first job that
/// fits the idle cluster but not what is free now blocks every job behind it (no
/// overtaking, so a large job is not starved by small ones). A job its owner's quota does
/// not allow now (AdmitQuotas) is passed over too, and so are its owner's later jobs
/// (no overtaking within a quota): they wait for the owner's own jobs to end, and a
/// user's jobs never hold up another user's. Not
/// thread-safe: the leader's io thread only.
class Scheduler {
 public:
  /// Puts `job` behind every queued job of `priority` or higher and ahead of those of
  /// lower priority (first come, first served within a priority; the owner's, from
  /// [users.NAME] priority). A job already queued is not queued twice.
  void enqueue(const std::string& job, int priority = 0);
  /// Takes `job` out of the queue (a cancel, a queue timeout); false when it was not in it.
  bool remove(const std::string& job);
  /// `job`'s place, 1 for the first; 0 when it is not queued.
  std::size_t position(const std::string& job) const;
  std::size_t size() const { return queue_.size(); }
  /// The queued jobs, first first.
  const std::deque<std::string>& jobs() const { return queue_; }

  /// One admission pass: `idle` is every live agent as if idle (total cores, every GPU
  /// index: AgentRegistry::capacities), `free` what each has free now (slots);
  /// `needs_of(job)` a queued job's task needs (job_needs). Returns the jobs that start,
  /// in queue order, each taken out of the queue, its placement taken from `free` before
  /// the next job is considered. `spread_of(job)`, where given, says whether a job's PS
  /// shards spread (ps_shards = "auto": a ShardSpread) or not (nullopt). Only a job
  /// with none queued behind it spreads (spare cores go to the jobs waiting first); the
  /// shards it adds are taken from `free` too. `quotas`, where given, passes over the jobs
  /// their owners' quotas do not allow; a job admitted adds its cores (spread shards
  /// included), GPUs and one job to its owner's counts before the next is considered.
  std::vector<Admitted> admit(const std::vector<AgentSlots>& idle, std::vector<AgentSlots> free,
                              const std::function<std::vector<TaskNeed>(const std::string&)>& needs_of,
                              const std::function<std::optional<ShardSpread>(const std::string&)>& spread_of = {},
                              AdmitQuotas quotas = {});

 private:
  std::deque<std::string> queue_;
  std::map<std::string, int> priority_;  ///< of each queued job
};

}  // namespace dltrain::leader
