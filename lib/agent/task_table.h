// The tasks an agent runs (private to lib/agent/): each task's process, files, restarts
// and what its events said; the exits still to be reported to a leader that is away; the
// metrics of tasks that ended, kept a while for the scrapers. It decides whether a task
// that died is started again and when (the back-off), and what a registration lists; the
// agent starts and stops the processes and talks to the leader. Not thread-safe: the
// agent's io thread owns it. Unit-tested in tests/unit/task_table_test.cpp.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "agent/supervisor.h"
#include "agent/task_launch.h"
#include "agent/task_metrics.h"
#include "wire/control_bodies.h"
#include "wire/task_event.h"

namespace dltrain::agent {

/// One task this agent runs: "job/task" is its key in the table.
struct Task {
  std::string job, name;
  std::uint32_t generation = 0;
  pid_t pid = -1;  ///< -1 while waiting to restart
  std::string last_error;  ///< what its last error event or log line said
  std::string last_cause;  ///< the cause its last error event named, if any
  std::optional<std::uint64_t> oom_kills_at_start;  ///< the cgroup's count when it (re)started
  wire::TaskKind kind = wire::TaskKind::kWorker;
  TaskLaunch launch;  ///< its files and command line, to start it again
  int restarts = 0;
  int epochs_done = 0;  ///< worker: from its epoch_end events, where a restart resumes
  int port = 0;         ///< PS shard: from its listening event, where a restart listens
  bool stop_requested = false;
  std::shared_ptr<boost::asio::steady_timer> restart_timer;  ///< set while waiting to restart
  TaskMetrics metrics;  ///< what its events said, for the metrics endpoint

  /// Takes what a parsed event of this task says: a shard's port, a worker's finished
  /// epochs (never fewer), its last error and cause; and into its metrics.
  void on_event(const wire::events::TaskEvent& ev);
};

/// When a task that died is started again: its attempt number and delay.
struct RestartPlan {
  int attempt = 0;  ///< 1 for the first restart
  std::chrono::milliseconds delay{0};
};

/// The tasks of one agent, and the exits and metrics of those that ended.
class TaskTable {
 public:
  /// How long, and how many, ended tasks' metrics stay on the endpoint: long enough for a
  /// scraper to see their final values, bounded so that a long-lived agent's endpoint
  /// does not grow with every job it ever ran.
  static constexpr double kEndedRetainSeconds = 600;
  static constexpr std::size_t kEndedRetainMax = 64;
  /// The exit code of a task that found its configuration wrong (daemon/worker_main.cpp,
  /// daemon/ps_main.cpp): it is not restarted.
  static constexpr int kConfigErrorExit = 2;

  /// The key of task `task` of job `job`.
  static std::string key(const std::string& job, const std::string& task) { return job + "/" + task; }

  /// The task with key `key` ("job/task"), or null when this agent runs none; valid until
  /// the task is added again or ended.
  Task* find(const std::string& key);
  bool contains(const std::string& key) const { return tasks_.count(key) != 0; }
  bool empty() const { return tasks_.empty(); }
  /// Tasks running or waiting to restart.
  std::size_t size() const { return tasks_.size(); }
  /// The tasks by key, as a std::map.
  std::map<std::string, Task>::iterator begin() { return tasks_.begin(); }
  std::map<std::string, Task>::iterator end() { return tasks_.end(); }
  std::map<std::string, Task>::const_iterator begin() const { return tasks_.begin(); }
  std::map<std::string, Task>::const_iterator end() const { return tasks_.end(); }
  /// Adds started task `t` (replacing one with its key).
  void add(Task t);

  /// Whether task `t`, which exited with `st`, is started again, and when: not after a
  /// clean exit, a stop asked for, the agent shutting down (`shutting_down`), a
  /// configuration error (kConfigErrorExit; logged, it fails the same way every time) or
  /// `max_restarts` restarts; otherwise after
  /// 0.5 s doubling with each restart up to 32 s. A restart is counted (on `t` and in
  /// restarts()).
  std::optional<RestartPlan> plan_restart(Task& t, const ExitStatus& st, bool shutting_down, int max_restarts);
  /// Restarts planned by this agent so far.
  std::uint64_t restarts() const { return restarts_; }

  /// Removes task `key` for good at `now_unix`: its metrics stay with the ended ones.
  /// Returns the task as it was; nullopt when there is none.
  std::optional<Task> end(const std::string& key, double now_unix);
  /// An ended task's exit that the leader has not received yet (it was away).
  void exit_pending(const std::string& key, std::uint32_t generation) { exits_pending_[key] = generation; }
  /// The leader took the exits: a registration lists them no more.
  void exits_delivered() { exits_pending_.clear(); }
  /// What a registration says of this agent's tasks: those it runs, and those whose exit
  /// is still on its way (the leader waits for those exits instead of taking the tasks
  /// for lost).
  std::vector<wire::ReportedTask> registered() const;

  /// Adds the running and the recently ended tasks' metrics to `out` (ended ones older
  /// than kEndedRetainSeconds, or beyond kEndedRetainMax, are dropped first), and the
  /// cores, GPUs and tasks in use to `a`.
  void add_metrics(control::MetricsBuilder& out, AgentFigures& a, const std::string& agent, double now_unix);

 private:
  void prune_ended(double now_unix);

  std::map<std::string, Task> tasks_;  // by key
  std::map<std::string, std::uint32_t> exits_pending_;  // key → generation
  std::deque<TaskMetrics> ended_;  // of tasks that exited for good, oldest first
  std::uint64_t restarts_ = 0;
};

}  // namespace dltrain::agent
