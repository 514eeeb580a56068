// The bodies of the control messages that the leader and the agents accept
// (docs/protocol.md, "Control plane"): one struct per body, whose field list — names,
// types — is written once and serves the sender (`to_json()`) and the reader
// (`parse_body<B>(envelope)`), as the task events do (wire/task_events.h).
//
//   agent → leader   register, task_event, task_exit
//   client → leader  submit and plan, status / cancel / follow, history
//   leader → agent   start_task, stop_task
//
// parse_body is the one place where a body's bytes become typed values: it checks every
// field's JSON type (integers also against their C++ type's range, json_fields::get_value)
// and what each body needs (a non-empty name, cores >= 1, safe task directory names, ...),
// and throws BodyError naming the field. Absent fields keep their defaults, unknown ones
// are ignored (an older or newer peer's extra field is harmless). Pure functions, no
// state: the leader's and the agent's handlers call them, and tests/fuzz/ fuzzes them.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json_fields.h"
#include "job/job_spec.h"
#include "wire/control.h"
#include "wire/task_kind.h"

namespace dltrain::wire {

/// A control message body that does not fit its schema. `field()` is the offending key
/// (e.g. "cores", or "tasks" for an entry of that array), for the error reply's "field".
class BodyError : public ProtocolError {
 public:
  BodyError(std::string field, const std::string& message) : ProtocolError(message), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// Longest job, task or agent name accepted in a body, in bytes.
inline constexpr std::size_t kMaxNameLength = 256;

/// Throws BodyError(field, ...) unless `name` can be one component of a path: 1 to
/// kMaxNameLength bytes of letters, digits, '-', '_' and '.', and not "." or "..". What
/// names a task's directory (<state_dir>/tasks/<job>/<task>-g<generation>) must be, so
/// that a request cannot reach outside the state directory.
void check_path_name(const std::string& name, const std::string& field, const std::string& what);

/// A task an agent lists in its registration.
struct ReportedTask : json_fields::Fields<ReportedTask> {
  std::string job;               ///< "job-3"
  std::string task;              ///< "ps-0", "worker-1"
  std::uint32_t generation = 0;  ///< the generation it was started for
  bool exited = false;           ///< it ended while the agent had no leader; its task_exit follows
  int threads = 0;               ///< cores it was started with; 0 = not said (older agents: 1)
  std::vector<int> gpus;         ///< GPU indices it was started with (CUDA_VISIBLE_DEVICES)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("generation", s.generation), v("exited", s.exited),
        v("threads", s.threads), v("gpus", s.gpus);
  }
};

/// One GPU an agent offers (agent/gpus.h discovers them through NVML).
struct GpuInfo : json_fields::Fields<GpuInfo> {
  int index = 0;               ///< NVML index, the CUDA_VISIBLE_DEVICES number, [0, 63]
  std::string name;            ///< model, e.g. "NVIDIA H200"; at most kMaxNameLength bytes
  std::string uuid;            ///< "GPU-…"; at most kMaxNameLength bytes
  std::int64_t memory_mb = 0;  ///< total device memory, MiB, >= 0
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("index", s.index), v("name", s.name), v("uuid", s.uuid), v("memory_mb", s.memory_mb);
  }
};

/// Most GPUs one agent may report.
inline constexpr std::size_t kMaxGpus = 64;

/// register (agent → leader): who the agent is, what it offers, what it still runs.
struct RegisterBody : json_fields::Fields<RegisterBody> {
  std::string name;                                 ///< unique per cluster; non-empty
  std::string advertise_address = "127.0.0.1";      ///< where its PS shards are reached
  int cores = 0;                                    ///< cores offered to tasks, >= 1
  std::int64_t memory_mb = 0;                       ///< memory offered, MiB, >= 0
  std::string hardware_class = "cpu";               ///< the planner's price-table label
  std::vector<ReportedTask> tasks;                  ///< running (or exited, unreported)
  std::optional<std::string> metrics_endpoint;      ///< HOST:PORT of its /metrics; absent = none
  std::vector<GpuInfo> gpus;                        ///< GPUs offered; absent = none (older agents)
  /// Its shard cache's bound (cache_bytes), bytes, >= 0; 0 = no cache, so no worker of a
  /// sharded data set goes there; absent = an agent too old to say (treated as having one).
  std::optional<std::int64_t> shard_cache_bytes;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("name", s.name), v("advertise_address", s.advertise_address), v("cores", s.cores),
        v("memory_mb", s.memory_mb), v("hardware_class", s.hardware_class), v("tasks", s.tasks),
        v("metrics_endpoint", s.metrics_endpoint), v("gpus", s.gpus), v("shard_cache_bytes", s.shard_cache_bytes);
  }
  /// BodyError for an empty or over-long name, cores < 1, memory_mb < 0, shard_cache_bytes < 0, more than
  /// kMaxGpus GPUs, a GPU index outside [0, 63] or listed twice, a GPU's name or uuid
  /// over kMaxNameLength bytes, or its memory_mb < 0.
  void check(const std::string& type) const;
};

