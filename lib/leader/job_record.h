// The leader's records of jobs and their tasks, and their JSON forms: the stored form a
// restarted leader reads back (RocksDB, store/store.h), the job as `dltrain status`
// shows it, and its summary (wire/task_events.h, events::Summary). No behaviour: the job
// state machine that changes these records is leader/leader.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "leader/job_series.h"
#include "leader/states.h"
#include "common/json_fields.h"
#include "wire/task_events.h"

namespace dltrain::control {
class Session;
}

namespace dltrain::leader {

/// One task (PS shard or worker) of a job, in its current generation.
struct TaskRec : json_fields::Fields<TaskRec> {
  std::string name;        ///< "ps-0", "worker-1"
  TaskKind kind = TaskKind::kWorker;
  int index = 0;           ///< shard or rank
  std::string agent;
  TaskState state = TaskState::kPending;  ///< leader/states.h
  int port = 0;
  std::string address;
  std::vector<int> gpus;   ///< worker of a cuda job: the GPU indices it holds on its agent
  std::string last_error;
  std::string exit;        ///< ExitStatus::describe()
  bool ok_exit = false;
  int restarts = 0;
  std::string recovery;    ///< PS shard: how its last restart recovered its state
  int resyncs = 0;         ///< worker: times it reconnected to restarted PS shards
  int epochs_done = 0;     ///< worker: epochs it finished (from its epoch_end events)
  /// Worker: what its "stopped" event said of its saved replica (empty: none).
  json_fields::Nullable<wire::events::Replica> replica;
  std::uint32_t replica_generation = 0;  ///< the generation whose task directory holds it
  bool restored = false;   ///< PS shard: loaded a checkpoint when it started (not stored)
  std::int64_t global_step = 0;  ///< worker: its latest progress event's global step (not stored)
  std::int64_t steps_per_epoch = 0;  ///< worker: its shard's steps per epoch, from progress (not stored)
  bool straggler = false;  ///< worker: behind the others by more than the factor (mark_stragglers)
  /// The newest task_event / task_exit of this task the leader took: its agent process's
  /// `sender` id and the message's `seq` (TaskRefBody). A message sent again after a lost
  /// connection (the agent resends what was not answered) with a seq at or below it is
  /// answered and not taken twice (docs/protocol.md "Delivery").
  std::string delivered_sender;
  std::uint64_t delivered_seq = 0;
  /// Worker of an elastic job: asked to leave it (a scale-down); its exit removes it.
  bool leaving = false;

  /// The stored form (a restarted leader adopts the tasks its agents re-report).
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("name", s.name), v("kind", s.kind), v("index", s.index), v("agent", s.agent), v("state", s.state),
        v("port", s.port), v("address", s.address), v("exit", s.exit), v("ok_exit", s.ok_exit),
        v("restarts", s.restarts), v("epochs_done", s.epochs_done), v("recovery", s.recovery),
        v("resyncs", s.resyncs), v("last_error", s.last_error), v("replica", s.replica),
        v("replica_generation", s.replica_generation), v("gpus", s.gpus), v("delivered_sender", s.delivered_sender),
        v("delivered_seq", s.delivered_seq), v("leaving", s.leaving);
  }
};

/// What the leader's recovery (leader/recovery.h) keeps of one job: its re-assignments
/// and, after a leader restart, its adoption. Changed only by Recovery; the rest of the
/// leader reads it.
struct JobRecovery {
  using Clock = std::chrono::steady_clock;
  int reassignments = 0;          ///< times the job was re-assigned (bounded by task_max_restarts)
  std::string reason;             ///< why it was last re-assigned ("" = never)
  std::optional<Clock::time_point> since;  ///< state recovering: since when
  bool waiting_logged = false;    ///< its "waiting for an agent" was said for this recovery
  /// After a re-assignment: the worker whose saved replica (of generation seed_generation)
  /// initialises the new shards; the other workers start once it has.
  std::string seed;
  std::uint32_t seed_generation = 0;
  /// A job a restarted leader restored while running: until this time (or until every
  /// agent its tasks are on has registered again) the leader waits for its agents.
  std::optional<Clock::time_point> adopt_until;
  std::string adopt_lost;  ///< tasks its agents no longer had when they came back
};

/// A resumed job (`dltrain resume`, model_collection.cpp): the job it continues, that job's
/// checkpoint it starts from ("epoch-4") and the epochs that checkpoint had finished,
/// [1, spec.epochs): its workers start at that epoch. Empty / 0 for any other job.
struct ResumePoint {
  std::string from, checkpoint;
  int epoch = 0;
};

/// The bytes a job's workers pushed and pulled (data-plane frames, headers included).
struct ByteCounts {
  std::map<int, std::uint64_t> pushed, pulled;  ///< each worker's count in this generation
  std::uint64_t pushed_before = 0, pulled_before = 0;  ///< earlier generations' and leaders' counts
  double last_bytes = 0;                        ///< the total at the previous epoch observation
};

