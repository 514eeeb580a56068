// `dltrain logs`: the leader relays a client's request for a window of a task's log to
// the agent that runs (or ran) it, and the agent's answer back. Agents keep the logs;
// the leader keeps nothing but the request in flight.
#include "leader/leader_impl.h"

namespace dltrain::leader {

namespace {

// How long the leader waits for an agent's read_log reply before answering the client.
constexpr std::chrono::seconds kLogReplyTimeout{10};

}  // namespace

void Leader::Impl::on_logs(const SessionPtr& s, const wire::Envelope& env) {
  auto b = wire::parse_body<wire::LogRequestBody>(env);
  const auto jit = jobs.find(b.job);
  if (jit == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + b.job + "\"", "job");
  JobRec& j = jit->second;
  const TaskRec* t = j.find_task(b.task);
  if (t == nullptr) {
    std::string names;
    for (const auto& x : j.tasks) names += (names.empty() ? "" : ", ") + x.name;
    return reply_error(s, env.id, wire::error_code::kNotFound,
                       j.id + " has no task \"" + b.task + "\"" + (names.empty() ? "" : " (its tasks: " + names + ")"),
                       "task");
  }
  if (t->agent.empty()) {
    return reply_error(s, env.id, wire::error_code::kNotFound, b.task + " of " + j.id + " has not been placed yet",
                       "task");
  }
  const auto a = agents.find(t->agent);
  const auto session = a == agents.end() || a->second.lost ? nullptr : a->second.session.lock();
  if (!session) {
    return reply_error(s, env.id, wire::error_code::kUnavailable,
                       "agent " + t->agent + ", which keeps the log of " + b.task + ", is not connected");
  }
  b.generation = j.generation;
  const std::string id = "log-" + std::to_string(next_req++);
  if (!order(session, id, wire::ControlType::kReadLog, b.to_json())) {
    return reply_error(s, env.id, wire::error_code::kUnavailable, "this leader no longer serves: ask the serving one");
  }
  pending_logs[id] = PendingLog{s, env.id, t->agent, t->state != TaskState::kExited, Clock::now() + kLogReplyTimeout};
}

bool Leader::Impl::on_log_reply(const wire::Envelope& env) {
  const auto it = pending_logs.find(env.id);
  if (it == pending_logs.end()) return false;
  const PendingLog p = it->second;
  pending_logs.erase(it);
  const auto client = p.client.lock();
  if (!client) return true;  // the client went away
  if (!env.ok) {
    reply_error(client, p.client_id, env.error.value("code", std::string(wire::error_code::kInternal)),
                "agent " + p.agent + ": " + env.error.value("message", std::string("?")),
                env.error.value("field", std::string()));
    return true;
  }
  json body = env.body;
  body["agent"] = p.agent;
  // The agent knows whether the process runs; the leader whether the task will run
  // again (a restart pending is a running task to both).
  body["running"] = p.running && body.value("running", false);
  reply(client, p.client_id, body);
  return true;
}

void Leader::Impl::expire_log_requests() {
  const auto now = Clock::now();
  for (auto it = pending_logs.begin(); it != pending_logs.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    if (auto client = it->second.client.lock()) {
      reply_error(client, it->second.client_id, wire::error_code::kUnavailable,
                  "agent " + it->second.agent + " did not answer for the log within " +
                      std::to_string(kLogReplyTimeout.count()) + " s");
    }
    it = pending_logs.erase(it);
  }
}

}  // namespace dltrain::leader