/// link_report (agent → leader; docs/protocol.md): the agent's link as it measured it
/// (control::measure_link) after registering. The leader keeps it as the agent's link,
/// which `dltrain agents` shows and the planner's compression choice reads
/// (docs/planner.md, "The link").
struct LinkReportBody : json_fields::Fields<LinkReportBody> {
  double bytes_per_sec = 0;               ///< one way, finite, > 0
  std::optional<double> rtt_seconds;      ///< an empty probe's time, s; >= 0
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("bytes_per_sec", s.bytes_per_sec), v("rtt_seconds", s.rtt_seconds);
  }
  /// BodyError for a bytes_per_sec that is not a finite number > 0 or an rtt_seconds
  /// that is not a finite number >= 0.
  void check(const std::string& type) const;
};

/// The task a task_event, task_exit or stop_task is about; also the whole stop_task body.
struct TaskRefBody : json_fields::Fields<TaskRefBody> {
  std::string job;               ///< "job-3"
  std::string task;              ///< "worker-1"
  std::uint32_t generation = 0;  ///< the generation the sender means
  /// task_event and task_exit: the agent process that sent it (a random id of that
  /// process) and the message's number in that process's sending order, from 1; "" / 0
  /// from older agents. The agent sends a message again when its connection was lost
  /// before the leader answered it; the leader takes each (sender, seq) once.
  std::string sender;
  std::uint64_t seq = 0;
  /// stop_task of an elastic job's worker: leave the job after the current step (SIGUSR1,
  /// a scale-down) instead of stopping; absent = stop.
  std::optional<bool> leave;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("generation", s.generation), v("sender", s.sender), v("seq", s.seq),
        v("leave", s.leave);
  }
  /// Best effort, never throws: the job, task and generation of `body` where they have
  /// the right types, else empty / 0. For reporting about a request that was refused.
  static TaskRefBody lenient(const nlohmann::json& body) noexcept;
};

/// task_event (agent → leader): one line of a task's standard output, as an event.
struct TaskEventBody : json_fields::Fields<TaskEventBody> {
  std::string job, task;         ///< as TaskRefBody
  std::uint32_t generation = 0;
  nlohmann::json event = nlohmann::json::object();  ///< the event (wire/task_events.h): an object
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("generation", s.generation), v("event", s.event);
  }
  /// BodyError unless `event` is an object.
  void check(const std::string& type) const;
};

/// task_exit (agent → leader): a task ended for good.
struct TaskExitBody : json_fields::Fields<TaskExitBody> {
  std::string job, task;         ///< as TaskRefBody
  std::uint32_t generation = 0;
  int exit_code = -1;            ///< the process's exit code; -1 when it was killed
  int signal = 0;                ///< the signal that ended it; 0 when none
  std::string describe = "exited";  ///< ExitStatus::describe(), for logs and `dltrain status`
  std::string last_error;        ///< the task's last error event or log line
  bool agent_stopping = false;   ///< it ended because its agent shuts down
  std::optional<std::string> cause;     ///< events::Failure::cause, for a failed exit
  std::vector<std::string> last_lines;  ///< the last lines of its log (at most 20), oldest first
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("generation", s.generation), v("exit_code", s.exit_code),
        v("signal", s.signal), v("describe", s.describe), v("last_error", s.last_error),
        v("agent_stopping", s.agent_stopping), v("cause", s.cause), v("last_lines", s.last_lines);
  }
};

