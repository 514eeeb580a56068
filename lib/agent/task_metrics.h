// What an agent exposes on its metrics endpoint about itself and its tasks, built from
// the events its tasks print (wire/task_events.h). docs/operations.md ("Metrics") lists
// every family with its type, unit and labels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "control/metrics_server.h"
#include "wire/control_bodies.h"
#include "wire/task_event.h"
#include "wire/task_events.h"
#include "wire/task_kind.h"

namespace dltrain::agent {

/// The latest values one task incarnation reported. Counters are the task's own
/// cumulative counts since its process started, so a restarted task starts again at 0:
/// the reset Prometheus expects (rate() and increase() treat a drop as one), made
/// explicit by dltrain_task_start_time_seconds. Not thread-safe (the agent's io thread).
struct TaskMetrics {
  std::string job;            ///< "job-3"
  std::string task;           ///< "worker-1", "ps-0"
  wire::TaskKind role = wire::TaskKind::kWorker;  ///< the label "role": "worker" | "ps"
  int threads = 1;            ///< cores the leader assigned to it
  double start_unix = 0;      ///< Unix time (s) this incarnation started
  int restarts = 0;           ///< restarts by its agent so far
  bool running = true;        ///< false once it exited for good
  double ended_unix = 0;      ///< Unix time (s) it exited for good; 0 while running

  // worker: the latest progress / epoch_end / done values
  wire::events::StepCounters counters;   ///< cumulative, this process
  std::uint64_t bytes_pushed = 0, bytes_pulled = 0;  ///< cumulative, this process
  std::int64_t skipped_steps = 0;        ///< cumulative, this process
  std::optional<double> loss, lr, images_per_sec, compression_ratio, density;
  int epoch = 0;                         ///< epoch in progress (1-based), or the last finished
  std::optional<double> test_accuracy;   ///< rank 0: of the last finished epoch

  // PS shard: the latest ps_stats (and the final stopped) values
  std::optional<wire::events::PsStats> ps;

  /// Takes the values of one event of this task (parse_task_event's); the kinds that
  /// carry no figure are ignored.
  void on_event(const wire::events::TaskEvent& ev);
  /// The task was started again at `now_unix` (Unix time, s): every counter restarts at 0.
  void restarted(double now_unix);
  /// Adds this task's samples to `out` with labels agent, job, task, role; the PS
  /// checkpoint age is measured against `now_unix`.
  void add_to(control::MetricsBuilder& out, const std::string& agent, double now_unix) const;
};

/// An agent's own figures for its metrics endpoint.
struct AgentFigures {
  std::string agent;             ///< its name
  int cores = 0;                 ///< cores it offers to tasks
  int cores_used = 0;            ///< cores held by its running tasks (their assigned threads)
  std::int64_t memory_mb = 0;    ///< memory it offers, MiB
  std::vector<wire::GpuInfo> gpus;  ///< GPUs it offers
  int gpus_used = 0;             ///< GPUs held by its running tasks (their CUDA_VISIBLE_DEVICES)
  int workers_running = 0, ps_running = 0;  ///< running task processes by role
  std::uint64_t task_restarts = 0;  ///< restarts of dead tasks since the agent started
  bool leader_connected = false; ///< registered with the leader now
  std::int64_t leader_term = 0;  ///< the newest leader term registered under (HA; 0: a single leader)
  std::uint64_t stale_refused = 0;  ///< registrations and orders refused for an older leader term
};

/// Adds the agent families (dltrain_agent_*) to `out`.
void add_agent_metrics(control::MetricsBuilder& out, const AgentFigures& a);

/// Unix time now, in seconds.
double unix_seconds_now();

}  // namespace dltrain::agent
