#include "leader/log_relay.h"

namespace dltrain::leader {

void LogRelay::expect(const std::string& id, const std::string& agent, bool running, Client client,
                      Clock::time_point now) {
  pending_[id] = Pending{agent, running, now + kReplyTimeout, std::move(client)};
}

bool LogRelay::on_reply(const wire::Envelope& env) {
  const auto it = pending_.find(env.id);
  if (it == pending_.end()) return false;
  const Pending p = std::move(it->second);
  pending_.erase(it);
  if (!env.ok) {
    p.client.error(env.error.value("code", std::string(wire::error_code::kInternal)),
                   "agent " + p.agent + ": " + env.error.value("message", std::string("?")),
                   env.error.value("field", std::string()));
    return true;
  }
  nlohmann::json body = env.body;
  body["agent"] = p.agent;
  // The agent knows whether the process runs; the leader whether the task will run
  // again (a restart pending is a running task to both).
  body["running"] = p.running && body.value("running", false);
  p.client.reply(body);
  return true;
}

void LogRelay::expire(Clock::time_point now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    it->second.client.error(wire::error_code::kUnavailable,
                            "agent " + it->second.agent + " did not answer for the log within " +
                                std::to_string(kReplyTimeout.count()) + " s",
                            "");
    it = pending_.erase(it);
  }
}

}  // namespace dltrain::leader