/// logs (client → leader) and read_log (leader → agent): which window of a task's log.
struct LogRequestBody : json_fields::Fields<LogRequestBody> {
  static constexpr std::int64_t kMaxTail = 10000;        ///< lines
  static constexpr std::int64_t kMaxBytes = 1 << 20;     ///< per reply
  std::string job;                   ///< "job-3"; required
  std::string task = "worker-0";     ///< the task whose log
  std::uint32_t generation = 0;      ///< read_log: the incarnation (its directory); set by the leader
  std::optional<std::int64_t> offset;  ///< bytes into the log; absent: its last `tail` lines
  std::int64_t tail = 50;            ///< lines, [0, kMaxTail]
  std::int64_t max_bytes = 256 << 10;  ///< bytes read from `offset`, [1, kMaxBytes]
  static constexpr const char* kLogFile = "log";      ///< the task's log (stderr and events)
  static constexpr const char* kTraceFile = "trace";  ///< a worker's step timeline (`dltrain trace`)
  std::string file = kLogFile;       ///< which of the task's files: kLogFile or kTraceFile
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("generation", s.generation), v("offset", s.offset), v("tail", s.tail),
        v("max_bytes", s.max_bytes), v("file", s.file);
  }
  /// BodyError for a job or task that is not a safe directory name, an offset < 0, a
  /// tail or max_bytes out of range, a file other than "log" and "trace".
  void check(const std::string& type) const;
};

/// The answer to logs / read_log: a window of the log (agent/task_logs.h, LogWindow).
struct LogChunkBody : json_fields::Fields<LogChunkBody> {
  std::string job, task, agent;      ///< whose log, on which agent
  std::string text;                  ///< what was read
  std::int64_t offset = 0;           ///< where `text` starts, bytes
  std::int64_t next_offset = 0;      ///< where to continue (--follow)
  std::int64_t size = 0;             ///< the log's size now, bytes
  bool rotated = false;              ///< the log was rotated since `offset`: read from its start
  bool exists = false;               ///< the task has a log there
  bool running = false;              ///< the task still runs (more may come)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("task", s.task), v("agent", s.agent), v("text", s.text), v("offset", s.offset),
        v("next_offset", s.next_offset), v("size", s.size), v("rotated", s.rotated), v("exists", s.exists),
        v("running", s.running);
  }
};

/// submit and plan (client → leader): a job file's text.
struct SubmitBody : json_fields::Fields<SubmitBody> {
  std::optional<std::string> job_toml;  ///< required: the job file's text
  std::string base_dir = ".";           ///< where the job file's relative paths start
  bool follow = false;                  ///< submit: send this session the job's events
  /// model = "torchscript": the SHA-256 of the model_file the client uploaded first
  /// (model_upload); absent: the leader reads model_file at its path.
  std::optional<std::string> model_sha256;
  /// init_from a model directory on the client: the SHA-256 of its state_dict.pt, which the
  /// client uploaded first; absent: init_from names a job whose model the leader keeps.
  std::optional<std::string> init_sha256;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job_toml", s.job_toml), v("base_dir", s.base_dir), v("follow", s.follow), v("model_sha256", s.model_sha256),
        v("init_sha256", s.init_sha256);
  }
  /// BodyError when job_toml is absent or model_sha256 or init_sha256 is not 64 hex digits.
  void check(const std::string& type) const;
};

/// resume (client → leader): a new job that continues a failed or cancelled one from the
/// latest epoch checkpoint the leader keeps of it ([checkpoint] every_epochs), with its
/// configuration, at the epoch that checkpoint was written after. The reply is submit's,
/// plus {"resumed_from", "checkpoint", "resume_epoch"}; a job with no such checkpoint, or
/// one that is running or succeeded, is refused naming why (docs/training.md, "Resuming").
struct ResumeBody : json_fields::Fields<ResumeBody> {
  std::string job;      ///< the job to continue, "job-3"; a path component (check_path_name)
  bool follow = false;  ///< send this session the new job's events
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("follow", s.follow);
  }
  /// BodyError when job is not a path component.
  void check(const std::string& type) const { check_path_name(job, "job", type); }
};

/// status, cancel and follow (client → leader). status without a job lists every job.
struct JobQueryBody : json_fields::Fields<JobQueryBody> {
  std::optional<std::string> job;  ///< "job-3"
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job);
  }
};

/// scale (client → leader): resize a running elastic job to `workers` workers, within
/// its [elastic] bounds (docs/training.md, "Elastic jobs"). The reply is {"job", "from",
/// "to", "started": [...], "leaving": [...]}.
struct ScaleBody : json_fields::Fields<ScaleBody> {
  std::string job;   ///< "job-3"
  int workers = 0;   ///< the size asked for
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("workers", s.workers);
  }
};