/// Each worker's latest figures (by rank), from its events.
struct WorkerFigures {
  std::map<int, double> images_per_sec;
  std::map<int, double> epoch_seconds;          ///< its latest epoch time, s
  std::map<int, std::int64_t> skipped_images;   ///< unreadable images it skipped
  std::map<int, wire::events::Traffic> traffic, traffic_after_warmup;  ///< from its "done"
};

/// An automatic job's plan and exploration, and an exploration run's own figures.
struct JobExploration {
  nlohmann::json plan;                        ///< the planner's decision, when auto
  std::string profile_of;                     ///< the job this one is an exploration run of
  std::vector<std::string> pending_profiles;  ///< this job waits for these runs
  double exploration_seconds = 0;             ///< its runs' wall time, summed
  std::map<int, double> profile_ips;          ///< exploration runs: per worker
  double profile_eval_seconds = 0;            ///< exploration runs: worker 0's one evaluation, s (0: none)
  /// Rounds of exploration runs started for this job, kept in its record: the corners of
  /// a thin history, then, for a method = "auto" job, the method the plan would choose,
  /// and the plan again. decide() starts another only below kMaxRounds.
  int rounds = 0;
  /// The most rounds of exploration a job gets, the first included.
  static constexpr int kMaxRounds = 3;
};

/// When this leader got a job's first progress report, and its progress() then: the base
/// of its ETA (a restarted leader's base is its own first report, not the job's).
struct EtaBase {
  std::optional<std::chrono::steady_clock::time_point> training_since;
  double progress_at_training_since = 0;
};

/// One job: its specification, state, tasks and counters.
struct JobRec {
  using Clock = std::chrono::steady_clock;
  std::string id;                  ///< "job-<num>"
  std::uint64_t num = 0;
  JobSpec spec;
  /// A sharded data set's training shards from its manifest at submit, in its order, for
  /// placing each worker where its shards are cached; empty for other jobs (and after a
  /// leader restart, which places without it).
  struct DataShard {
    std::string sha256;
    std::int64_t bytes = 0, samples = 0;
  };
  std::vector<DataShard> data_shards;
  /// The bytes of worker `rank`'s shards (data::deal_shards) that each agent's cache holds,
  /// by agent id (agents holding none left out); `cached` gives an agent's shard set (a
  /// null set: it holds every shard, which gives the worker's total).
  std::map<std::string, std::int64_t> cached_for(int rank,
                                                 const std::map<std::string, const std::set<std::string>*>& cached) const;
  /// Its state and the end it is headed for (leader/states.h): changed only through
  /// Leader::Impl::set_state and the lifecycle's own rules.
  JobLifecycle life;
  JobState state() const { return life.state(); }
  std::uint32_t generation = 1;
  /// Hex of the job's random secret (common/secret.h): its tasks prove it to each other on
  /// the data plane. Sent to agents in start_task and kept in the store while the job
  /// lives; never in a reply, an event or a log line.
  std::string secret;
  Clock::time_point submitted;
  double submitted_unix = 0;
  /// The user who submitted it (control::ClientIdentity::user; "admin" for the client
  /// token and for records stored before jobs had owners): only it and admins may cancel
  /// it, read its logs and model, or resume it.
  std::string owner = "admin";
  /// Elastic jobs under the shared plan: why it has the workers it has (the plan's latest
  /// reason; not stored).
  std::string share;
  /// The shared plan's latest decision gave it workers (a queued job it admits: its start,
  /// and later its end, go into the plan's history). Not stored.
  bool share_admitted = false;
  /// Its owner or an admin resized it with `dltrain scale`: the shared plan leaves it at
  /// that size (its cores still count as held). Not stored: a restarted leader's plan
  /// may move it again.
  bool scaled_by_hand = false;
  /// The longest a worker of it took to load its data and model before its first step,
  /// s (Started::load_seconds; 0 until one has started; not stored).
  double worker_start_seconds = 0;
  std::optional<Clock::time_point> ended;
  std::vector<TaskRec> tasks;
  double test_accuracy = -1;
  int epochs_done = 0;
  ResumePoint resume;        ///< where a resumed job starts (empty for any other)
  ByteCounts bytes;          ///< what its workers pushed and pulled
  WorkerFigures figures;     ///< its workers' latest figures
  JobExploration explore;    ///< the planner's decision and the exploration runs
  double fixed_wall = -1;    ///< restored jobs: wall time when they ended
  std::string error;
  /// The first task whose failure failed the job (absent when none did: a planner or
  /// queue failure, a cancellation).
  std::optional<wire::events::Failure> failure;
  /// The trained model (leader/model_collection.cpp), in memory only: collected from worker
  /// 0's agent once every task of a succeeding job exited, before it is succeeded.
  struct ModelCollection {
    bool done = false;        ///< collected, failed, or nothing to collect: the job may end
    /// The stored model's name: "last" for a succeeded job, the latest epoch checkpoint
    /// ("epoch-4") for a failed or cancelled one; "" when none.
    std::string checkpoint;
    std::string error;        ///< why none was stored
    /// The standby candidates that held its models when the job ended (docs/ha.md
    /// "Artifacts"); empty without [ha].
    std::vector<std::string> replicas;
    std::string replication;  ///< why a standby did not hold them in time ("" when all did)
  } model;
  std::vector<std::weak_ptr<control::Session>> followers;
  bool workers_started = false;  ///< some generation of this job trained (its PS state matters)
  JobRecovery recovery;  ///< re-assignment and adoption (changed only by leader/recovery.h)
  std::optional<Clock::time_point> queued_since;  ///< when it last entered the queue
  std::string last_waiting;  ///< the last "waiting" event its followers got (to send changes only)
  JobSeries series;          ///< the dashboard's curves (in memory only; leader/job_series.h)
  EtaBase eta_base;          ///< the base of eta_seconds()
  /// The share of the job's steps its workers have taken, [0, 1]: Σ global_step ÷
  /// Σ steps_per_epoch × epochs over the workers that reported progress; nullopt before
  /// any did.
  std::optional<double> progress() const;
  /// Seconds left at the rate since training_since: elapsed × (1 − p) ÷ (p − p0) for
  /// progress p and p0 = progress_at_training_since; nullopt while p <= p0 (no second
  /// report yet) or when not running.
  std::optional<double> eta_seconds() const;

