// The phases of one load run, on LoadRun::io:
//   ramp    the monitor session, then every agent (connect + register) and every client
//           (connect), LoadOptions::connect_rate sessions per second;
//   window  LoadOptions::duration seconds: agents heartbeat and run the tasks the leader
//           starts, clients send their requests, jobs are submitted at submit_rate, the
//           monitor reads the leader's agents every monitor_interval; latencies, message
//           counts and the leader's CPU time are measured here;
//   drain   no more client requests or submits; the agents go on until every submitted
//           job has ended (or drain_timeout);
//   finish  the leader's final view of its agents and jobs, then every session closes
//           and io stops.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "load/load_run.h"
#include "load/sim_agent.h"
#include "load/sim_client.h"

namespace dltrain::load {

/// Runs the phases above; report() afterwards. Not copyable; lives until io has stopped.
class Driver {
 public:
  /// `job_toml`: the job file text every submit sends.
  Driver(LoadRun& run, std::string job_toml);
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  /// Starts the ramp; io.run() then runs the whole load and returns after the finish.
  void start();
  /// Everything measured, as JSON (see bench/load/README.md for the fields).
  json report() const;
  /// No error, no agent declared lost, every submitted job succeeded, and at least one
  /// job was submitted when submit_rate asked for some.
  bool passed() const;

 private:
  enum class Phase { kRamp, kWindow, kDrain, kFinish, kDone };

  void ramp_tick();
  void ramp_check();
  void begin_window();
  void end_window();
  void drain_poll();
  void finish();
  void close_all();
  void sweep();
  void submit_tick();
  void monitor_tick();
  void note_view(const Monitor::AgentsView& v);
  template <typename F>
  void after(boost::asio::steady_timer& t, double seconds, F&& f);

  LoadRun& run_;
  std::string job_toml_;
  Phase phase_ = Phase::kRamp;
  std::vector<std::shared_ptr<SimAgent>> agents_;
  std::vector<std::shared_ptr<SimClient>> clients_;
  std::shared_ptr<Monitor> monitor_;
  boost::asio::steady_timer ramp_timer_, phase_timer_, sweep_timer_, submit_timer_, monitor_timer_;

  // Ramp.
  std::size_t next_agent_ = 0, next_client_ = 0;
  double ramp_credit_ = 0;
  int agents_up_ = 0, agents_failed_ = 0, clients_up_ = 0, clients_failed_ = 0;
  bool monitor_up_ = false;
  Clock::time_point t_start_, t_ramp_end_, t_window_end_, t_drain_end_;

  // Leader and tool, read from /proc.
  std::optional<ProcSample> leader_start_, leader_ramp_end_, leader_window_end_, leader_last_;
  std::optional<ProcSample> self_ramp_end_, self_window_end_;
  double leader_rss_max_ = 0;
  std::optional<MachineCpu> machine_ramp_end_, machine_window_end_;

  // The leader's view of the agents.
  std::optional<Monitor::AgentsView> final_view_;
  double max_silence_ = 0;     ///< over every view in the window and drain
  int max_lost_seen_ = 0;
  int views_ = 0;
  std::uint64_t submits_sent_ = 0;
};

}  // namespace dltrain::load