/// list (client → leader): the latest jobs, in submission order. The reply is
/// {"jobs": [...], "total": every job the leader keeps, "omitted": those left out,
/// "size_bound": true when the reply stopped short of the limit because it would have
/// outgrown kMaxControlMessage / 2}.
struct ListBody : json_fields::Fields<ListBody> {
  static constexpr std::int64_t kMaxLimit = 10000;  ///< jobs per reply
  std::int64_t limit = kMaxLimit;  ///< the latest this many, [1, kMaxLimit]; absent = kMaxLimit (within 2 MiB)
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("limit", s.limit);
  }
  /// BodyError for a limit outside [1, kMaxLimit].
  void check(const std::string& type) const;
};

/// events (client → leader): the latest stored events of a job (its event log).
struct EventsBody : json_fields::Fields<EventsBody> {
  static constexpr std::int64_t kMaxLimit = 1000;  ///< events per reply
  std::string job;          ///< "job-3"; required
  std::int64_t limit = 200; ///< the latest this many, [1, kMaxLimit]
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("limit", s.limit);
  }
  /// BodyError for an empty job or a limit out of range.
  void check(const std::string& type) const;
};

/// The files of a trained model (docs/training.md "The trained model"): the metadata,
/// the state_dict and, for a TorchScript model, the script module.
inline constexpr const char* kModelFiles[] = {"metadata.json", "state_dict.pt", "model.pt"};
/// True when `name` is one of kModelFiles.
bool is_model_file(const std::string& name);

/// model_read (client → leader) and read_model_file (leader → agent): a window of one file
/// of a job's trained model. The leader answers from its model store (`checkpoint`); an
/// agent from the model/ directory of the task's incarnation `generation`.
struct ModelFileRequestBody : json_fields::Fields<ModelFileRequestBody> {
  static constexpr std::int64_t kMaxBytes = 1 << 20;  ///< file bytes per reply (4/3 of it as base64)
  std::string job;                   ///< "job-3"; required
  std::string checkpoint = "last";   ///< model_read: which of the job's models ("last")
  std::string task = "worker-0";     ///< read_model_file: the task that wrote the model
  std::uint32_t generation = 0;      ///< read_model_file: the task's incarnation; set by the leader
  std::string file;                  ///< one of kModelFiles; required
  std::int64_t offset = 0;           ///< bytes into the file, >= 0
  std::int64_t max_bytes = kMaxBytes;  ///< [1, kMaxBytes]
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("checkpoint", s.checkpoint), v("task", s.task), v("generation", s.generation),
        v("file", s.file), v("offset", s.offset), v("max_bytes", s.max_bytes);
  }
  /// BodyError for a job, task or checkpoint that is not a safe directory name, a file
  /// other than kModelFiles, an offset < 0 or max_bytes out of range.
  void check(const std::string& type) const;
};

/// The answer to model_read / read_model_file: a window of the file.
struct ModelFileChunkBody : json_fields::Fields<ModelFileChunkBody> {
  std::string job, file;      ///< whose model, which file
  std::string data;           ///< the window's bytes, base64 (RFC 4648 §4)
  std::int64_t offset = 0;    ///< where `data` starts in the file, bytes
  std::int64_t size = 0;      ///< the whole file's size, bytes
  std::string sha256;         ///< the whole file's SHA-256, hex: model_read always, read_model_file at offset 0
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("file", s.file), v("data", s.data), v("offset", s.offset), v("size", s.size),
        v("sha256", s.sha256);
  }
};

/// models (client → leader): the trained models the leader keeps, of one job or of all.
struct ModelsQueryBody : json_fields::Fields<ModelsQueryBody> {
  std::optional<std::string> job;  ///< only this job's
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job);
  }
};

/// model_upload (client → leader): one window of a model file that `dltrain submit`
/// uploads (model = "torchscript"), named by its content's SHA-256. A window with offset
/// 0 and no data asks where to go on (a new upload, or the file is already stored);
/// windows come in order. Answered by ModelUploadState.
struct ModelUploadBody : json_fields::Fields<ModelUploadBody> {
  static constexpr std::int64_t kMaxBytes = 1 << 20;         ///< file bytes per window
  static constexpr std::int64_t kMaxFileBytes = static_cast<std::int64_t>(kMaxModelFileBytes);  ///< job/job_spec.h's
  std::string sha256;       ///< of the whole file, 64 lowercase hex digits; required
  std::int64_t size = 0;    ///< of the whole file, bytes, [1, kMaxFileBytes]
  std::int64_t offset = 0;  ///< where `data` starts, bytes
  std::string data;         ///< the window's bytes, base64, at most kMaxBytes of them
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("sha256", s.sha256), v("size", s.size), v("offset", s.offset), v("data", s.data);
  }
  /// BodyError for a sha256 that is not 64 hex digits, a size or offset out of range, or
  /// data longer than kMaxBytes encode to.
  void check(const std::string& type) const;
};