  bool terminal() const { return life.terminal(); }
  /// Seconds from submission to the end (or now).
  double wall_seconds() const;
  std::uint64_t bytes_pushed() const;  ///< all workers, all generations
  std::uint64_t bytes_pulled() const;
  /// Adds this generation's byte counts to the earlier ones' and clears them (a new
  /// generation's workers count from 0).
  void close_generation_bytes();
  /// The task named `name` ("worker-1"), or nullptr. Valid until `tasks` changes.
  TaskRec* find_task(const std::string& name);
};

/// Workers at most this many steps into a job are never stragglers: at the start every
/// worker's first progress report comes at a different time.
inline constexpr std::int64_t kMinStepsForStragglers = 20;

/// Marks the stragglers among `j`'s workers (TaskRec::straggler): a running worker whose
/// latest reported global step times `factor` is below the highest step any worker of
/// the job reported, once that is at least kMinStepsForStragglers. A worker that stopped
/// reporting (paused, swapped out, stuck) falls behind as the others advance. factor <= 0
/// marks none, and so does an elastic job (its workers claim their data as they go). Pure (on `j`).
void mark_stragglers(JobRec& j, double factor);

/// Where a queued job stands, for job_json.
struct QueueStatus {
  std::size_t position = 0;  ///< 1-based
  int cores_needed = 0;      ///< (workers + PS shards) × threads_per_task
  int cores_free = 0;        ///< on the live agents
  bool fits_cluster = false; ///< it fits the live agents when idle
  int cores_total = 0;       ///< of the live agents, busy or not
  int gpus_needed = 0;       ///< workers × gpus_per_worker (0: a CPU job)
  int gpus_free = 0;         ///< on the live agents
  int gpus_total = 0;        ///< of the live agents, busy or not
  /// A sharded data set's job: how many live agents have a shard cache (its workers go
  /// only there); -1 for other jobs.
  int cache_agents = -1;
  int agents = 0;            ///< live agents
  /// When a sharded job does not fit for want of agents with a cache: "; its workers read
  /// a sharded data set …: N of the M agents have one", else "" (for the queue's messages).
  std::string cache_note() const;
};

/// The summary event of `j` (its last event for followers).
wire::events::Summary summary(const JobRec& j);

/// `j` as `dltrain status` shows it: the summary plus the specification's main fields,
/// the tasks, the plan and, for a queued job, `queue`.
nlohmann::json job_json(const JobRec& j, const std::optional<QueueStatus>& queue);

/// The stored form of `j`: job_json plus what a restarted leader needs (the
/// specification, the generation, and while it lives its secret, tasks and counters).
nlohmann::json stored_record(const JobRec& j);

/// A job read back from its stored form (a leader restart). An unfinished job gets its
/// tasks and counters back (resume_stored_counters). Throws ConfigError when the
/// specification cannot be read or the state is none of leader/states.h's (field "state").
JobRec job_from_record(std::uint64_t num, const nlohmann::json& r);

/// The tasks and counters of an unfinished job from its stored form. Throws
/// nlohmann::json::exception for a malformed record, InvalidArgument for a task state or
/// kind that does not exist, and ConfigError (field "failing_state") for a failing_state
/// that is not a terminal state.
void resume_stored_counters(JobRec& j, const nlohmann::json& r);

/// Seconds since the Unix epoch, now.
double unix_now();

}  // namespace dltrain::leader
