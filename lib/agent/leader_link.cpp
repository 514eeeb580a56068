#include "agent/leader_link.h"

#include <algorithm>
#include <random>

#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "control/client.h"

namespace dltrain::agent {

namespace asio = boost::asio;
using json = nlohmann::json;

LeaderLink::LeaderLink(asio::io_context& io, const config::AgentOptions& opt, Hooks hooks)
    : io_(io), opt_(opt), hooks_(std::move(hooks)), leaders_(opt.leader_urls), hb_timer_(io), retry_timer_(io), probe_timer_(io) {
  for (std::size_t i = 0; i < opt.leader_urls.size(); ++i) {
    control::parse_leader_url(opt.leader_urls[i],
                              opt.leader_urls.size() == 1 ? "leader_url" : "leader_url[" + std::to_string(i) + "]");
  }
  // 64 random bits: another process of this agent (after a restart) is another sender.
  std::random_device rd;
  const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
  sender_ = hex;
}

LeaderLink::~LeaderLink() = default;

void LeaderLink::start() { connect(); }

void LeaderLink::stop_reconnecting() {
  stopping_ = true;
  retry_timer_.cancel();
}

void LeaderLink::close() {
  hb_timer_.cancel();
  probe_timer_.cancel();
  if (link_) link_->close();
}

bool LeaderLink::connected() const { return link_ && link_->is_open() && registered_; }

void LeaderLink::send(wire::ControlType type, const json& body, bool droppable) {
  const std::string id = "a" + std::to_string(next_req_++);
  std::string text;
  if (type == wire::ControlType::kTaskEvent || type == wire::ControlType::kTaskExit) {
    json b = body;
    b["sender"] = sender_;
    b["seq"] = ++seq_;
    text = wire::make_request(id, type, b);
  } else {
    text = wire::make_request(id, type, body);
  }
  if (connected()) return send_tracked(id, std::string(enum_name(type)), std::move(text));
  outbox_.push(std::move(text), droppable);
}

void LeaderLink::send_tracked(const std::string& id, const std::string& type, std::string text) {
  if (type == enum_name(wire::ControlType::kTaskEvent) || type == enum_name(wire::ControlType::kTaskExit)) {
    unanswered_.emplace_back(id, text);
    if (unanswered_.size() > Outbox::kMaxMessages) {
      // Progress reports go first, as from the outbox; an exit is never dropped.
      auto victim = std::find_if(unanswered_.begin(), unanswered_.end(),
                                 [](const auto& m) { return Outbox::is_progress(m.second); });
      if (victim == unanswered_.end()) {
        victim = std::find_if(unanswered_.begin(), unanswered_.end(),
                              [](const auto& m) { return m.second.find("\"type\":\"task_exit\"") == std::string::npos; });
      }
      if (victim != unanswered_.end()) unanswered_.erase(victim);
    }
  }
  link_->send(std::move(text));
}

void LeaderLink::requeue_unanswered() {
  if (unanswered_.empty()) return;
  std::deque<std::string> again;
  for (auto& [id, text] : unanswered_) {
    if (hooks_.exit_unanswered && text.find("\"task_exit\"") != std::string::npos) {
      try {
        const auto env = wire::parse_envelope(text);
        if (env.is(wire::ControlType::kTaskExit)) hooks_.exit_unanswered(env.body);
      } catch (const std::exception&) {
        // our own text: it parses
      }
    }
    again.push_back(std::move(text));
  }
  spdlog::info("{} task event(s) and exit(s) the leader did not answer before the link was lost are sent again "
               "after the next registration",
               again.size());
  unanswered_.clear();
  outbox_.push_front(again);
}

bool LeaderLink::send_now(std::string text) {
  if (!connected()) return false;
  link_->send(std::move(text));
  return true;
}

void LeaderLink::answer(std::string text) {
  if (link_) link_->send(std::move(text));
}

void LeaderLink::refuse(const wire::Envelope& env, const std::exception& e) {
  spdlog::error("{} failed: {}", env.type, e.what());
  const auto* bad = dynamic_cast<const wire::BodyError*>(&e);
  answer(bad ? wire::make_error(env.id, wire::error_code::kBadRequest, e.what(), bad->field())
             : wire::make_error(env.id, wire::error_code::kInternal, e.what()));
}

// The link to url() failed (`why`): the next candidate at once, or, after the last one,
// the first again after the back-off.
void LeaderLink::next_leader(const std::string& why) {
  if (stopping_) return;
  const std::string tried = url();
  if (!leaders_.advance()) {
    spdlog::warn("leader at {}: {}; trying {}", tried, why, url());
    retry_timer_.expires_after(std::chrono::milliseconds(100));
    retry_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
      if (auto self = w.lock(); self && !ec) self->connect();
    });
    return;
  }
  spdlog::warn("leader at {}: {}; trying {} in {} ms", tried, why, url(), backoff_.count());
  schedule_reconnect();
}

