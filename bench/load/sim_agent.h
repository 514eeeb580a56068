// A simulated agent: one real /v1/agent session to the leader that speaks the agent
// protocol as lib/agent/agent.cpp does — register (unique name, cores), a heartbeat
// every heartbeat_interval_ms the leader answers with, start_task / stop_task answered
// and "run" — but without processes: each task reports the events a real PS shard or
// worker reports (wire/task_events.h: listening; started, progress, epoch_end with the
// test accuracy on rank 0, done; stopped) on a timer, then its exit, so that jobs finish.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <boost/asio/steady_timer.hpp>

#include "load/load_run.h"
#include "wire/control_bodies.h"

namespace dltrain::load {

/// One simulated agent. Create with make_shared; runs on LoadRun::io.
class SimAgent : public std::enable_shared_from_this<SimAgent> {
 public:
  /// Registers as LoadOptions::name_prefix-`index` with LoadOptions::cores_per_agent.
  SimAgent(LoadRun& run, int index);

  /// Connects and registers; `done(true)` once the leader accepted the registration.
  void start(std::function<void(bool)> done);
  /// Stops heartbeating and closes the session (its tasks are dropped silently).
  void stop();
  /// Registered, and the session has not ended.
  bool connected() const { return registered_ && !lost_; }
  /// The session ended without stop() (the leader would rightly declare it lost).
  bool lost_session() const { return lost_; }
  /// The name it registers with.
  const std::string& name() const { return name_; }
  /// Counts the requests of this agent in flight for longer than the request timeout.
  void expire(Clock::time_point now) {
    if (link_) link_->expire(now);
  }

 private:
  /// One task the leader started here, "running" on a timer.
  struct Task {
    std::string job, name, kind;  ///< kind "ps" | "worker"
    int index = 0;                ///< shard or rank
    std::uint32_t generation = 0;
    int epochs = 1, workers = 1;
    std::int64_t steps_per_epoch = 1, global_step = 0;
    int epoch = 0;                ///< worker: epoch in progress, 1-based; 0 = not started
    Clock::time_point next_progress, next_epoch_end, started_at;
    std::uint64_t bytes = 0;      ///< worker: simulated bytes pushed (and as many pulled)
    std::shared_ptr<boost::asio::steady_timer> timer;
  };

  void on_incoming(const wire::Envelope& env);
  void start_task(const wire::StartTaskBody& body);
  void stop_task(const wire::TaskRefBody& body);
  void heartbeat();
  /// Arms `t`'s timer for its next event (worker) or its listening event (PS shard).
  void schedule(const std::string& key);
  void advance(const std::string& key);
  void send_event(const Task& t, const json& ev);
  void send_exit(const std::string& key, int exit_code);

  LoadRun& run_;
  std::string name_;
  std::shared_ptr<Link> link_;
  boost::asio::steady_timer hb_timer_;
  std::chrono::milliseconds hb_interval_{1000};
  Clock::time_point next_beat_;
  std::map<std::string, Task> tasks_;  ///< by job/task
  bool registered_ = false, lost_ = false, stopped_ = false;
};

}  // namespace dltrain::load
