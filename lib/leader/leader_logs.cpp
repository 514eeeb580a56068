// `dltrain logs`: the client's request checked against the job and its task, then handed
// to the log relay (log_relay.h) on its way to the agent that keeps the log.
#include "leader/leader_impl.h"

namespace dltrain::leader {

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
  std::weak_ptr<control::Session> client = s;
  const std::string client_id = env.id;
  LogRelay::Client answer{
      [this, client, client_id](const json& body) {
        if (auto c = client.lock()) reply(c, client_id, body);
      },
      [this, client, client_id](const std::string& code, const std::string& message, const std::string& field) {
        if (auto c = client.lock()) reply_error(c, client_id, code, message, field);
      }};
  log_relay.expect(id, t->agent, t->state != TaskState::kExited, std::move(answer), Clock::now());
}

}  // namespace dltrain::leader
