// The leader's core (private to lib/leader/): the parts it is wired from and the code that
// needs more than one of them. One struct, one event loop, four files:
//   leader.cpp           the job's life (launch, finish, fail, cancel, retire), plumbing
//   leader_queue.cpp     the queue: a job's needs, why it waits, admission, expiry
//   leader_agents.cpp    the agent protocol: registration, heartbeats, task events and exits
//   leader_clients.cpp   the client protocol: submit, plan, status, cancel, follow, logs, ...
//                        and the planner's answers applied (decide, explore)
// The parts own their state (unit-tested without sockets: tests/unit/job_table_test,
// states_test, placement_test, scheduler_test, recovery_test, planning_test,
// model_collection_test, log_relay_test, leader_metrics_test; the dashboard's requests
// through the leader's control tests): the job table
// (job_table.h) and the records (job_record.h), each job's lifecycle (states.h), the
// agents and placement (placement.h), the queue and its admission rule (scheduler.h),
// recovery (recovery.h: lost tasks, re-assignment, restore, adoption; it acts on the rest
// through JobActions, implemented here), the planner's adapter (planning.h), the trained
// models (model_collection.h), the log relay (log_relay.h), the dashboard's curves
// (dashboard.h) and the metrics (metrics.h). Members without a comment here have theirs
// at their definition. All of them run on the leader's io thread; none is thread-safe,
// none needs to be.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/audit.h"
#include "leader/job_record.h"
#include "leader/dashboard.h"
#include "leader/job_table.h"
#include "leader/log_relay.h"
#include "leader/metrics.h"
#include "leader/model_collection.h"
#include "leader/persist.h"
#include "leader/leader.h"
#include "leader/placement.h"
#include "leader/planning.h"
#include "leader/recovery.h"
#include "leader/scheduler.h"
#include "leader/shared_plan.h"
#include "control/metrics_server.h"
#include "control/server.h"
#include "planner/planner.h"
#include "store/store.h"
#include "wire/control.h"
#include "wire/control_bodies.h"
#include "wire/leader_events.h"
#include "wire/task_events.h"

namespace dltrain::leader {

struct Leader::Impl : std::enable_shared_from_this<Leader::Impl>, JobActions {
  using json = nlohmann::json;
  using Clock = std::chrono::steady_clock;
  using SessionPtr = std::shared_ptr<control::Session>;

  boost::asio::io_context& io;
  config::AgentOptions opt;
  std::unique_ptr<control::ControlServer> server;
  boost::asio::steady_timer hb_timer;
  AgentRegistry agents;
  std::map<std::uint64_t, std::string> agent_by_session;
  JobTable jobs;  ///< every job by id, in submission order, and their numbering (job_table.h)
  Scheduler queue;  ///< the jobs waiting for cores and GPUs, and admission (scheduler.h)
  Recovery recovery;  ///< lost tasks, re-assignment, restore, adoption (recovery.h)
  std::uint64_t next_req = 1;
  std::function<void()> on_registered;  ///< Leader::set_on_agent_registered
  std::unique_ptr<store::Store> db;
  /// The term it serves and how it knows it still does (leader.h; a single leader: term 0).
  LeaderTerm ha;
  double started_unix = 0;  ///< when this leader started serving, seconds since the epoch
  LeaderCounters counters;  ///< cumulative counts for the metrics (metrics.h)
  LogRelay log_relay;  ///< the logs requests waiting for their agent's read_log reply
  /// The handlers of what clients and agents may send, by message type (wire/control.h);
  /// a type without one gets "unknown message type".
  wire::Dispatcher<const SessionPtr&> client_api, agent_api;

  /// The trained models: collected, kept, served; the clients' uploads (model_collection.h).
  ModelCollection models;
  /// The adapter to the planner (planning.h).
  Planning planning;

