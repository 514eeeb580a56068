// One function per `dltrain` subcommand: each sends its request over a connected
// control client, prints the reply (for people, or as JSON with `as_json`) to standard
// output and returns the exit code. Errors are thrown; main() maps them to exit codes.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "control/client.h"
#include "wire/task_events.h"

namespace dltrain::client {

// Exit codes (documented in --help and docs/operations.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;  ///< the job failed or was cancelled; `plan` found no decision
inline constexpr int kExitBadInput = 2;   ///< usage error or a job/request the leader rejected
inline constexpr int kExitNoLeader = 3;   ///< the leader cannot be reached, stopped answering, or is unavailable
inline constexpr int kExitForbidden = 4;  ///< the job is another user's (the leader's `forbidden`)

/// A new session with the leader that serves now, for a follower whose session was lost
/// (HA: another candidate); throws what control::connect_first throws when none serves.
using Reconnect = std::function<std::unique_ptr<control::BlockingControlClient>()>;

/// What the command line gave the subcommands (each reads only its own fields).
struct CommandOptions {
  std::string leader;          ///< the leader's URL, for messages ("submitted … to URL")
  std::string job_id;          ///< status, cancel, follow: e.g. "job-1" ("" for status = every job)
  bool follow = false;         ///< submit --follow: print progress until the job ends
  std::string model_filter;    ///< history --model ("" = every model)
  std::string dataset_filter;  ///< history --dataset ("" = every dataset)
  std::chrono::seconds timeout{30};  ///< how long to wait for each reply
  std::int64_t list_limit = 100;     ///< list, status without a job: the latest this many jobs
  /// follow, submit --follow, resume --follow: how to go on when the session is lost
  /// (empty: the IoError ends the command, exit 3). Set with HA candidates.
  Reconnect reconnect;
};

/// `dltrain logs` options.
struct LogsOptions {
  std::string task = "worker-0";  ///< --task
  int tail = 50;                  ///< --tail: lines, [0, 10000]
  bool follow = false;            ///< --follow: poll for more until the task ends
  /// --follow: time between two reads. The log lives on the task's agent and is read
  /// through the leader on request (nothing is pushed), so this is the latency.
  std::chrono::milliseconds poll{1000};
};

/// `dltrain logs`: the last `lo.tail` lines of task `lo.task` of `opt.job_id`; with
/// `lo.follow`, then what it appends, until it has ended and everything was read; with
/// `opt.reconnect` a lost leader is replaced by the one that serves next and the read
/// asked again from the same offset (nothing printed twice or skipped). Returns kExitOk. Throws RemoteError (no such job or task; its agent is not connected
/// or did not answer: code unavailable) and what BlockingControlClient::request throws.
int logs(control::BlockingControlClient& c, const CommandOptions& opt, const LogsOptions& lo, bool as_json);

/// `dltrain trace` options.
struct TraceOptions {
  std::string task;          ///< --task: one worker ("worker-1"); "" = every worker of the job
  std::size_t steps = 100;   ///< --steps: the last N steps of each worker, [1, 4096]
};

/// `dltrain trace`: the step timeline of the last `to.steps` steps of `opt.job_id`'s
/// workers (or of worker `to.task`), each read from the file its worker keeps on its
/// agent, printed to stdout as one Chrome trace-event JSON document
/// (wire/step_trace.h, chrome_trace). A worker that has no timeline yet is skipped
/// with a note on stderr. Returns kExitOk, or kExitBadInput when no asked worker has a
/// timeline (nothing is printed). Throws RemoteError (no such job or task, its agent
/// is not connected or did not answer), ProtocolError (a timeline file that does not
/// parse) and what BlockingControlClient::request throws.
int trace(control::BlockingControlClient& c, const CommandOptions& opt, const TraceOptions& to);

/// The body of a "submit" or "plan" request for `job_file` (TOML): its text, the
/// absolute directory it is in (the leader resolves the job's relative paths against
/// it) and `follow`. Read before connecting, so that a bad path is reported as such.
/// Throws ConfigError ("job file \"PATH\" does not exist", "… is not a regular file",
/// "cannot read job file \"PATH\"").
nlohmann::json job_request(const std::string& job_file, bool follow);

/// `dltrain submit`: submits `request` (job_request()) and prints the new job's id and
/// state; with `opt.follow`, then prints its events as follow_job() does. Returns
/// kExitOk, or with `opt.follow` the job's exit_for_state(). Throws what
/// BlockingControlClient::request and next_event throw (RemoteError, TimeoutError,
/// IoError).
int submit(control::BlockingControlClient& c, const nlohmann::json& request, const CommandOptions& opt,
           bool as_json);

/// The first half of submit(): submits `request`, prints the new job's id and state (and
/// the leader's warning, on stderr) and returns the id. Throws as submit() does.
std::string submit_and_print(control::BlockingControlClient& c, const nlohmann::json& request,
                             const CommandOptions& opt, bool as_json);

/// `dltrain resume JOB` (opt.job_id): asks the leader for a new job that continues failed
/// or cancelled JOB from its latest epoch checkpoint, and prints the new job's id, the
/// checkpoint and the epoch it starts at; with `opt.follow`, then its events as
/// follow_job() does. Returns kExitOk, or with `opt.follow` the new job's
/// exit_for_state(). Throws as submit() does (RemoteError when the leader refuses: JOB
/// is running or succeeded, or no checkpoint of it is kept).
int resume(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain plan`: the planner's decision for `request` (job_request()) without running
/// anything. Returns kExitOk when it is feasible, kExitJobFailed when not (kExitOk with
/// `as_json`). Throws as submit() does.
int plan(control::BlockingControlClient& c, const nlohmann::json& request, const CommandOptions& opt,
         bool as_json);
/// `dltrain plan --cluster`: the leader's shared plan now — each planned elastic job's
/// workers, planned workers, reason, predicted time to its end and deadline — and its
/// latest resizes (docs/operations.md, "The shared plan"). kExitOk; the leader's errors
/// throw as for every command.
int cluster_plan(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain history`: the leader's performance observations, filtered by
/// `opt.model_filter` and `opt.dataset_filter`. Returns kExitOk. Throws as submit() does.
int history(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain follow`: subscribes to the events of `opt.job_id` and prints them until its
/// summary (follow_job()). Returns the job's exit_for_state(). Throws as submit() does.
int follow(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain status`: one job (`opt.job_id`) with its tasks, or, when `opt.job_id` is
/// empty, every job as list() prints them. Returns kExitOk. Throws as submit() does.
int status(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain list`: one line per job; with `as_json` the leader's reply as one object,
/// {leader, jobs, total, omitted, size_bound}. Returns kExitOk. Throws as submit() does.
int list(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain cancel`: cancels `opt.job_id` and prints its new state. Returns kExitOk.
/// Throws as submit() does.
int cancel(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);
/// `dltrain scale JOB --workers N`: resizes a running elastic job (docs/training.md,
/// "Elastic jobs"); prints what was started and asked to leave. Refusals (bounds, not
/// elastic, not running, no room, another user's job) are the leader's errors.
int scale(control::BlockingControlClient& c, const CommandOptions& opt, int workers, bool as_json);

/// `dltrain agents`: the agents registered with the leader; with `as_json` the reply as
/// one object, {leader, agents}. Returns kExitOk. Throws as submit() does.
int agents(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// The exit code for a job that ended in `state`: kExitOk for "succeeded", else
/// kExitJobFailed.
int exit_for_state(const std::string& state);

/// Prints `job`'s events (print_event, or one JSON object per line with `as_json`) as
/// they arrive, until its summary; returns exit_for_state() of the summary's state.
/// Waits without limit (the WebSocket keep-alive ends a session whose leader went
/// silent). `summary`, when given, receives the summary. `stop`, when given, is asked
/// about once a second; when it returns true, follow_job returns kFollowStopped without
/// waiting for the summary (the job goes on).
///
/// With `reconnect`, a lost session is replaced by the leader that serves now (a
/// failover): the job is followed again there, and the events the leader stored (state
/// changes, epoch ends, the summary, ...; docs/protocol.md "events") since this follow
/// began that were not printed are printed first, in order; none is printed twice (an
/// event is the same when it is equal but for its `time` and `job`). Progress lines sent
/// while no leader served are not stored, and not repeated. `timeout` bounds each
/// request. Throws IoError when the connection is lost and there is no `reconnect`, and
/// what `reconnect` throws.
int follow_job(control::BlockingControlClient& c, const std::string& job, bool as_json,
               wire::events::Summary* summary = nullptr, const std::function<bool()>& stop = {},
               const Reconnect& reconnect = {}, std::chrono::seconds timeout = std::chrono::seconds(30));

/// follow_job()'s return value when its `stop` predicate ended it (not an exit code).
inline constexpr int kFollowStopped = -1;

}  // namespace dltrain::client
