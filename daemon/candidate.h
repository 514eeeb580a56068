// dltrain-agent as a leader candidate (a configuration with leader = true and [ha]):
// it campaigns in etcd (ha/election.h); while elected it runs the leader, whose state is
// in etcd (ha/etcd_store.h) and whose orders carry its term; when its term may be over
// it stops the leader at once and stands by, campaigning again. docs/ha.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/notify.h"
#include "config/options.h"
#include "control/metrics_server.h"
#include "ha/election.h"
#include "leader/leader.h"
#include "leader/model_replica.h"

namespace dltrain::daemon {

/// One candidate. Runs on `io` (the daemon's single thread); the election's callbacks
/// are posted to it. Not thread-safe otherwise.
class Candidacy {
 public:
  /// Throws ConfigError("ha", ...) for settings LeaderElection refuses.
  Candidacy(boost::asio::io_context& io, const config::AgentOptions& opt, agent::SystemdNotifier& notifier);
  ~Candidacy();

  /// Reaches etcd (authenticating when configured) and starts campaigning. Throws
  /// ConfigError("ha.etcd", ...) naming each endpoint and why it could not be used (a
  /// closed port, TLS, wrong credentials): a wrong [ha] stops the daemon at its start.
  void start();
  /// Stops the leader if it runs, and resigns (a standby serves at once). Blocks for at
  /// most a few etcd requests.
  void stop();

  /// The leader while this candidate serves, else null. io thread only.
  leader::Leader* leader() { return leader_ ? &*leader_ : nullptr; }
  /// dltrain_ha_serving and dltrain_ha_term (docs/operations.md "Metrics"). io thread.
  void collect_metrics(control::MetricsBuilder& out) const;

 private:
  /// A new election with this candidate's settings (its callbacks posted to io_).
  std::unique_ptr<ha::LeaderElection> make_election();
  void become_leader(std::int64_t term);
  /// Stops the leader of `term` (a later term's leader is left alone: a notice about an
  /// earlier term can arrive after this candidate was elected again).
  void step_down(std::int64_t term, const std::string& why);

  ha::ElectionOptions election_opt_;
  boost::asio::steady_timer retry_timer_;  ///< a new campaign after the leader could not start

  boost::asio::io_context& io_;
  config::AgentOptions opt_;
  agent::SystemdNotifier& notifier_;
  ha::EtcdOptions etcd_;
  std::string key_, candidates_prefix_;
  std::unique_ptr<ha::LeaderElection> election_;
  std::optional<leader::Leader> leader_;
  /// While standing by: the copy of the serving leader's models and uploads in this
  /// candidate's state_dir (docs/ha.md "Artifacts"); stopped while it serves.
  std::shared_ptr<leader::ModelReplica> replica_;
  std::int64_t term_ = 0;  ///< the term leader_ serves
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  ///< posted callbacks check it
};

}  // namespace dltrain::daemon