  Impl(boost::asio::io_context& i, const config::AgentOptions& o, LeaderTerm t)
      : io(i),
        opt(o),
        hb_timer(i),
        recovery(recovery_options(o), agents, *this),
        ha(std::move(t)),
        models(jobs, agents,
               {[this](const SessionPtr& s, const std::string& id, wire::ControlType type, const json& body) {
                  return order(s, id, type, body);
                },
                [this](JobRec& j) { maybe_finish(j); },
                [this] { return standbys(); }}),
        planning(agents, opt) {
    add_client_handlers();
    add_agent_handlers();
  }
  /// Recovery's bounds from the agent's options (task_max_restarts bounds re-assignments).
  static RecoveryOptions recovery_options(const config::AgentOptions& o) {
    return {o.task_max_restarts, o.task_stop_grace, o.heartbeat_timeout, o.reassign_timeout};
  }

  // ------------------------------------------------------------ leader.cpp
  /// persist_or_log (persist.h) when the leader has a store: losing a history row must
  /// not stop running jobs.
  template <typename F>
  void persist(const char* what, F&& f) {
    if (db) persist_or_log(what, std::forward<F>(f));
  }
  void save(const JobRec& j) override;
  void event(const JobRec& j, const json& ev);
  void notify(JobRec& job, json body);
  /// event() and notify().
  void publish(JobRec& j, const json& ev) override;
  void log_event(const JobRec& j, const json& ev) override { event(j, ev); }
  void send_agent(const std::string& agent_id, wire::ControlType type, const json& body);
  /// True while this leader may act (leader.h LeaderTerm::serving; a single leader: always).
  bool serving() const { return !ha.serving || ha.serving(); }
  /// The one way an order (a request) reaches an agent: with this leader's term, and
  /// only while it serves; false (logged) when it was held back because the term may be
  /// over (docs/ha.md "Fencing").
  bool order(const SessionPtr& s, const std::string& id, wire::ControlType type, const json& body);
  /// Who leads, for `status` and `agents`: this leader's name, term, since when, and the
  /// election's candidates ({"ha": false} fields only for a single leader).
  json leader_json() const;
  /// The names of the leader candidates standing by, as the election last read them
  /// (docs/ha.md "Artifacts"); none for a single leader.
  std::vector<std::string> standbys() const;
  /// Sends a reply (and completes the request's audit line, when it has one).
  void reply(const SessionPtr& s, const std::string& id, const json& body);
  /// Sends an error reply and counts it (dltrain_leader_control_errors_total).
  void reply_error(const SessionPtr& s, const std::string& id, const std::string& code, const std::string& msg,
                   const std::string& field = "");
  /// `j` as clients see it, with its place in the queue when queued.
  json status_json(const JobRec& j) const;
  /// The one way a live job changes state (JobLifecycle::move_to): tells followers, the
  /// event log and the store. Throws IllegalTransition, naming the job, for a transition
  /// leader/states.h does not allow (the job stays as it was).
  void set_state(JobRec& j, JobState state) override;
  /// A live job starts to end: `target` (terminal) once its tasks have stopped, `via`
  /// (failing, finishing, cancelling) until then; announced as set_state does.
  void head_for(JobRec& j, JobState target, JobState via);
  /// Tells followers, the event log and the store that `j` moved from `from`.
  void announce_state(JobRec& j, JobState from);
  /// The one way a live task of `j` changes state: staying in a state is no change; a
  /// transition that leader/states.h does not allow is refused and logged.
  void set_task_state(const JobRec& j, TaskRec& t, TaskState state) override;
  /// Puts `j` at the back of the queue (state queued is set by the caller).
  void enqueue(JobRec& j) override;
  /// Where queued `j` stands (position, cores needed / free / in the cluster).
  QueueStatus queue_status(const JobRec& j) const;
  /// How long `j` may stay queued: its queue_timeout, else the leader's; 0 = for ever.
  std::chrono::milliseconds queue_timeout(const JobRec& j) const;
  /// The "waiting" event of queued `j`, with "job".
  json waiting_event(const JobRec& j) const;
  /// Tells each queued job's followers what it waits for, when that changed.
  void notify_waiting();
  /// Fails the queued jobs that waited longer than their queue timeout.
  void expire_queued();
  void try_schedule();
  void schedule_pass();
  /// Why a cuda job cannot run on this cluster even when idle (too few GPUs on any agent,
  /// or in all), with the numbers; nullopt for a CPU job or one that fits.
  std::optional<std::string> gpu_refusal(const JobSpec& spec) const;
  /// While this leader waits for the agents of the running jobs it restored to register
  /// again (Recovery::adopting), the capacity it knows is not the cluster's: a sentence
  /// saying so, naming the agents still missing and the time left (when to retry);
  /// nullopt otherwise. A submit then gets it with its warning, and a refusal that lack
  /// of capacity caused is answered `unavailable` (retryable) with it.
  std::optional<std::string> reregistering();
  /// What `j`'s tasks need, in JobRec::tasks order (PS shards, then workers).
  std::vector<TaskNeed> needs(const JobRec& j) const;
  /// What task `t` of `j` holds on its agent: the job's cores per task and t's GPUs.
  TaskHold hold_of(const JobRec& j, const TaskRec& t) const override;
  /// Each live agent's cached shards (AgentRec::cached_shards), by agent id.
  std::map<std::string, const std::set<std::string>*> cached_shard_sets() const;
  /// Worker `t`'s local group: the workers of `j` on its agent that have not finished.
  wire::LocalGroupInfo local_group_of(const JobRec& j, const TaskRec& t) const;
  /// Starts `j` where the scheduler placed it (`placement`, one per task of needs(j)), with
  /// ps_shards = "auto" the shards it added beside the workers (`added_shards`), whose
  /// count becomes the job's.
  void launch(JobRec& j, std::vector<Placed> placement, const std::vector<std::string>& added_shards);
  /// ps_shards = "auto": what spread_shards needs of `j` (its model's partitions bound the
  /// shards: a TorchScript model, whose partitions the leader cannot count, keeps one);
  /// nullopt for a job with a fixed ps_shards.
  std::optional<ShardSpread> shard_spread(const JobRec& j) const;
  void start_task(JobRec& j, TaskRec& t, wire::StartTaskBody body) override;
  std::vector<std::string> ps_endpoints(const JobRec& j) const;
  void start_worker(JobRec& j, TaskRec& t);
  void start_workers(JobRec& j);
  void send_stops(JobRec& j) override;
  void stop_tasks(JobRec& j) override;
  void maybe_finish(JobRec& j) override;
  void fail_job(JobRec& j, const std::string& why) override;
  /// Fails `j`, which has no tasks, at once with `why` (JobActions).
  void fail_unplaced(JobRec& j, const std::string& why) override;
  /// Every worker of `j` finished: stops its shards; it succeeds once they have.
  void succeed_job(JobRec& j);
  /// Cancels `j` (no-op once it has ended); see its definition for each state.
  void cancel_job(JobRec& j);
  void on_message(const SessionPtr& s, const std::string& text);
  void on_close(const SessionPtr& s);
  void check_heartbeats();

