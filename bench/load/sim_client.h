// Simulated clients: real /v1/client sessions that send what `dltrain` sends (list,
// status, follow, submit; control/client.h's BlockingControlClient does one request at a
// time, these keep a session open and pace their requests), and the monitor, one more
// client session that reads the leader's view of its agents (`dltrain agents`) and
// jobs (`dltrain list`).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "load/load_run.h"

namespace dltrain::load {

/// One simulated client. Create with make_shared; runs on LoadRun::io.
class SimClient : public std::enable_shared_from_this<SimClient> {
 public:
  /// Named "client-`index`" in error messages.
  SimClient(LoadRun& run, int index);

  /// Connects; `done(ok)`.
  void start(std::function<void(bool)> done);
  /// Starts (and stops) the client's requests, one at a time: it thinks for
  /// LoadOptions::client_interval on average, sends one of status / list / follow chosen
  /// by their weights, waits for its reply (or its timeout), and thinks again.
  void begin_requests();
  void end_requests();
  /// Submits `job_toml` (follow = true: this session then receives its events).
  void submit(const std::string& job_toml, bool follow);
  /// Closes the session.
  void stop();
  /// The session is up.
  bool connected() const { return link_ && link_->is_open(); }
  /// Requests of this client still waiting for their reply.
  bool busy() const { return link_ && link_->pending() > 0; }
  /// Counts this client's requests in flight for longer than the request timeout.
  void expire(Clock::time_point now) {
    if (link_) link_->expire(now);
  }

 private:
  void tick();
  void on_event(const json& body);

  LoadRun& run_;
  std::string name_;
  std::shared_ptr<Link> link_;
  boost::asio::steady_timer timer_;
  std::set<std::string> following_;  ///< jobs whose events this session receives
  bool active_ = false;
};

/// The monitor session: the leader's view of the agents and jobs, as `dltrain agents`
/// and `dltrain list` read it.
class Monitor : public std::enable_shared_from_this<Monitor> {
 public:
  /// The figures of one `agents` reply.
  struct AgentsView {
    int ready = 0, lost = 0, stopping = 0;  ///< agents in each state (all of them)
    int ours_ready = 0;   ///< of the simulated agents (LoadOptions::name_prefix)
    std::vector<std::string> lost_names;
    double max_silence = 0;  ///< largest seconds_since_heartbeat of an agent not lost
  };

  explicit Monitor(LoadRun& run);
  /// Connects its client session; `done(ok)`.
  void start(std::function<void(bool)> done);
  /// Sends `agents`; `done` gets the view, or nullopt at once when the session is down.
  /// An error reply or a timeout is counted in LoadRun::errors and `done` is not called.
  void agents(std::function<void(std::optional<AgentsView>)> done);
  /// Sends `list` and notes every submitted job's state (LoadRun::job_seen); `done(true)`
  /// after the reply, `done(false)` at once when the session is down (an error reply or
  /// a timeout: counted, `done` not called).
  void list(std::function<void(bool)> done);
  /// Closes the session.
  void stop();
  /// Counts its requests in flight for longer than the request timeout.
  void expire(Clock::time_point now) {
    if (link_) link_->expire(now);
  }

 private:
  LoadRun& run_;
  std::shared_ptr<Link> link_;
};

}  // namespace dltrain::load