/// The answer to model_upload: where the next window starts.
struct ModelUploadState : json_fields::Fields<ModelUploadState> {
  std::int64_t offset = 0;  ///< the next window's offset (== size once stored)
  bool stored = false;      ///< the whole file is stored and checked
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("offset", s.offset), v("stored", s.stored);
  }
};

/// model_download (agent → leader): a window of an uploaded model file, for a worker that
/// trains it (JobSpec::model_sha256). Answered by a ModelFileChunkBody (sha256 set).
struct ModelDownloadBody : json_fields::Fields<ModelDownloadBody> {
  std::string sha256;                  ///< 64 lowercase hex digits; required
  std::int64_t offset = 0;             ///< bytes, >= 0
  std::int64_t max_bytes = ModelFileRequestBody::kMaxBytes;  ///< [1, ModelFileRequestBody::kMaxBytes]
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("sha256", s.sha256), v("offset", s.offset), v("max_bytes", s.max_bytes);
  }
  /// BodyError for a sha256 that is not 64 hex digits, an offset < 0, max_bytes out of range.
  void check(const std::string& type) const;
};

/// replicate (a standby leader candidate → the serving leader; docs/ha.md "Artifacts"):
/// what the standby holds of the leader's artifacts. It is answered with a
/// ReplicaInventoryBody at once when the leader's artifacts changed since the standby's
/// last answer, else when they change or after at most kHold (a long poll); each request
/// is also the acknowledgement of what the previous answer asked the standby to fetch.
struct ReplicateBody : json_fields::Fields<ReplicateBody> {
  static constexpr std::chrono::seconds kHold{10};  ///< the longest an in-sync request waits
  static constexpr std::size_t kMaxItems = 100000;  ///< per list
  std::string candidate;               ///< the standby's name (its [ha] candidate name); required
  std::vector<std::string> models;     ///< "JOB/CHECKPOINT/DIGEST" of each model it holds (ModelManifest::key)
  std::vector<std::string> uploads;    ///< SHA-256 (hex) of each uploaded model file it holds
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("candidate", s.candidate), v("models", s.models), v("uploads", s.uploads);
  }
  /// BodyError for an empty candidate, more than kMaxItems entries in a list, or an
  /// upload that is not 64 hex digits.
  void check(const std::string& type) const;
};

/// The answer to replicate: what the serving leader keeps.
struct ReplicaInventoryBody : json_fields::Fields<ReplicaInventoryBody> {
  /// The stored models' manifests (leader/model_store.h ModelManifest::to_json), newest first.
  nlohmann::json models = nlohmann::json::array();
  std::vector<std::string> uploads;  ///< SHA-256 of every uploaded model file it keeps
  /// The jobs the leader still keeps (its job table): a standby drops the models of
  /// every other job (retired by job_retention).
  std::vector<std::string> jobs;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("models", s.models), v("uploads", s.uploads), v("jobs", s.jobs);
  }
};

/// auth (dashboard → leader): the first message of a /v1/dashboard session, which a
/// browser opens without an Authorization header (a page's WebSocket cannot set one).
/// The session is served like /v1/client once the token matches the client token.
struct AuthBody : json_fields::Fields<AuthBody> {
  std::string token;  ///< the client token
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("token", s.token);
  }
};

/// history (client → leader): the planner's observations, filtered.
struct HistoryBody : json_fields::Fields<HistoryBody> {
  std::string model;    ///< only this model; empty = all
  std::string dataset;  ///< only this dataset; empty = all
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("model", s.model), v("dataset", s.dataset);
  }
};

/// Most members of one local group (the workers of a job on one agent).
inline constexpr int kMaxLocalGroup = 256;

/// A worker's local group (group/local_group.h): the workers of its job that the leader
/// placed on the same agent, in rank order. Member 0 pushes the group's summed gradient
/// and shares what it pulls.
struct LocalGroupInfo : json_fields::Fields<LocalGroupInfo> {
  int rank = 0;                      ///< this worker's place in the group, [0, size)
  std::vector<std::string> members;  ///< the members' task names, [1, kMaxLocalGroup] of them
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("members", s.members);
  }
};