  /// Removes the finished jobs beyond the opt.job_retention most recently ended ones
  /// (JobTable::beyond_retention), from memory and from the store (record and events);
  /// nothing while the store is read-only. Called from the event loop after a job ends,
  /// and after restore().
  void retire_jobs();
  bool retire_posted = false;  ///< a retire_jobs() is posted to the event loop

  // ------------------------------------------------------------ leader_agents.cpp
  void add_agent_handlers();
  /// Runs `f`, the work of an agent's message that was already answered: a refused
  /// transition (IllegalTransition, a leader bug) is logged naming `what`, not answered a
  /// second time.
  template <typename F>
  void after_reply(const char* what, F&& f) {
    try {
      f();
    } catch (const IllegalTransition& e) {
      spdlog::error("handling {}: {}", what, e.what());
    }
  }
  void on_agent_message(const SessionPtr& s, const wire::Envelope& env);
  /// The job and task a task_event or task_exit names.
  struct Addressed {
    JobRec* job = nullptr;
    TaskRec* task = nullptr;
  };
  /// The task of the current generation of a known job, run by this session's agent, that
  /// a task_event or task_exit names; {} after replying when there is none (an error) or
  /// it was an orphan's exit (whose hold goes back).
  Addressed addressed_task(const SessionPtr& s, const wire::Envelope& env);
  void on_register(const SessionPtr& s, const wire::Envelope& env);
  /// A task's event (`ev`, as its agent relayed it): parsed once (wire/task_events.h,
  /// TaskEvent), visited, and relayed to the job's followers where its kind is.
  void on_task_event(JobRec& j, TaskRec& t, const json& ev);
  void on_ps_listening(JobRec& j, TaskRec& t, const json& ev);
  void on_started(JobRec& j, TaskRec& t, const wire::events::Started& e);
  void on_progress(JobRec& j, TaskRec& t, const wire::events::Progress& p);
  void on_epoch_end(JobRec& j, TaskRec& t, const wire::events::EpochEnd& e, const json& ev);
  void on_task_exit(JobRec& j, TaskRec& t, const wire::TaskExitBody& b);
  /// Succeeds a running job once every worker has finished (or fails it when none
  /// reported a test accuracy); nothing otherwise.
  void maybe_succeed(JobRec& j);

