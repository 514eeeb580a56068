#include "load/sim_client.h"

#include "wire/control_bodies.h"

namespace dltrain::load {

namespace {

json job_query(const std::string& job) {
  wire::JobQueryBody q;
  q.job = job;
  return q.to_json();
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

SimClient::SimClient(LoadRun& run, int index) : run_(run), name_("client-" + std::to_string(index)), timer_(run.io) {}

void SimClient::start(std::function<void(bool)> done) {
  link_ = std::make_shared<Link>(run_, control::PeerKind::kClient, name_);
  std::weak_ptr<SimClient> w = weak_from_this();
  link_->on_incoming = [w](const wire::Envelope& env) {
    auto self = w.lock();
    if (!self) return;
    if (env.type == "event") return self->on_event(env.body);
    self->run_.errors.add("unexpected_message:client", self->name_ + ": leader sent \"" + env.type + "\"");
  };
  link_->on_lost = [w] {
    if (auto self = w.lock()) self->timer_.cancel();
  };
  link_->connect(std::move(done));
}

void SimClient::begin_requests() {
  active_ = true;
  tick();
}

void SimClient::end_requests() {
  active_ = false;
  timer_.cancel();
}

void SimClient::stop() {
  end_requests();
  if (link_) link_->close();
}

// One request at a time, as `dltrain` sends them: think for client_interval (uniform in
// [0.5, 1.5] x it), send, wait for the reply (or its timeout), think again. A saturated
// leader then slows the clients down instead of piling requests up.
void SimClient::tick() {
  const double wait = run_.opt.client_interval * (0.5 + run_.uniform());
  timer_.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)));
  timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self || ec || !self->active_ || !self->connected()) return;
    auto& run = self->run_;
    const auto& o = run.opt;
    auto next = [w] {
      if (auto me = w.lock(); me && me->active_) me->tick();
    };
    const double total = o.weight_status + o.weight_list + o.weight_follow;
    const double pick = run.uniform() * total;
    std::string job;
    if (pick >= o.weight_status + o.weight_list) {
      job = run.running_job();
      if (!job.empty() && !self->following_.count(job)) {
        self->link_->request(
            "follow", job_query(job), "follow",
            [w, job](const wire::Envelope& env) {
              auto me = w.lock();
              if (!me) return;
              me->run_.job_seen(job, env.body);
              me->following_.insert(job);
            },
            false, next);
        return;
      }
    }
    job = pick < o.weight_status ? run.any_job() : job;
    if (!job.empty()) {
      self->link_->request(
          "status", job_query(job), "status",
          [w, job](const wire::Envelope& env) {
            if (auto me = w.lock()) me->run_.job_seen(job, env.body);
          },
          false, next);
    } else {
      self->link_->request("list", json::object(), "list", {}, false, next);
    }
  });
}

void SimClient::submit(const std::string& job_toml, bool follow) {
  if (!connected()) return;
  std::weak_ptr<SimClient> w = weak_from_this();
  wire::SubmitBody body;
  body.job_toml = job_toml;
  body.follow = follow;
  link_->request("submit", body.to_json(), "submit",
                 [w, follow](const wire::Envelope& env) {
                   auto self = w.lock();
                   if (!self) return;
                   const std::string id = env.body.value("job", "");
                   if (id.empty()) {
                     self->run_.errors.add("bad_reply:submit", self->name_ + ": no job id in " + env.body.dump());
                     return;
                   }
                   auto& run = self->run_;
                   if (run.jobs.emplace(id, JobEntry{}).second) run.job_ids.push_back(id);
                   run.job_seen(id, env.body);
                   if (follow) self->following_.insert(id);
                 });
}

// An event of a followed job: relayed task events are timed against the moment the
// simulated task sent them; the summary ends the follow.
void SimClient::on_event(const json& body) {
  if (run_.measuring) ++run_.events_received;
  const std::string job = body.value("job", "");
  const std::string kind = body.value("event", "");
  if (kind == "summary") {
    run_.job_seen(job, body);
    following_.erase(job);
    return;
  }
  if (!body.contains("task") || !body["task"].is_string()) return;
  const auto key = relay_key(job, body["task"].get<std::string>(), body);
  if (key.empty()) return;
  if (auto it = run_.relayed_at.find(key); it != run_.relayed_at.end()) run_.sample("event_relay", ms_since(it->second));
}

Monitor::Monitor(LoadRun& run) : run_(run) {}

void Monitor::start(std::function<void(bool)> done) {
  link_ = std::make_shared<Link>(run_, control::PeerKind::kClient, "monitor");
  link_->on_incoming = [](const wire::Envelope&) {};
  link_->connect(std::move(done));
}

void Monitor::stop() {
  if (link_) link_->close();
}

void Monitor::agents(std::function<void(std::optional<AgentsView>)> done) {
  if (!link_->is_open()) return done(std::nullopt);
  const std::string prefix = run_.opt.name_prefix + "-";
  link_->request(
      "agents", json::object(), "agents",
      [done, prefix](const wire::Envelope& env) {
        AgentsView v;
        for (const auto& a : env.body.value("agents", json::array())) {
          const std::string state = a.value("state", "");
          const std::string name = a.value("agent", "");
          const bool ours = name.rfind(prefix, 0) == 0;
          if (state == "ready") {
            ++v.ready;
            v.ours_ready += ours ? 1 : 0;
          }
          if (state == "stopping") ++v.stopping;
          if (state == "lost") {
            ++v.lost;
            v.lost_names.push_back(name);
          } else {
            v.max_silence = std::max(v.max_silence, a.value("seconds_since_heartbeat", 0.0));
          }
        }
        done(v);
      },
      true);
}

void Monitor::list(std::function<void(bool)> done) {
  if (!link_->is_open()) return done(false);
  link_->request(
      "list", json::object(), "monitor_list",
      [this, done](const wire::Envelope& env) {
        for (const auto& j : env.body.value("jobs", json::array())) {
          // The list's entries name their job "job" (the summary's field).
          run_.job_seen(j.value("job", ""), j);
        }
        done(true);
      },
      true);
}

}  // namespace dltrain::load
