// The leader's events about a job (docs/protocol.md, "Events to followers"): its state,
// its plan, where its shards and data went, its recovery and resizes, why it waits. The
// leader sends them to the job's followers and keeps them in its event log; the tasks'
// own events, the job's failure and summary are wire/task_events.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "wire/task_events.h"

namespace dltrain::wire::events {


/// The job entered `state`.
struct StateChanged : Fields<StateChanged> {
  static constexpr const char* kKind = "state";
  std::string state;                 ///< the new state (queued, starting, running, ...)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("state", s.state);
  }
};

/// What the leader chose for a job with ps_shards = "auto" or [ps] partition_size =
/// "auto" when it first started: where its PS shards went (the one it needs, and one
/// beside the workers on every other machine with room for it: leader/placement.h,
/// spread_shards) and the partition size that gives them even shares
/// (planner::balanced_partition_size).
struct ShardsSpread : Fields<ShardsSpread> {
  static constexpr const char* kKind = "ps_shards";
  int ps_shards = 1;                 ///< the job's PS shards from now on, [1, 256]
  std::vector<std::string> agents;   ///< the agent of shard i (ps-i)
  /// The job's [ps] partition_size from now on, in floats, when the leader chose it
  /// (partition_size = "auto"); absent when the job file gave it.
  std::optional<std::int64_t> partition_size;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("ps_shards", s.ps_shards), v("agents", s.agents), v("partition_size", s.partition_size);
  }
};

/// Where a sharded data set's workers went, and how much of the data set each one's agent
/// had cached then (the leader places them where the shards are: placement.h, TaskNeed).
struct DataPlaced : Fields<DataPlaced> {
  static constexpr const char* kKind = "data_placed";
  std::vector<std::string> agents;      ///< the agent of worker i
  std::vector<double> cached_fraction;  ///< of the training shards' bytes, [0, 1], per worker
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("agents", s.agents), v("cached_fraction", s.cached_fraction);
  }
};

/// The planner's decision for an automatic job (planner::to_json of its Plan).
struct PlanDecided : Fields<PlanDecided> {
  static constexpr const char* kKind = "plan";
  nlohmann::json plan;               ///< planner::to_json(Plan)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("plan", s.plan);
  }
};

/// Tasks were lost: the job stops its other tasks to be re-assigned.
struct Recovering : Fields<Recovering> {
  static constexpr const char* kKind = "recovering";
  std::string reason;                ///< why its tasks were lost
  std::uint32_t generation = 0;      ///< the generation being stopped
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("reason", s.reason), v("generation", s.generation);
  }
};

/// An elastic job's workers changed in number (docs/training.md, "Elastic jobs"): new
/// workers were started, or the highest ranks were asked to leave after their step.
struct Resized : Fields<Resized> {
  static constexpr const char* kKind = "resized";
  int from = 0;                      ///< workers before
  int to = 0;                        ///< workers asked for
  std::string by;                    ///< who asked: "user NAME", or why ("agent A was lost")
  std::vector<std::string> started;  ///< the workers started, "worker-2 on agent-1"
  std::vector<std::string> leaving;  ///< the workers asked to leave
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("from", s.from), v("to", s.to), v("by", s.by), v("started", s.started), v("leaving", s.leaving);
  }
};

/// A queued job waits for cores: sent to its followers when it is queued (or followed)
/// and whenever what it waits for changes.
struct Waiting : Fields<Waiting> {
  static constexpr const char* kKind = "waiting";
  std::int64_t position = 0;         ///< 1-based place in the queue
  int cores_needed = 0;              ///< (workers + PS shards) × threads_per_task
  int cores_free = 0;                ///< on the live agents now
  int cores_total = 0;               ///< of the live agents, busy or not
  bool fits_cluster = false;         ///< it fits the live agents when they are idle
  std::optional<double> queue_timeout_seconds;  ///< it fails after waiting this long
  std::optional<int> gpus_needed;    ///< a cuda job: workers × gpus_per_worker
  std::optional<int> gpus_free;      ///< a cuda job: free GPUs on the live agents now
  std::optional<int> gpus_total;     ///< a cuda job: GPUs of the live agents
  /// Why it waits for its owner's other jobs (their quota: docs/operations.md, "Users").
  std::optional<std::string> quota;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("position", s.position), v("cores_needed", s.cores_needed), v("cores_free", s.cores_free),
        v("cores_total", s.cores_total), v("fits_cluster", s.fits_cluster),
        v("queue_timeout_seconds", s.queue_timeout_seconds), v("gpus_needed", s.gpus_needed),
        v("gpus_free", s.gpus_free), v("gpus_total", s.gpus_total), v("quota", s.quota);
  }
};

/// A re-assignment waits for free cores.
struct WaitingForAgent : Fields<WaitingForAgent> {
  static constexpr const char* kKind = "waiting_for_agent";
  std::vector<std::string> tasks;    ///< the tasks without a place
  std::int64_t timeout_ms = 0;       ///< reassign_timeout
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("tasks", s.tasks), v("timeout_ms", s.timeout_ms);
  }
};

/// A task that changed agent in a re-assignment.
struct Move : Fields<Move> {
  std::string task, from, to;        ///< task name; agent it left; agent it goes to
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("task", s.task), v("from", s.from), v("to", s.to);
  }
};

/// The job was re-assigned as a new generation.
struct Reassigned : Fields<Reassigned> {
  static constexpr const char* kKind = "reassigned";
  std::uint32_t generation = 0;      ///< the new generation
  std::vector<Move> moved;           ///< tasks that changed agent
  std::string reason;                ///< why it was re-assigned
  /// The worker whose replica rebuilds the shards that lost their state.
  std::optional<std::string> replica_from;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("generation", s.generation), v("moved", s.moved), v("reason", s.reason), v("replica_from", s.replica_from);
  }
};

/// A restarted PS shard listens again.
struct PsRecovered : Fields<PsRecovered> {
  static constexpr const char* kKind = "ps_recovered";
  std::string task;
  std::string endpoint;              ///< HOST:PORT
  std::string recovery;              ///< how it recovered its state, in words
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("task", s.task), v("endpoint", s.endpoint), v("recovery", s.recovery);
  }
};

/// A restarted leader resumed the job (kept in the job's stored event log).
struct LeaderRestarted : Fields<LeaderRestarted> {
  static constexpr const char* kKind = "leader_restarted";
  std::string state;                 ///< the state it was in
  std::uint32_t generation = 0;      ///< its generation (unchanged)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("state", s.state), v("generation", s.generation);
  }
};

}  // namespace dltrain::wire::events