  // ------------------------------------------------------------ leader_scale.cpp
  /// `scale {job, workers}`: checks the owner and the job's [elastic] bounds, then resize.
  void on_scale(const SessionPtr& s, const wire::Envelope& env, JobRec& j);
  /// Resizes running elastic job `j` to `workers` (within its bounds; the caller checked):
  /// starts workers for the new ranks where there is room (within the owner's quota), or
  /// asks the highest ranks to leave after their step. Publishes "resized" (`by`: who
  /// asked or why) and adds what it started and asked to leave to `reply_body` (may be
  /// null). Returns why it cannot now (not running, a resize still under way, a worker
  /// finished, no room, the quota), changing nothing then.
  std::optional<std::string> resize(JobRec& j, int workers, const std::string& by, json* reply_body);
  /// A worker asked to leave exited (on_task_exit, its hold already released): removes it
  /// from the job. False (nothing done) for any other task.
  bool on_worker_left(JobRec& j, TaskRec& t);
  /// The shared plan (opt.shared_plan; leader/shared_plan.h): sizes the queued elastic
  /// jobs for admission and resizes the running ones. Called by try_schedule (resize
  /// does not call back into it).
  void replan();
  /// One pool of the shared plan: the movable elastic jobs, queued and running, that share
  /// one resource, and its slots.
  struct SharePool {
    std::string resource;        ///< "cores" (jobs without GPUs) or "GPUs"
    int slots = 0;               ///< free ones plus those the pool's running jobs' workers hold
    std::vector<ShareJob> jobs;  ///< in submission order
  };
  /// What the shared plan plans now, in two pools, the GPUs' first: the jobs without GPUs on the cores
  /// (free cores plus what their workers hold, less the PS cores of the queued movable
  /// jobs; a worker takes threads_per_task), and the GPU jobs on the GPUs (free plus
  /// held; a worker takes gpus_per_worker), with each job's work left, its deadline left
  /// ([job] deadline counted from submission) and its resize cost.
  std::vector<SharePool> shared_plan_inputs() const;
  /// The plan of every pool now.
  struct SharePlanNow {
    std::vector<SharePool> pools;                    ///< shared_plan_inputs(): GPUs, then cores
    std::map<std::string, ShareDecision> decisions;  ///< by job id, across the pools
  };
  /// Plans the GPU pool, takes the cores its planned starts and grows need out of the
  /// cores pool, then plans that. Pure with respect to the leader's state.
  SharePlanNow shared_plan_now() const;
  /// What the planner's models say of a job, for the shared plan (Planning::share_models:
  /// its scaling curve and, with a target accuracy, the most workers that reach it), read
  /// at most once a minute per job (the models change only as epochs are recorded).
  Planning::ShareModels plan_model_of(const JobRec& j) const;
  /// plan_model_of's cache: job id → (when read, what was read); a job that ended leaves
  /// it at the next replan. Mutable: a cache behind const readers of the plan.
  mutable std::map<std::string, std::pair<std::chrono::steady_clock::time_point, Planning::ShareModels>> plan_models;
  /// For a submit under the shared plan: the plan's prediction for the elastic job `j`
  /// just queued, and a warning when its deadline cannot be met under the current load
  /// (nullopt: not planned by the shared plan).
  std::optional<std::pair<json, std::string>> shared_plan_forecast(const JobRec& j) const;
  /// `cluster_plan`: the shared plan now (the cores and GPUs of its pools; each planned
  /// job's resource, slots a worker, workers, planned workers, reason, predicted seconds
  /// to its end, deadline) and its latest changes, oldest first.
  json cluster_plan_json() const;
  /// The shared plan's latest resizes and starts, oldest first, at most kPlanChangesKept
  /// (the oldest go first): {t (unix s), job, owner, from, to, reason}; only what was
  /// done (a resize the leader carried out, a start, an end). In memory only.
  std::deque<json> plan_changes;
  /// How many plan_changes the leader keeps.
  static constexpr std::size_t kPlanChangesKept = 500;
  /// Appends one change to plan_changes, dropping the oldest past kPlanChangesKept.
  void record_plan_change(const JobRec& j, int from, int to, const std::string& reason);

