#include "load/driver.h"

#include <algorithm>

namespace dltrain::load {

Driver::Driver(LoadRun& run, std::string job_toml)
    : run_(run),
      job_toml_(std::move(job_toml)),
      ramp_timer_(run.io),
      phase_timer_(run.io),
      sweep_timer_(run.io),
      submit_timer_(run.io),
      monitor_timer_(run.io) {}

template <typename F>
void Driver::after(boost::asio::steady_timer& t, double seconds, F&& f) {
  t.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  t.async_wait([this, f = std::forward<F>(f)](boost::system::error_code ec) {
    if (!ec) f();
  });
}

void Driver::start() {
  t_start_ = Clock::now();
  if (run_.opt.leader_pid > 0) leader_start_ = read_proc(run_.opt.leader_pid);
  for (int i = 0; i < run_.opt.agents; ++i) agents_.push_back(std::make_shared<SimAgent>(run_, i));
  for (int i = 0; i < run_.opt.clients; ++i) clients_.push_back(std::make_shared<SimClient>(run_, i));
  monitor_ = std::make_shared<Monitor>(run_);
  monitor_->start([this](bool ok) {
    monitor_up_ = ok;
    if (!ok) return finish();  // nothing can be read back from the leader
    ramp_tick();
  });
  after(phase_timer_, run_.opt.ramp_timeout, [this] {
    if (phase_ != Phase::kRamp) return;
    run_.errors.add("ramp_timeout", std::to_string(agents_up_) + " of " + std::to_string(agents_.size()) +
                                        " agents registered and " + std::to_string(clients_up_) + " of " +
                                        std::to_string(clients_.size()) + " clients connected within " +
                                        std::to_string(run_.opt.ramp_timeout) + " s");
    begin_window();
  });
  sweep();
}

// Opens sessions at connect_rate: agents first (a client's job needs them), then clients.
void Driver::ramp_tick() {
  if (phase_ != Phase::kRamp) return;
  constexpr double kTick = 0.01;
  ramp_credit_ += run_.opt.connect_rate * kTick;
  while (ramp_credit_ >= 1 && (next_agent_ < agents_.size() || next_client_ < clients_.size())) {
    ramp_credit_ -= 1;
    if (next_agent_ < agents_.size()) {
      agents_[next_agent_++]->start([this](bool ok) {
        (ok ? agents_up_ : agents_failed_) += 1;
        ramp_check();
      });
    } else {
      clients_[next_client_++]->start([this](bool ok) {
        (ok ? clients_up_ : clients_failed_) += 1;
        ramp_check();
      });
    }
  }
  if (next_agent_ < agents_.size() || next_client_ < clients_.size()) {
    after(ramp_timer_, kTick, [this] { ramp_tick(); });
  } else {
    ramp_check();
  }
}

void Driver::ramp_check() {
  if (phase_ != Phase::kRamp) return;
  const auto a = static_cast<std::size_t>(agents_up_ + agents_failed_);
  const auto c = static_cast<std::size_t>(clients_up_ + clients_failed_);
  if (a == agents_.size() && c == clients_.size()) begin_window();
}

void Driver::begin_window() {
  phase_ = Phase::kWindow;
  t_ramp_end_ = Clock::now();
  if (run_.opt.leader_pid > 0) leader_ramp_end_ = read_proc(run_.opt.leader_pid);
  self_ramp_end_ = read_proc(0);
  machine_ramp_end_ = read_machine_cpu();
  run_.measuring = true;
  for (auto& c : clients_) {
    if (c->connected()) c->begin_requests();
  }
  if (run_.opt.submit_rate > 0) submit_tick();
  monitor_tick();
  after(phase_timer_, run_.opt.duration, [this] { end_window(); });
}

void Driver::submit_tick() {
  if (phase_ != Phase::kWindow || clients_.empty()) return;
  // A random connected client submits; with follow, it then receives the job's events.
  for (int tries = 0; tries < 8; ++tries) {
    auto& c = clients_[static_cast<std::size_t>(run_.uniform() * static_cast<double>(clients_.size()))];
    if (!c->connected()) continue;
    c->submit(job_toml_, run_.uniform() < run_.opt.submit_follow);
    ++submits_sent_;
    break;
  }
  after(submit_timer_, 1.0 / run_.opt.submit_rate, [this] { submit_tick(); });
}

void Driver::note_view(const Monitor::AgentsView& v) {
  ++views_;
  max_silence_ = std::max(max_silence_, v.max_silence);
  max_lost_seen_ = std::max(max_lost_seen_, v.lost);
}

void Driver::monitor_tick() {
  if (phase_ != Phase::kWindow && phase_ != Phase::kDrain) return;
  monitor_->agents([this](std::optional<Monitor::AgentsView> v) {
    if (v) note_view(*v);
  });
  after(monitor_timer_, run_.opt.monitor_interval, [this] { monitor_tick(); });
}

void Driver::end_window() {
  run_.measuring = false;
  t_window_end_ = Clock::now();
  if (run_.opt.leader_pid > 0) leader_window_end_ = read_proc(run_.opt.leader_pid);
  self_window_end_ = read_proc(0);
  machine_window_end_ = read_machine_cpu();
  phase_ = Phase::kDrain;
  submit_timer_.cancel();
  for (auto& c : clients_) c->end_requests();
  after(phase_timer_, run_.opt.drain_timeout, [this] {
    if (phase_ == Phase::kDrain) finish();
  });
  drain_poll();
}

// Every submitted job has ended (as the leader's list says), or the drain timed out.
void Driver::drain_poll() {
  if (phase_ != Phase::kDrain) return;
  const bool all_ended =
      std::all_of(run_.jobs.begin(), run_.jobs.end(), [](const auto& kv) { return kv.second.terminal(); });
  // Submits still unanswered may add jobs: wait for their replies (or their timeouts).
  const bool replies_due = std::any_of(clients_.begin(), clients_.end(), [](const auto& c) { return c->busy(); });
  if (all_ended && !replies_due) return finish();
  monitor_->list([this](bool ok) {
    if (!ok) finish();  // the monitor's session is gone: nothing more can be learnt
  });
  after(ramp_timer_, 1.0, [this] { drain_poll(); });
}

void Driver::finish() {
  if (phase_ == Phase::kFinish || phase_ == Phase::kDone) return;
  phase_ = Phase::kFinish;
  t_drain_end_ = Clock::now();
  phase_timer_.cancel();
  monitor_timer_.cancel();
  ramp_timer_.cancel();
  if (!monitor_up_) return close_all();
  // The leader's last word on the jobs, then on its agents (while every session is open).
  monitor_->list([this](bool) {
    monitor_->agents([this](std::optional<Monitor::AgentsView> v) {
      if (v) {
        note_view(*v);
        final_view_ = v;
      }
      close_all();
    });
  });
  after(phase_timer_, run_.opt.request_timeout + 1, [this] { close_all(); });
}

void Driver::close_all() {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  // A submitted job that failed, was cancelled or did not end is an error of the run.
  for (const auto& id : run_.job_ids) {
    const auto& j = run_.jobs.at(id);
    if (j.state == "succeeded") continue;
    run_.errors.add(j.terminal() ? "job_" + j.state : "job_unfinished",
                    id + " (" + j.state + ")" + (j.error.empty() ? "" : ": " + j.error));
  }
  phase_timer_.cancel();
  submit_timer_.cancel();
  for (auto& a : agents_) a->stop();
  for (auto& c : clients_) c->stop();
  if (monitor_) monitor_->stop();
  // Time for the close frames to leave, then the loop ends.
  after(phase_timer_, 0.5, [this] {
    sweep_timer_.cancel();
    run_.io.stop();
  });
}

// Once a second: requests past their timeout, the leader's memory, old relay stamps.
void Driver::sweep() {
  const auto now = Clock::now();
  for (auto& a : agents_) a->expire(now);
  for (auto& c : clients_) c->expire(now);
  if (monitor_) monitor_->expire(now);
  if (run_.opt.leader_pid > 0) {
    if (auto s = read_proc(run_.opt.leader_pid)) {
      leader_last_ = s;
      leader_rss_max_ = std::max(leader_rss_max_, s->rss_mb);
    }
  }
  for (auto it = run_.relayed_at.begin(); it != run_.relayed_at.end();) {
    it = now - it->second > std::chrono::minutes(2) ? run_.relayed_at.erase(it) : std::next(it);
  }
  if (phase_ != Phase::kDone) after(sweep_timer_, 1.0, [this] { sweep(); });
}

}  // namespace dltrain::load
