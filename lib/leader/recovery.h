// The leader's recovery, a part of its own: what happens when tasks are lost (a lost
// agent, a task that stopped with its agent), the re-assignment of a job as its next
// generation (stop, place again, start with the freshest state), and a leader restart
// (restore from the store, adopt the tasks the agents re-report). It owns each job's
// JobRecovery (job_record.h) and acts on the rest through two narrow interfaces: the
// agent registry (placement.h) for cores, GPUs and orphans, and JobActions for the job
// state machine and the orders to agents. Unit-tested without sockets
// (tests/unit/recovery_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "leader/job_record.h"
#include "leader/job_table.h"
#include "leader/placement.h"
#include "store/store.h"
#include "wire/control_bodies.h"
#include "wire/leader_events.h"

namespace dltrain::leader {

/// What recovery asks of the rest of the leader. Leader::Impl implements it; every call
/// runs on the leader's io thread.
class JobActions {
 public:
  virtual ~JobActions() = default;
  /// The job state machine (leader/states.h): an illegal transition throws
  /// IllegalTransition and leaves the job as it was.
  virtual void set_state(JobRec& j, JobState state) = 0;
  virtual void set_task_state(const JobRec& j, TaskRec& t, TaskState state) = 0;
  /// Appends `ev` (a wire/task_events.h event) to j's event log and sends it to its
  /// followers.
  virtual void publish(JobRec& j, const nlohmann::json& ev) = 0;
  /// Appends `ev` to j's event log only.
  virtual void log_event(const JobRec& j, const nlohmann::json& ev) = 0;
  /// Asks every task of `j` that still runs to stop (on SIGTERM a PS shard writes its
  /// checkpoint, a worker its replica) and gives up the ones not started yet.
  virtual void send_stops(JobRec& j) = 0;
  /// Starts pending task `t` of `j` on its agent with `body` (the rest of it filled in).
  virtual void start_task(JobRec& j, TaskRec& t, wire::StartTaskBody body) = 0;
  /// Fails `j` with `why`: its tasks are stopped and it ends once they all have.
  virtual void fail_job(JobRec& j, const std::string& why) = 0;
  /// Stops every task of an ending job; it ends once they all have.
  virtual void stop_tasks(JobRec& j) = 0;
  /// Fails `j`, which has no tasks, at once with `why` (it ends now).
  virtual void fail_unplaced(JobRec& j, const std::string& why) = 0;
  /// Moves `j` into its terminal target (JobLifecycle::target) once every task has exited.
  virtual void maybe_finish(JobRec& j) = 0;
  /// Puts `j` at the back of the queue.
  virtual void enqueue(JobRec& j) = 0;
  /// Writes j's record to the store.
  virtual void save(const JobRec& j) = 0;
  /// What task `t` of `j` holds on its agent.
  virtual TaskHold hold_of(const JobRec& j, const TaskRec& t) const = 0;
};

/// The bounds recovery works within (from config::AgentOptions).
struct RecoveryOptions {
  int max_reassignments = 3;                       ///< task_max_restarts: re-assignments per job
  std::chrono::milliseconds task_stop_grace{10000};  ///< a stopped task's SIGTERM → SIGKILL delay
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds reassign_timeout{300000};  ///< how long a lost task may wait for a place
};

/// Lost tasks, re-assignment and adoption. Not thread-safe: every member runs on the
/// leader's io thread. Holds references to `agents` and `actions`, which outlive it.
class Recovery {
 public:
  using Clock = std::chrono::steady_clock;

  Recovery(const RecoveryOptions& opt, AgentRegistry& agents, JobActions& actions)
      : opt_(opt), agents_(agents), actions_(actions) {}

  /// Reads every stored job back after a leader restart. Unfinished jobs carry on:
  /// queued ones are queued again; a job with tasks waits up to adoption_window() for
  /// its agents to re-report them (agent_back), and what does not come back by then is
  /// lost with its agent (after_adoption); an exploring job whose exploration runs are
  /// gone fails. A record that cannot be read is skipped (logged); a job whose stored
  /// state cannot be read is failed with the reason. Throws StoreError only when the
  /// store itself cannot be read. `jobs` is the leader's table, empty before: each job is
  /// added as it is read (JobTable::restore), since the actions restore() calls may look
  /// jobs up there; its counter ends past every stored job and the stored counter.
  void restore(const store::Store& db, JobTable& jobs);

  /// How long a restarted leader waits for the agents of a running job: an agent notices
  /// the lost link within a heartbeat timeout and retries with back-off of at most 10 s
  /// (agent.h).
  std::chrono::milliseconds adoption_window() const { return opt_.heartbeat_timeout + std::chrono::milliseconds(15000); }

  /// Tasks of `j` were lost (already marked exited): re-assigns the job as its next
  /// generation, within max_reassignments, or fails it.
  /// An elastic job that lost only workers other than rank 0 and keeps at least its
  /// min_workers goes on without them (docs/training.md, "Elastic jobs"): they are
  /// removed, the job's size follows, a "resized" event says `why`. False (nothing
  /// changed) otherwise: the caller re-assigns the job (tasks_lost).
  bool shrink_elastic(JobRec& j, const std::vector<std::string>& lost, const std::string& why);
  void tasks_lost(JobRec& j, const std::string& why);
  /// Agent `id` is lost: every unfinished task there exits ("lost with its agent"), its
  /// hold is released, and each job hit goes to tasks_lost. `jobs`: the leader's jobs in
  /// submission order. No-op for an unknown or already lost agent.
  void agent_lost(const std::string& id, const std::string& why, const std::vector<JobRec*>& jobs);
  /// Task(s) of `j` that the agent no longer had when it registered again (`why`): noted
  /// for the adoption when `j` is being adopted, else lost (tasks_lost).
  void tasks_gone(JobRec& j, const std::string& why);
  /// An agent registered: a job being adopted whose agents are all back is adopted now.
  void agent_back(JobRec& j);
  /// The periodic check (every heartbeat interval) and after any change of the cluster:
  /// ends an adoption window that has passed and resumes a recovering job that can.
  void tick(JobRec& j, Clock::time_point now);
  /// A recovering job starts again once every old task has stopped and every task that
  /// must run again has a place; it waits up to reassign_timeout for one, then fails.
  void try_resume(JobRec& j);
  /// Is `j` a restored job whose agents the leader still waits for?
  static bool adopting(const JobRec& j) { return j.recovery.adopt_until.has_value(); }
  /// Worker `t` of running `j` has started. True when it was the seed of a re-assignment
  /// (its replica has now initialised the rebuilt shards): the seed is cleared and the
  /// caller starts the other workers.
  static bool seed_started(JobRec& j, const TaskRec& t);

 private:
  void resume_after_restart(JobRec& j, const nlohmann::json& r);
  /// Starts generation g+1 of recovering `j` on `placement` (an agent per task, "" for
  /// finished workers); `gpus[i]`: the GPU indices task i is given there.
  void resume(JobRec& j, const std::vector<std::string>& placement, const std::vector<std::vector<int>>& gpus);
  void after_adoption(JobRec& j);

  RecoveryOptions opt_;
  AgentRegistry& agents_;
  JobActions& actions_;
};

}  // namespace dltrain::leader
