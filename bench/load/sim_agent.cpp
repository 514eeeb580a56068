#include "load/sim_agent.h"

#include <algorithm>
#include <cmath>

#include "job/job_spec.h"
#include "wire/control_bodies.h"
#include "wire/task_events.h"

namespace dltrain::load {

namespace events = wire::events;

namespace {

std::chrono::nanoseconds seconds(double s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

}  // namespace

SimAgent::SimAgent(LoadRun& run, int index)
    : run_(run), name_(run.opt.name_prefix + "-" + std::to_string(index)), hb_timer_(run.io) {}

void SimAgent::start(std::function<void(bool)> done) {
  link_ = std::make_shared<Link>(run_, control::PeerKind::kAgent, name_);
  std::weak_ptr<SimAgent> w = weak_from_this();
  link_->on_incoming = [w](const wire::Envelope& env) {
    if (auto self = w.lock()) self->on_incoming(env);
  };
  link_->on_lost = [w] {
    if (auto self = w.lock()) {
      self->lost_ = true;
      self->hb_timer_.cancel();
      for (auto& [k, t] : self->tasks_) t.timer->cancel();
    }
  };
  link_->connect([w, done](bool ok) {
    auto self = w.lock();
    if (!self) return;
    if (!ok) return done(false);
    // What Agent::Impl::do_register sends, with no tasks (a fresh agent).
    wire::RegisterBody reg;
    reg.name = self->name_;
    reg.advertise_address = "127.0.0.1";
    reg.cores = self->run_.opt.cores_per_agent;
    reg.memory_mb = 16384;
    self->link_->request(
        "register", reg.to_json(), "register",
        [w, done](const wire::Envelope& env) {
          auto me = w.lock();
          if (!me) return;
          me->registered_ = true;
          me->hb_interval_ = std::chrono::milliseconds(env.body.value("heartbeat_interval_ms", 1000));
          me->next_beat_ = Clock::now() + me->hb_interval_;
          me->heartbeat();
          done(true);
        },
        true);
  });
}

void SimAgent::stop() {
  stopped_ = true;
  hb_timer_.cancel();
  for (auto& [k, t] : tasks_) t.timer->cancel();
  if (link_) link_->close();
}

// As the real agent: one heartbeat every interval while registered. The schedule is
// absolute (interval after the previous one was due), so that how late the tool's own
// loop fires it can be measured.
void SimAgent::heartbeat() {
  hb_timer_.expires_at(next_beat_);
  hb_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self || ec || self->stopped_ || self->lost_) return;
    auto& run = self->run_;
    const auto now = Clock::now();
    run.sample("tool_timer_lateness", std::chrono::duration<double, std::milli>(now - self->next_beat_).count());
    if (run.measuring) ++run.heartbeats_sent;
    self->link_->request("heartbeat", {{"running_tasks", self->tasks_.size()}}, "heartbeat",
                         [w](const wire::Envelope&) {
                           if (auto me = w.lock(); me && me->run_.measuring) ++me->run_.heartbeats_acked;
                         });
    self->next_beat_ += self->hb_interval_;
    if (self->next_beat_ < now) self->next_beat_ = now + self->hb_interval_;  // fell behind: no burst
    self->heartbeat();
  });
}

// Bodies are read as the real agent reads them (wire/control_bodies.h): a body the agent
// would refuse is an error of the run.
void SimAgent::on_incoming(const wire::Envelope& env) {
  try {
    if (env.type == "start_task") {
      const auto b = wire::parse_body<wire::StartTaskBody>(env);
      link_->reply(env.id);
      return start_task(b);
    }
    if (env.type == "stop_task") {
      const auto b = wire::parse_body<wire::TaskRefBody>(env);
      link_->reply(env.id);
      return stop_task(b);
    }
    if (env.type == "read_model_file") {
      // A simulated worker trains nothing and writes no model: the real agent's answer
      // for a task that left none (the leader then ends the job without a model).
      const auto b = wire::parse_body<wire::ModelFileRequestBody>(env);
      return link_->reply_error(env.id, wire::error_code::kNotFound,
                                b.task + " of " + b.job + " left no " + b.file + " (a simulated task)");
    }
  } catch (const std::exception& e) {
    run_.errors.add("bad_" + env.type, name_ + ": " + e.what());
    return;
  }
  run_.errors.add("unexpected_message:agent", name_ + ": leader sent \"" + env.type + "\"");
}