  // ------------------------------------------------------------ leader_users.cpp
  /// The audit log (<state_dir>/audit.log; without a state directory, the leader's log only).
  std::unique_ptr<AuditLog> audit_log = std::make_unique<AuditLog>("");
  /// Client requests that change something (submit, cancel, resume, model_upload),
  /// waiting for their reply: (session id, request id) → their audit line so far. Every
  /// request gets a reply or an error (on_message answers what a handler throws), also
  /// when its session closed meanwhile (a submit reading a remote manifest replies later),
  /// so each line is written once, with the request's true outcome.
  std::map<std::pair<std::uint64_t, std::string>, json> audit_pending;
  /// Starts the audit line of a client request that changes something (others: nothing).
  void audit_request(const SessionPtr& s, const wire::Envelope& env);
  /// Completes and writes the audit line of request `id` of `s`, if it has one: `body`
  /// for a reply, else the error's `code` and `message`.
  void audit_reply(const SessionPtr& s, const std::string& id, const json* body, const std::string& code,
                   const std::string& message);
  /// The [users.NAME] options of `user`; nullptr for "admin" (the client token) and for
  /// a name not (or no longer) configured.
  const config::UserOptions* user_options(const std::string& user) const;
  /// May the user of session `s` `action` ("cancel", "read the logs of", ...) job `j`?
  /// Its owner and admins may; anyone else gets a `forbidden` reply to request `req`
  /// naming the owner, and false.
  bool may_act(const SessionPtr& s, const std::string& req, const JobRec& j, const std::string& action);
  /// may_act on the job with id `job`. One the leader no longer knows whose models or
  /// checkpoints it still keeps (retired) only admins may act on; anyone else gets a
  /// `forbidden` reply naming `field`. One it neither knows nor keeps anything of: true
  /// (the request's own lookup answers "not found").
  bool may_act(const SessionPtr& s, const std::string& req, const std::string& job, const std::string& action,
               const std::string& field);
  /// Why a job can never run within its owner's quotas.
  struct QuotaRefusal {
    std::string field;    ///< the job field to change: "workers" (cores) or "gpus_per_worker"
    std::string message;  ///< "needs N cores (…), more than user U's max_cores = M"
  };
  /// Why `spec` can never run within `user`'s quotas (it alone needs more cores or GPUs
  /// than max_cores or max_gpus); nullopt when it can (or the user has no bounds). An
  /// automatic worker count counts as none here: it is checked when planned (decide).
  std::optional<QuotaRefusal> quota_refusal(const std::string& user, const JobSpec& spec) const;
  /// Each bounded user's quota and what that user's running jobs hold now, for admission.
  AdmitQuotas admit_quotas() const;
  /// Why queued `j` waits for its owner's other jobs to end (its quota), or nullopt.
  std::optional<std::string> quota_wait(const JobRec& j) const;

