// TaskTable (agent/task_table.h): an agent's tasks, their restarts, the exits still to
// report and the ended tasks' metrics.
#include "agent/task_table.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/overloaded.h"

namespace dltrain::agent {

void Task::on_event(const wire::events::TaskEvent& ev) {
  std::visit(Overloaded{[&](const wire::events::Listening& l) { port = l.port; },
                        [&](const wire::events::EpochEnd& e) { epochs_done = std::max(epochs_done, e.epoch); },
                        [&](const wire::events::TaskError& err) {
                          last_error = err.message;
                          last_cause = err.cause.value_or("");
                        },
                        [](const auto&) {}},
             ev);
  metrics.on_event(ev);
}

Task* TaskTable::find(const std::string& key) {
  const auto it = tasks_.find(key);
  return it == tasks_.end() ? nullptr : &it->second;
}

void TaskTable::add(Task t) {
  const std::string k = key(t.job, t.name);
  tasks_[k] = std::move(t);
}

// A task that dies is started again (bounded, with back-off). A worker reconnects,
// takes the PS's current parameters and resumes after the last epoch it finished; a PS
// shard listens on the port it had (so the workers' endpoint lists stay valid), loads
// its latest checkpoint, and the workers reconnect and resync with a dense pull.
std::optional<RestartPlan> TaskTable::plan_restart(Task& t, const ExitStatus& st, bool shutting_down,
                                                   int max_restarts) {
  if (shutting_down || t.stop_requested || (st.exit_code == 0 && st.signal == 0) || t.restarts >= max_restarts) {
    return std::nullopt;
  }
  // A configuration error (a worker whose LibTorch has no CUDA, a data set that does not
  // parse) fails the same way every time: its message goes to the leader at once.
  if (st.exit_code == kConfigErrorExit && st.signal == 0) {
    spdlog::warn("{} {}: a configuration error, not restarted", key(t.job, t.name), st.describe());
    return std::nullopt;
  }
  ++t.restarts;
  ++restarts_;
  return RestartPlan{t.restarts, std::chrono::milliseconds(500) * (1 << std::min(t.restarts - 1, 6))};
}

std::optional<Task> TaskTable::end(const std::string& key, double now_unix) {
  const auto it = tasks_.find(key);
  if (it == tasks_.end()) return std::nullopt;
  Task t = std::move(it->second);
  tasks_.erase(it);
  t.metrics.running = false;
  t.metrics.ended_unix = now_unix;
  ended_.push_back(t.metrics);
  prune_ended(now_unix);
  return t;
}

std::vector<wire::ReportedTask> TaskTable::registered() const {
  std::vector<wire::ReportedTask> out;
  for (const auto& [k, t] : tasks_) out.push_back({{}, t.job, t.name, t.generation, false, t.launch.threads, t.launch.gpus});
  for (const auto& [k, g] : exits_pending_) {
    const auto slash = k.find('/');
    out.push_back({{}, k.substr(0, slash), k.substr(slash + 1), g, true, 0, {}});
  }
  return out;
}

void TaskTable::prune_ended(double now_unix) {
  while (!ended_.empty() &&
         (ended_.size() > kEndedRetainMax || now_unix - ended_.front().ended_unix > kEndedRetainSeconds)) {
    ended_.pop_front();
  }
}

void TaskTable::add_metrics(control::MetricsBuilder& out, AgentFigures& a, const std::string& agent, double now_unix) {
  prune_ended(now_unix);
  a.task_restarts = restarts_;
  for (const auto& [k, t] : tasks_) {
    a.cores_used += t.launch.threads;
    a.gpus_used += static_cast<int>(t.launch.gpus.size());
    (t.kind == wire::TaskKind::kWorker ? a.workers_running : a.ps_running) += 1;
  }
  add_agent_metrics(out, a);
  for (const auto& [k, t] : tasks_) t.metrics.add_to(out, agent, now_unix);
  for (const auto& m : ended_) m.add_to(out, agent, now_unix);
}

}  // namespace dltrain::agent