void SimAgent::start_task(const wire::StartTaskBody& b) {
  Task t;
  try {
    t.job = b.job;
    t.name = b.task;
    t.kind = std::string(enum_name(b.kind));
    t.index = b.index;
    t.generation = b.generation;
    const JobSpec& spec = b.spec;
    t.epochs = spec.epochs;
    t.workers = spec.workers;
    const std::int64_t examples = spec.train_samples > 0 ? spec.train_samples : 60000;
    t.steps_per_epoch = std::max<std::int64_t>(1, examples / spec.workers / spec.batch_size);
  } catch (const std::exception& e) {
    run_.errors.add("bad_start_task", name_ + ": " + e.what());
    return;
  }
  const std::string key = t.job + "/" + t.name;
  if (tasks_.count(key)) {
    run_.errors.add("bad_start_task", name_ + ": " + key + " is already running here");
    return;
  }
  ++run_.tasks_started;
  t.timer = std::make_shared<boost::asio::steady_timer>(run_.io);
  t.started_at = Clock::now();
  tasks_[key] = std::move(t);
  schedule(key);
}

void SimAgent::schedule(const std::string& key) {
  auto& t = tasks_.at(key);
  if (t.kind == "ps" || t.epoch == 0) {
    t.timer->expires_at(t.started_at + seconds(run_.opt.task_start));
  } else {
    t.timer->expires_at(std::min(t.next_progress, t.next_epoch_end));
  }
  t.timer->async_wait([w = weak_from_this(), key](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self || ec || self->stopped_ || self->lost_) return;
    self->advance(key);
  });
}

void SimAgent::send_event(const Task& t, const json& ev) {
  if (const auto k = relay_key(t.job, t.name, ev); !k.empty()) run_.relayed_at[k] = Clock::now();
  wire::TaskEventBody b;
  b.job = t.job;
  b.task = t.name;
  b.generation = t.generation;
  b.event = ev;
  link_->request("task_event", b.to_json(), "task_event");
}

void SimAgent::send_exit(const std::string& key, int exit_code) {
  auto it = tasks_.find(key);
  if (it == tasks_.end()) return;
  const Task t = it->second;
  t.timer->cancel();
  tasks_.erase(it);
  ++run_.tasks_finished;
  wire::TaskExitBody b;
  b.job = t.job;
  b.task = t.name;
  b.generation = t.generation;
  b.exit_code = exit_code;
  b.describe = "exit code " + std::to_string(exit_code);  // ExitStatus::describe()
  link_->request("task_exit", b.to_json(), "task_exit");
}