  // ------------------------------------------------------------ leader_clients.cpp
  /// `manifest`: the text of a remote sharded data set's manifest (with_manifest), or "".
  /// `data_shards`, when given, gets a sharded data set's training shards (JobRec::data_shards).
  std::optional<JobSpec> parse_submitted(const SessionPtr& s, const wire::Envelope& env, const wire::SubmitBody& b,
                                         const std::string& manifest = "",
                                         std::vector<JobRec::DataShard>* data_shards = nullptr);
  /// Calls `then(manifest)` on the io thread: for a job (b) whose data is a sharded data set
  /// elsewhere than a path (http, https, s3), once its manifest was read on a thread of
  /// its own (the io thread never waits for a store); when it cannot be read, replies the
  /// error (invalid_job, field "data") instead. A path's manifest is read at once (its
  /// errors are parse_job_toml's); other jobs get "" at once.
  void with_manifest(const SessionPtr& s, const wire::Envelope& env, const wire::SubmitBody& b,
                     std::function<void(const std::string& manifest)> then);
  /// The threads reading manifests (with_manifest); joined once done, or when the leader
  /// is destroyed.
  struct ManifestRead {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<ManifestRead> manifest_reads;
  ~Impl() {
    for (auto& r : manifest_reads) r.thread.join();
  }
  void plan_submitted(const SessionPtr& s, const wire::Envelope& env, const wire::SubmitBody& b, const std::string& manifest);
  void add_client_handlers();
  void on_client_message(const SessionPtr& s, const wire::Envelope& env);
  void on_submit(const SessionPtr& s, const wire::Envelope& env);
  void on_plan(const SessionPtr& s, const wire::Envelope& env);
  void on_history(const SessionPtr& s, const wire::Envelope& env);
  /// list, and status without a job: the latest `b.limit` jobs.
  void on_list(const SessionPtr& s, const wire::Envelope& env, const wire::ListBody& b);
  void on_follow(const SessionPtr& s, const wire::Envelope& env, JobRec& j);
  /// status, cancel and follow of one job: finds it (replying the error when there is
  /// none) and runs `handle`.
  void with_job(const SessionPtr& s, const wire::Envelope& env, const std::function<void(JobRec&)>& handle);
  /// Stores and queues (or plans) new job `j` (its spec checked), replies to request `id`
  /// with its id and state plus `extra`; with `follow`, `s` gets its events.
  void accept_job(const SessionPtr& s, const std::string& id, JobRec j, bool follow, const json& extra);
  /// `resume {job, follow}`: a new job continuing a failed or cancelled one from its
  /// latest epoch checkpoint in the model store (ModelCollection::resume_job).
  void on_resume(const SessionPtr& s, const wire::Envelope& env);
  void on_cancel(const SessionPtr& s, const wire::Envelope& env, JobRec& j);
  /// `logs {job, task, ...}`: relayed to the agent that keeps the task's log (LogRelay).
  void on_logs(const SessionPtr& s, const wire::Envelope& env);
  json agents_json() const;

  /// The planner's answer for automatic job `j` applied: queued with the chosen
  /// configuration, or failed (leader_clients.cpp).
  void decide(JobRec& j);
  /// One exploration run of `parent` per configuration the planner asked to profile.
  void explore(JobRec& parent, const std::vector<planner::Config>& configs);

};

}  // namespace dltrain::leader
