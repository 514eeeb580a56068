// The leader's Prometheus metrics (private to lib/leader/; docs/operations.md, "Metrics"
// lists them), built at scrape time from its parts, read-only: the job table, the agent
// registry, the queue's length and the leader's own counters. Unit-tested in
// tests/unit/leader_metrics_test.cpp. Not thread-safe: called on the leader's io thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "control/metrics_server.h"
#include "leader/job_table.h"
#include "leader/placement.h"

namespace dltrain::leader {

/// Cumulative counts since this leader process started, for its metrics.
struct LeaderCounters {
  std::uint64_t plans = 0;             ///< planner decisions for automatic jobs
  std::uint64_t infeasible_plans = 0;  ///< of which no configuration met the constraints
  std::uint64_t exploration_runs = 0;  ///< exploration (profile) jobs started
  std::map<std::string, std::uint64_t> requests;  ///< control messages by peer kind ("agent", "client")
  std::map<std::pair<std::string, std::string>, std::uint64_t> errors;  ///< (peer kind, code) → error replies
};

/// Per-job gauges are exposed for every job not ended yet and this many of the latest
/// ended ones: a leader's history grows without bound, its metrics must not.
inline constexpr std::size_t kEndedJobsExposed = 20;

/// Adds the dltrain_leader_* families (jobs by state, every state present; the queue's
/// length `queue_length`; agents by state; cores offered and free; planner decisions;
/// control requests and errors) and the dltrain_job_* families of the jobs exposed.
void add_leader_metrics(control::MetricsBuilder& out, const JobTable& jobs, const AgentRegistry& agents,
                        std::size_t queue_length, const LeaderCounters& counters);

}  // namespace dltrain::leader