// The next event of a task, as its real process would print it.
void SimAgent::advance(const std::string& key) {
  auto it = tasks_.find(key);
  if (it == tasks_.end()) return;
  auto& t = it->second;
  const auto now = Clock::now();
  if (t.kind == "ps") {
    // Its agent adds the advertise address; the port is never dialled (no worker runs).
    events::Listening l;
    l.port = 20000 + static_cast<int>(std::hash<std::string>{}(key) % 40000);
    l.shard = t.index;
    l.address = "127.0.0.1";
    return send_event(t, l.to_json());
  }
  if (t.epoch == 0) {
    events::Started s;
    s.rank = t.index;
    s.train_examples = t.steps_per_epoch * 64;
    s.steps_per_epoch = t.steps_per_epoch;
    s.parameters = 60986;  // the small CNN
    s.partitions = 1;
    s.load_seconds = run_.opt.task_start;
    send_event(t, s.to_json());
    t.epoch = 1;
    t.next_progress = now + seconds(run_.opt.progress_interval);
    t.next_epoch_end = now + seconds(run_.opt.epoch_seconds);
    return schedule(key);
  }
  const double per_step = run_.opt.epoch_seconds / static_cast<double>(t.steps_per_epoch);
  if (now >= t.next_epoch_end) {
    t.global_step = std::max<std::int64_t>(t.global_step + 1, t.epoch * t.steps_per_epoch);
    t.bytes += static_cast<std::uint64_t>(t.steps_per_epoch) * 244000;
    events::EpochEnd e;
    e.rank = t.index;
    e.epoch = t.epoch;
    e.epochs = t.epochs;
    e.train_loss = 1.0 / (1.0 + t.epoch);
    e.epoch_seconds = run_.opt.epoch_seconds;
    e.images_per_sec = static_cast<double>(t.steps_per_epoch * 64) / run_.opt.epoch_seconds;
    if (t.index == 0) {
      e.test_accuracy = 0.9 - 0.3 / (1.0 + t.epoch);
      e.eval_seconds = 0.1;
    }
    e.bytes_pushed = e.bytes_pulled = t.bytes;
    send_event(t, e.to_json());
    if (t.epoch >= t.epochs) {
      events::Done d;
      d.rank = t.index;
      if (t.index == 0) d.test_accuracy = *e.test_accuracy;
      d.steps = t.global_step;
      d.wall_seconds = std::chrono::duration<double>(now - t.started_at).count();
      d.bytes_pushed = d.bytes_pulled = t.bytes;
      send_event(t, d.to_json());
      return send_exit(key, 0);
    }
    ++t.epoch;
    t.next_epoch_end += seconds(run_.opt.epoch_seconds);
    return schedule(key);
  }
  // Progress: where the epoch's time says the worker is.
  const double into = run_.opt.epoch_seconds -
                      std::chrono::duration<double>(t.next_epoch_end - now).count();
  const auto step = std::clamp<std::int64_t>(static_cast<std::int64_t>(into / per_step), 1, t.steps_per_epoch);
  t.global_step = std::max(t.global_step + 1, (t.epoch - 1) * t.steps_per_epoch + step);
  t.bytes = static_cast<std::uint64_t>(t.global_step) * 244000;
  events::Progress p;
  p.rank = t.index;
  p.epoch = t.epoch;
  p.step = step;
  p.steps_per_epoch = t.steps_per_epoch;
  p.global_step = t.global_step;
  p.loss = 2.0 / (1.0 + static_cast<double>(t.global_step) / static_cast<double>(t.steps_per_epoch));
  p.lr = 0.05;
  p.images_per_sec = 64.0 / per_step;
  p.bytes_pushed = p.bytes_pulled = t.bytes;
  send_event(t, p.to_json());
  t.next_progress += seconds(run_.opt.progress_interval);
  if (t.next_progress < now) t.next_progress = now + seconds(run_.opt.progress_interval);
  schedule(key);
}

// SIGTERM, as the real tasks take it: a PS shard reports "stopped" and exits 0; a worker
// reports "stopped" (no replica saved) and exits 143.
void SimAgent::stop_task(const wire::TaskRefBody& b) {
  const std::string key = b.job + "/" + b.task;
  auto it = tasks_.find(key);
  if (it == tasks_.end()) return;  // already ended; its exit was reported
  auto& t = it->second;
  if (t.kind == "ps") {
    events::PsStopped s;
    s.shard = t.index;
    send_event(t, s.to_json());
    return send_exit(key, 0);
  }
  events::WorkerStopped s;
  s.rank = t.index;
  s.epochs_done = std::max(0, t.epoch - 1);
  send_event(t, s.to_json());
  send_exit(key, 143);
}

}  // namespace dltrain::load
