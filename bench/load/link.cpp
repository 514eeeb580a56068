#include <algorithm>
#include <vector>

#include "common/errors.h"
#include "load/load_run.h"

namespace dltrain::load {

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool is_terminal(const std::string& s) { return s == "succeeded" || s == "failed" || s == "cancelled"; }

}  // namespace

std::string LoadRun::running_job() {
  const std::size_t n = std::min<std::size_t>(job_ids.size(), 64);
  if (n == 0) return "";
  // A few tries at random among the newest, then the newest that runs.
  for (int i = 0; i < 4; ++i) {
    const auto& id = job_ids[job_ids.size() - 1 - static_cast<std::size_t>(uniform() * static_cast<double>(n))];
    if (!jobs[id].terminal()) return id;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& id = job_ids[job_ids.size() - 1 - i];
    if (!jobs[id].terminal()) return id;
  }
  return "";
}

std::string LoadRun::any_job() {
  if (job_ids.empty()) return "";
  return job_ids[static_cast<std::size_t>(uniform() * static_cast<double>(job_ids.size()))];
}

void LoadRun::job_seen(const std::string& id, const json& status) {
  auto it = jobs.find(id);
  if (it == jobs.end() || !status.is_object()) return;
  auto& j = it->second;
  const std::string state = status.value("state", j.state);
  if (j.terminal() && !is_terminal(state)) return;  // an older view
  j.state = state;
  if (status.contains("wall_seconds") && status["wall_seconds"].is_number()) {
    j.wall_seconds = status["wall_seconds"].get<double>();
  }
  if (status.contains("error") && status["error"].is_string()) j.error = status["error"].get<std::string>();
}

std::string relay_key(const std::string& job, const std::string& task, const json& ev) {
  const std::string kind = ev.value("event", "");
  if (kind == "progress") return job + "/" + task + "/progress/" + std::to_string(ev.value("global_step", 0LL));
  if (kind == "epoch_end") return job + "/" + task + "/epoch_end/" + std::to_string(ev.value("epoch", 0));
  return "";
}

Link::Link(LoadRun& run, control::PeerKind kind, std::string who)
    : run_(run), kind_(kind), who_(std::move(who)) {}

void Link::connect(std::function<void(bool)> done) {
  const bool agent = kind_ == control::PeerKind::kAgent;
  client_ = std::make_shared<control::ControlClient>(run_.io, run_.opt.leader_url,
                                                     agent ? run_.opt.agent_token : run_.opt.client_token, kind_);
  std::weak_ptr<Link> w = weak_from_this();
  client_->on_message = [w](const std::string& text) {
    if (auto self = w.lock()) self->on_message(text);
  };
  client_->on_close = [w](const std::string& reason) {
    auto self = w.lock();
    if (!self || self->closing_) return;
    const bool agent_side = self->kind_ == control::PeerKind::kAgent;
    self->run_.errors.add(agent_side ? "session_closed:agent" : "session_closed:client",
                          self->who_ + ": " + reason);
    if (self->on_lost) self->on_lost();
  };
  const auto started = Clock::now();
  client_->connect(std::chrono::seconds(10), [w, started, done, agent](std::exception_ptr e) {
    auto self = w.lock();
    if (!self) return;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        self->run_.errors.add(agent ? "connect:agent" : "connect:client", self->who_ + ": " + ex.what());
      }
      return done(false);
    }
    self->run_.sample("connect", ms_since(started), true);
    done(true);
  });
}

void Link::send(std::string text) {
  if (run_.measuring) {
    ++run_.messages_out;
    run_.bytes_out += text.size();
  }
  client_->send(std::move(text));
}

void Link::request(const std::string& type, const json& body, const std::string& kind, ReplyFn on_reply,
                   bool always, std::function<void()> on_done) {
  if (!is_open()) return;
  const std::string id = "r" + std::to_string(next_id_++);
  pending_[id] = Pending{kind, Clock::now(), std::move(on_reply), always, std::move(on_done)};
  send(wire::make_request(id, type, body));
}

void Link::reply(const std::string& id) {
  if (is_open()) send(wire::make_reply(id, json::object()));
}

void Link::reply_error(const std::string& id, const std::string& code, const std::string& message) {
  if (is_open()) send(wire::make_error(id, code, message));
}

void Link::close() {
  closing_ = true;
  if (client_) client_->close();
}

bool Link::is_open() const { return client_ && client_->is_open() && !closing_; }

void Link::expire(Clock::time_point now) {
  const auto bound = std::chrono::duration<double>(run_.opt.request_timeout);
  // Called after the walk: an on_done may send the next request (and rehash pending_).
  std::vector<std::function<void()>> done;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.sent > bound) {
      run_.errors.add("timeout:" + it->second.kind,
                      who_ + ": no reply within " + std::to_string(run_.opt.request_timeout) + " s");
      if (it->second.on_done) done.push_back(std::move(it->second.on_done));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& f : done) f();
}

void Link::on_message(const std::string& text) {
  if (run_.measuring) {
    ++run_.messages_in;
    run_.bytes_in += text.size();
  }
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const ProtocolError& e) {
    run_.errors.add("bad_message", who_ + ": " + e.what());
    return;
  }
  if (env.type != "reply") {
    if (on_incoming) on_incoming(env);
    return;
  }
  auto it = pending_.find(env.id);
  if (it == pending_.end()) {
    // Answered after its timeout (already counted), or an id this session never sent.
    if (!env.id.empty() && env.id[0] == 'r') return;
    run_.errors.add("unexpected_reply", who_ + ": reply to unknown id \"" + env.id + "\"");
    return;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  run_.sample(p.kind, ms_since(p.sent), p.always);
  if (p.kind == "list" || p.kind == "monitor_list") {
    run_.list_bytes_max = std::max<std::uint64_t>(run_.list_bytes_max, text.size());
  }
  if (!env.ok) {
    run_.errors.add("error_reply:" + p.kind + ":" + env.error.value("code", "?"),
                    who_ + ": " + env.error.value("message", "?"));
  } else if (p.on_reply) {
    p.on_reply(env);
  }
  if (p.on_done) p.on_done();
}

}  // namespace dltrain::load
