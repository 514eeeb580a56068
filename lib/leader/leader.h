// The leader: agent registry, FIFO job queue, role assignment, job state machine and the
// client API, behind the control server.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <boost/asio/io_context.hpp>

#include "config/options.h"
#include "control/metrics_server.h"
#include "store/store.h"

namespace dltrain::leader {

/// What a leader elected through etcd works with (docs/ha.md); the default is a single
/// leader: no term, always serving, its state in RocksDB under state_dir.
struct LeaderTerm {
  /// The term it serves (the etcd election key's create revision, > 0), sent with every
  /// order to an agent and in the registration reply; 0: a single leader.
  std::int64_t term = 0;
  /// False once the term may be over (LeaderElection::serving()): from then on no order
  /// is sent and every request is refused as unavailable. Called on the io thread before
  /// each order; empty: always serving.
  std::function<bool()> serving;
  /// Opens the store of the leader's state (an ha::EtcdStore fenced by `term`) in
  /// Leader::start; empty: RocksDB under state_dir. Throws StoreError.
  std::function<std::unique_ptr<store::Store>()> open_store;
  /// The candidates as the election sees them, for `status` and `agents`: a JSON array
  /// of {"candidate", "address", "state": "serving"|"standing by", "since_unix"}.
  std::function<nlohmann::json()> candidates;
};

/// Runs the leader's control endpoint and job logic on `io` (single-threaded: every
/// callback runs on the thread that runs `io`, so the leader's state needs no locks).
///
/// Job states: queued → starting (PS shards launched) → running (workers launched) →
/// succeeded | failed | cancelled (via cancelling). A job that does not fit the free
/// cores of the registered agents waits, in submission order, in state queued.
class Leader {
 public:
  /// Uses opt.listen_address/listen_port, the two tokens, the heartbeat settings and
  /// task_stop_grace.
  Leader(boost::asio::io_context& io, const config::AgentOptions& opt, LeaderTerm term = {});
  ~Leader();
  Leader(const Leader&) = delete;
  Leader& operator=(const Leader&) = delete;

  /// Listens (throws IoError/ConfigError) and starts the heartbeat checker.
  void start();
  /// Stops listening and closes every session. Tasks are stopped by their agents.
  void stop();
  /// Bound control port.
  std::uint16_t port() const;
  /// Agents currently registered and not lost.
  std::size_t live_agents() const;
  /// Adds the leader's metric families (dltrain_leader_*, dltrain_job_*;
  /// docs/operations.md "Metrics") to `out`. Call on the io thread.
  void collect_metrics(control::MetricsBuilder& out) const;
  /// Sets what is called (on the io thread) whenever an agent registers; call on the io
  /// thread (before or after start()).
  void set_on_agent_registered(std::function<void()> f);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::leader