/// start_task (leader → agent): start one PS shard or worker of a job.
struct StartTaskBody : json_fields::Fields<StartTaskBody> {
  std::string job;               ///< "job-3"; a path component (check_path_name)
  std::uint64_t job_num = 0;     ///< the numeric job id of the data plane, >= 1
  std::string task;              ///< "ps-0", "worker-1"; a path component
  TaskKind kind = TaskKind::kWorker;
  int index = 0;                 ///< shard index or worker rank, >= 0
  std::uint32_t generation = 0;  ///< the job's generation
  std::string secret;            ///< the job secret, 64 lower-case hex characters
  int threads = 1;               ///< cores given to the task, >= 1
  JobSpec spec;                  ///< the job, validated as it is read (job_from_json)
  std::vector<std::string> ps;   ///< worker: its PS shards' HOST:PORT, in shard order
  int resume_epoch = 0;          ///< worker: epochs already finished, >= 0
  /// Worker: start from the replica it saved in this generation's task directory.
  std::optional<std::uint32_t> init_replica_generation;
  /// PS shard: first copy the checkpoint of this generation's task directory.
  std::optional<std::uint32_t> restore_generation;
  std::vector<std::uint32_t> workers_done;  ///< PS shard: ranks that already finished
  /// GPU indices the task may use, [0, 63], unique; the agent starts it with
  /// CUDA_VISIBLE_DEVICES set to them ("" for none). A worker of a cuda job needs
  /// spec.gpus_per_worker of them.
  std::vector<int> gpus;
  /// Worker of a local_group job: its group (group/local_group.h). Absent = no group.
  std::optional<LocalGroupInfo> local_group;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("job", s.job), v("job_num", s.job_num), v("task", s.task), v("kind", s.kind), v("index", s.index),
        v("generation", s.generation), v("secret", s.secret), v("threads", s.threads), v("spec", s.spec),
        v("ps", s.ps), v("resume_epoch", s.resume_epoch), v("init_replica_generation", s.init_replica_generation),
        v("restore_generation", s.restore_generation), v("workers_done", s.workers_done), v("gpus", s.gpus),
        v("local_group", s.local_group);
  }
  /// BodyError naming the field: job or task not a path component, job_num 0, index,
  /// threads or resume_epoch out of range, a secret that is not 64 hex characters, a
  /// worker's ps entry that is not
  /// HOST:PORT, GPU indices out of [0, 63] or repeated, a cuda worker without
  /// spec.gpus_per_worker of them, a local group whose rank or size is out of range.
  void check(const std::string& type) const;
};

namespace detail {
/// Reads each field with json_fields' reader and turns its type errors into BodyError. A
/// closed-set field (a named enum: StartTaskBody::kind) and a JobSpec are required: absent,
/// the first is refused as the name "" and the second as the empty job.
struct BodyReader {
  const nlohmann::json& in;
  const std::string& type;
  template <typename T>
  void operator()(const char* key, T& v) const {
    const auto it = in.find(key);
    const bool absent = it == in.end() || it->is_null();
    if constexpr (NamedEnum<T>) {
      // A closed set has no default in a message: absent is refused as an empty name.
      if (absent || !(it->is_string() && enum_from_name<T>(it->template get_ref<const std::string&>()))) {
        throw BodyError(key, type + " field \"" + key + "\": expected " + enum_alternatives<T>() + ", got " +
                                 (absent ? std::string("\"\"") : it->dump()));
      }
    }
    try {
      if constexpr (std::is_same_v<T, JobSpec>) {
        // Nor has a job: an absent one is read as the empty object it is refused as.
        if (absent) v = job_from_json(nlohmann::json::object());
      }
      json_fields::detail::Reader{in}(key, v);
    } catch (const nlohmann::json::exception& e) {
      // The reader's message already starts with the key.
      throw BodyError(key, type + " body: " + json_fields::message_of(e));
    } catch (const ConfigError& e) {
      // A job specification the job's own validation refuses (job_from_json).
      throw BodyError(key, type + " field \"" + key + "\": " + e.what());
    }
  }
};
}  // namespace detail

/// `env.body` as a B: every field present read and type-checked, then B::check(env.type)
/// where B has one. Throws BodyError naming the field (ProtocolError, so a caller that only
/// knows that one is fine). `env.body` is an object (parse_envelope made sure).
template <typename B>
B parse_body(const Envelope& env) {
  if (!env.body.is_object()) throw BodyError("body", env.type + " body: expected an object");
  B b;
  B::fields(b, detail::BodyReader{env.body, env.type});
  if constexpr (requires(const B& x, const std::string& t) { x.check(t); }) b.check(env.type);
  return b;
}

}  // namespace dltrain::wire
