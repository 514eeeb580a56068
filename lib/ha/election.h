// Leader election on etcd (etcd's election recipe, over ha/etcd_client.h): each
// candidate takes a lease with a TTL, and tries to create the election key attached to
// it with a compare-and-swap transaction (the key's create_revision must be 0); the one
// whose create succeeds serves, and the key's create_revision is its *term* (a number no
// earlier leader had). The others watch the key and try again when it is deleted — when
// the leader resigns, or its lease expires because it stopped renewing it (its machine
// died, its process was paused, it lost its etcd quorum). docs/ha.md.
//
// Fencing. A leader can never know that its lease is alive *now*, only that etcd had not
// expired it when the last renewal was sent: the lease lives at least TTL seconds after
// that send on etcd's side. serving() is therefore true only until that send time plus
// TTL minus a safety margin (the monotonic clock: a paused process that wakes finds its
// time gone), so a leader stops issuing orders before its lease can have expired on the
// server; writes it makes to etcd are conditional on the election key still having its
// term (EtcdClient::put_if), so a stale leader's writes are refused by etcd itself.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "ha/etcd_client.h"

namespace dltrain::ha {

/// One candidate's settings.
struct ElectionOptions {
  std::string key = "/dltrain/leader";  ///< the election key (one per dltrain cluster)
  std::string candidate;                ///< this candidate's name (its agent name), non-empty
  std::string address;                  ///< where it serves when elected, "HOST:PORT"
  int ttl_seconds = 10;                 ///< the lease's TTL, [2, 300]; renewed every TTL/3
  /// Where each candidate announces itself while it campaigns (PREFIX/candidates/, its key
  /// NAME holding {"candidate", "address", "state": "serving"|"standing by", "since_unix"}
  /// on its lease, so a dead candidate's key goes with it); empty: not announced.
  std::string candidates_prefix;
  /// How long before its lease could expire on etcd a leader stops serving (clock rate
  /// differences, the time a renewal takes to reach etcd), in (0, TTL/2].
  std::chrono::milliseconds safety_margin{1000};
};

/// Who serves, as the election key says.
struct LeaderInfo {
  std::string candidate;     ///< its name (ElectionOptions::candidate)
  std::string address;       ///< where it serves, "HOST:PORT"
  std::int64_t term = 0;     ///< the key's create_revision
  double since_unix = 0;     ///< when it was elected, seconds since the epoch (its own clock)
  /// This candidate process's random id: tells apart two candidates given the same name
  /// (its own key of an earlier term is deleted; another's with its name is not).
  std::string instance;
};

/// A candidate campaigning on its own thread. Callbacks run on that thread, in order.
/// serving(), term() and leader() are thread-safe. serving() is the authority: it turns
/// false the moment the lease may no longer be alive, while `deposed` comes when the
/// thread notices (up to a request timeout per endpoint later).
class LeaderElection {
 public:
  /// What the candidate is told; each may be empty. They run on the election's thread and
  /// should not block; an exception from `elected` is logged and the term goes on.
  struct Callbacks {
    std::function<void(std::int64_t term)> elected;       ///< this candidate serves from now
    /// The term `term` is over (serving() already false): why.
    std::function<void(std::int64_t term, const std::string& why)> deposed;
    std::function<void(const LeaderInfo&)> standing_by;   ///< another candidate serves (on each change)
    std::function<void(const std::string& why)> trouble;  ///< etcd cannot be reached; it keeps trying
  };
  /// Throws ConfigError for an empty candidate name, a TTL outside [2, 300] or a safety
  /// margin outside (0, TTL/2], and what EtcdClient's constructor throws (bad endpoints,
  /// unreadable TLS files); it does not reach etcd (EtcdClient::check does).
  LeaderElection(EtcdOptions etcd, ElectionOptions options, Callbacks callbacks);
  /// stop().
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  /// Starts campaigning (once).
  void start();
  /// Stops: a leader resigns (deletes its key and revokes its lease, so a standby takes
  /// over at once instead of after the TTL). Joins the thread; idempotent.
  void stop();

  /// True while this candidate serves and its lease cannot have expired on etcd: until
  /// the last successful renewal's send time + TTL − safety margin, on the monotonic
  /// clock (which stops while the machine is suspended: after a resume, rely on fenced
  /// writes). An action checked before a pause can still run after it; only writes fenced
  /// by the term (EtcdClient::put_if) are refused then.
  bool serving() const;
  /// This candidate's term while it serves, else 0.
  std::int64_t term() const;
  /// The leader as last seen (this candidate when it serves), or nullopt.
  std::optional<LeaderInfo> leader() const;
  /// The candidates announced under `prefix` (ElectionOptions::candidates_prefix), as a
  /// JSON array of their values, by name. Throws EtcdError.
  static nlohmann::json read_candidates(EtcdClient& etcd, const std::string& prefix);
  /// The announced candidates as this candidate last read them (at each renewal while it
  /// serves): no request; an empty array before the first read or without a prefix.
  nlohmann::json candidates() const;
  /// The election key's value for `info` (JSON), and back. from_value throws ProtocolError.
  static std::string to_value(const LeaderInfo& info);
  static LeaderInfo from_value(const std::string& value, std::int64_t term);

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  void campaign_once(EtcdClient& etcd);
  void serve(EtcdClient& etcd, std::int64_t lease, Clock::time_point granted_at, std::int64_t term);
  bool wait_for(std::chrono::milliseconds d);  // false when stopping
  /// Puts this candidate's announcement (state "serving" or "standing by") on `lease`;
  /// a failure is only told (trouble): the election does not depend on it.
  void announce(EtcdClient& etcd, std::int64_t lease, const char* state);
  /// Reads the announced candidates into candidates_ (a failure is only told).
  void refresh_candidates(EtcdClient& etcd);

  EtcdOptions etcd_opt_;
  ElectionOptions opt_;
  Callbacks cb_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t term_ = 0;                  // guarded by mu_
  Clock::time_point valid_until_{};        // guarded by mu_
  std::optional<LeaderInfo> leader_;       // guarded by mu_
  nlohmann::json candidates_ = nlohmann::json::array();  // guarded by mu_
  std::string instance_;                   // this process's LeaderInfo::instance
};

}  // namespace dltrain::ha