void LeaderLink::connect() {
  if (stopping_) return;
  registered_ = false;
  requeue_unanswered();  // what the last link took and never answered
  try {
    link_ = std::make_shared<control::ControlClient>(
        io_, url(), opt_.agent_token, control::PeerKind::kAgent,
        control::TlsClientOptions{opt_.tls_ca_file, opt_.tls_pinned_cert_file, "tls_ca_file"});
  } catch (const std::exception& e) {
    // A CA file that became unreadable: say so and try again later, tasks running on.
    spdlog::error("cannot set up the connection to the leader at {}: {}", url(), e.what());
    link_.reset();
    return next_leader("no connection set up");
  }
  std::weak_ptr<LeaderLink> w = weak_from_this();
  // Only the current link's messages count: one left (a silent or refused leader) may
  // still deliver what was on its way while it closes.
  link_->on_message = [w, current = link_.get()](const std::string& text) {
    if (auto self = w.lock(); self && self->link_.get() == current) self->on_message(text);
  };
  link_->on_close = [w](const std::string& reason) {
    if (auto self = w.lock()) {
      self->registered_ = false;
      self->hooks_.lost("the connection to the leader was lost (" + reason + ")");
      self->hb_timer_.cancel();
      self->next_leader("lost the connection (" + reason + ")");
    }
  };
  // With several candidates, a paused one (SIGSTOP, a stalled VM) accepts the TCP
  // connection in its kernel and never answers the upgrade: 3 s, not 10, before the next
  // candidate is tried (an upgrade, TLS included, takes milliseconds on a LAN and about a
  // second across continents).
  const auto limit = std::chrono::seconds(opt_.leader_urls.size() > 1 ? 3 : 10);
  link_->connect(limit, [w](std::exception_ptr e) {
    auto self = w.lock();
    if (!self) return;
    if (e) {
      std::string why = "unreachable";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        why = std::string("unreachable: ") + ex.what();
      }
      return self->next_leader(why);
    }
    self->last_heard_ = std::chrono::steady_clock::now();
    self->do_register();
  });
}

void LeaderLink::schedule_reconnect() {
  if (stopping_) return;
  retry_timer_.expires_after(backoff_);
  // With several candidates a new leader may serve any moment: at most 2 s between rounds.
  const auto cap = std::chrono::milliseconds(opt_.leader_urls.size() > 1 ? 2000 : 10000);
  backoff_ = std::min(backoff_ * 2, cap);
  retry_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    if (auto self = w.lock(); self && !ec) self->connect();
  });
}

void LeaderLink::do_register() {
  // A reply to an earlier registration (a link since closed) is never taken for this one.
  const std::string id = "register-" + std::to_string(next_req_++);
  awaiting_.clear();
  awaiting_.emplace(id, [this](const wire::Envelope& env) { on_registration_reply(env); });
  link_->send(wire::make_request(id, wire::ControlType::kRegister, hooks_.registration().to_json()));
}

void LeaderLink::heartbeat() {
  hb_timer_.expires_after(opt_.heartbeat_interval);
  hb_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self || ec || !self->registered_) return;
    // A leader that stopped answering (its process paused, its machine gone without a
    // FIN) is left after heartbeat_timeout rather than the session's idle timeout.
    const auto silent = std::chrono::steady_clock::now() - self->last_heard_;
    if (silent > self->opt_.heartbeat_timeout) {
      self->registered_ = false;
      self->link_->close();
      self->hooks_.lost("the leader stopped answering");
      return self->next_leader(
          "no answer for " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
          " ms");
    }
    nlohmann::json body{{"running_tasks", self->hooks_.running_tasks()}};
    if (self->hooks_.heartbeat_extra) body.update(self->hooks_.heartbeat_extra());
    self->link_->send(wire::make_request("a" + std::to_string(self->next_req_++), wire::ControlType::kHeartbeat, body));
    self->heartbeat();
  });
}

