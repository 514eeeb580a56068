// An agent's link to the leader: registration, heartbeats, task start/stop, progress
// forwarding, reconnection with back-off.
#pragma once

#include <functional>
#include <memory>

#include <boost/asio/io_context.hpp>

#include "config/options.h"
#include "control/metrics_server.h"

namespace dltrain::agent {

/// Runs on `io` (single-threaded). Dials opt.leader_url with opt.agent_token, registers
/// (name, advertise_address, cores, memory), sends a heartbeat every
/// opt.heartbeat_interval, starts and stops task processes as the leader asks and
/// forwards each task's stdout events and exit to the leader. When the connection is
/// lost it reconnects with exponential back-off (0.5 s doubling to 10 s); tasks keep
/// running meanwhile and their events are buffered (bounded, oldest progress dropped
/// first).
class Agent {
 public:
  Agent(boost::asio::io_context& io, config::AgentOptions opt);
  ~Agent();  ///< kills any task still running
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  /// Starts connecting. Throws ConfigError for an unusable leader_url or state_dir.
  void start();
  /// Stops every task (SIGTERM, SIGKILL after opt.task_stop_grace), closes the link, then
  /// calls `done` on the io thread.
  void shutdown(std::function<void()> done);
  /// Adds this agent's metric families and its tasks' (dltrain_agent_*, dltrain_task_*,
  /// dltrain_worker_*, dltrain_ps_*; docs/operations.md "Metrics") to `out`. Tasks that
  /// ended stay for 10 minutes (at most 64 of them) with their final values. Call on the
  /// io thread.
  void collect_metrics(control::MetricsBuilder& out) const;
  /// Sets what is called once, on the io thread, after the first successful
  /// registration. Call before start().
  void set_on_registered(std::function<void()> f);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::agent