void LeaderLink::on_message(const std::string& text) {
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const ProtocolError& e) {
    spdlog::warn("bad message from the leader: {}", e.what());
    return;
  }
  last_heard_ = std::chrono::steady_clock::now();
  if (env.is(wire::ControlType::kReply)) {
    // Answered (taken, or refused for good): not sent again. A leader whose term may be
    // over answers everything `unavailable`: that one goes to the next leader instead,
    // with the rest, when this link closes.
    const auto done = std::find_if(unanswered_.begin(), unanswered_.end(), [&](const auto& m) { return m.first == env.id; });
    if (done != unanswered_.end()) {
      if (!env.ok && env.error.value("code", std::string()) == wire::error_code::kUnavailable) return;
      unanswered_.erase(done);
      if (env.ok) return;
    }
    if (auto waiting = awaiting_.extract(env.id)) {
      waiting.mapped()(env);
    } else if (hooks_.other_reply && hooks_.other_reply(env)) {
      // taken by the agent (a window of a model file)
    } else if (!env.ok) {
      spdlog::warn("the leader answered an error: {}", env.error.dump());
    }
    return;
  }
  if (const auto why = leaders_.order(env.term)) {
    spdlog::error("refused {} {} from the leader at {}: {}", env.type, env.id, url(), *why);
    answer(wire::make_error(env.id, wire::error_code::kConflict, *why, "term"));
    return;
  }
  try {
    if (!orders_.dispatch(env)) {
      answer(wire::make_error(env.id, wire::error_code::kBadRequest, "unknown type \"" + env.type + "\"", "type"));
    }
  } catch (const std::exception& e) {
    refuse(env, e);
  }
}

// The leader's answer to this agent's registration.
void LeaderLink::on_registration_reply(const wire::Envelope& env) {
  if (!env.ok) {
    spdlog::error("the leader at {} refused registration: {}", url(), env.error.value("message", "?"));
    link_->close();
    return next_leader("registration refused");
  }
  const std::int64_t term = env.body.value("term", std::int64_t{0});
  if (const auto why = leaders_.registered(term)) {
    // A deposed leader that has not noticed yet: nothing from it is taken.
    spdlog::error("refusing the leader at {} ({}): {} (after etcd was recreated from scratch, its terms start "
                  "again: restart this agent)",
                  url(), env.body.value("leader", "?"), *why);
    link_->close();
    return next_leader("a leader of an older term");
  }
  registered_ = true;
  backoff_ = std::chrono::milliseconds(500);
  spdlog::info("registered with the leader {} at {} as {} ({} cores){}", env.body.value("leader", "?"), url(),
               opt_.name, opt_.cores, term > 0 ? ", term " + std::to_string(term) : "");
  for (auto& m : outbox_.take_all()) {
    std::string id, type;
    try {
      const auto head = json::parse(m);
      id = head.value("id", "");
      type = head.value("type", "");
    } catch (const json::exception&) {
    }
    send_tracked(id, type, std::move(m));
  }
  heartbeat();
  const bool first = !ever_registered_;
  ever_registered_ = true;
  hooks_.registered(first);
  probe_link();
}

void LeaderLink::probe_link() {
  if (opt_.link_probe_bytes <= 0 || probing_) return;
  probing_ = true;
  // Agents started together register together: a random start within a second keeps
  // their probes from sharing the leader's link (a 3 MiB probe takes 25 ms at 1 Gbit/s).
  static thread_local std::mt19937 rng{std::random_device{}()};
  probe_timer_.expires_after(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 1000)(rng)));
  probe_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    if (auto self = w.lock()) {
      if (ec || !self->connected()) {
        self->probing_ = false;
        return;
      }
      self->measure();
    }
  });
}

void LeaderLink::measure() {
  const std::string leader = url();
  try {
    control::measure_link(io_, leader, opt_.agent_token,
                          control::TlsClientOptions{opt_.tls_ca_file, opt_.tls_pinned_cert_file, "tls_ca_file"},
                          opt_.link_probe_bytes, std::chrono::seconds(10),
                          [w = weak_from_this(), leader](const control::LinkMeasurement* m, const std::string& error) {
                            auto self = w.lock();
                            if (!self) return;
                            self->probing_ = false;
                            if (m == nullptr) {
                              spdlog::warn("{} (the planner counts on the other agents' links)", error);
                              return;
                            }
                            spdlog::info("link to the leader {}: {:.0f} Mbit/s ({} KiB in {:.1f} ms, set-up and answer {:.2f} ms)",
                                         leader, m->bytes_per_sec * 8 / 1e6, m->bytes / 1024, m->seconds * 1e3,
                                         m->rtt_seconds * 1e3);
                            // To the leader it measured. After a failover during the probe the new
                            // leader's registration found it running: measure that leader now.
                            if (self->url() != leader) return self->probe_link();
                            self->send(wire::ControlType::kLinkReport,
                                       {{"bytes_per_sec", m->bytes_per_sec}, {"rtt_seconds", m->rtt_seconds}}, true);
                          });
  } catch (const std::exception& e) {
    probing_ = false;
    spdlog::warn("link probe: {}", e.what());
  }
}

}  // namespace dltrain::agent
