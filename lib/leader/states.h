// The job and task state machines of the leader (docs/architecture.md, "The leader"):
// the states as enums, and the one table of which transitions are legal. Their string
// forms ("running", "exited", ...) exist only at the JSON boundary: `dltrain status`,
// events, metrics labels and the stored job records, whose spelling is unchanged.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/enum_names.h"
#include "common/errors.h"
#include "wire/task_kind.h"

namespace dltrain::leader {

/// PS shard or worker (wire/task_kind.h).
using wire::TaskKind;

/// A job's life (docs/operations.md, "Job states"): queued → starting → running →
/// finishing → succeeded, with planning and exploring before the queue for automatic
/// jobs, recovering between generations, and failing / cancelling while its tasks stop
/// on the way to failed / cancelled. succeeded, failed and cancelled are terminal.
enum class JobState {
  kQueued,
  kPlanning,
  kExploring,
  kStarting,
  kRunning,
  kRecovering,
  kFinishing,
  kFailing,
  kCancelling,
  kSucceeded,
  kFailed,
  kCancelled,
};

/// One task's life in its current generation: pending (not yet sent) → starting (sent
/// to its agent) → running (it reported itself) → exited; a restarted task starts again.
enum class TaskState { kPending, kStarting, kRunning, kExited };

/// Every job state and task state, in declaration order (for tests and metrics).
inline constexpr JobState kJobStates[] = {
    JobState::kQueued,     JobState::kPlanning,  JobState::kExploring, JobState::kStarting,
    JobState::kRunning,    JobState::kRecovering, JobState::kFinishing, JobState::kFailing,
    JobState::kCancelling, JobState::kSucceeded, JobState::kFailed,    JobState::kCancelled};
inline constexpr TaskState kTaskStates[] = {TaskState::kPending, TaskState::kStarting, TaskState::kRunning,
                                            TaskState::kExited};

}  // namespace dltrain::leader

namespace dltrain {
template <>
struct EnumNames<leader::JobState> {
  using S = leader::JobState;
  static constexpr std::array<EnumName<S>, 12> kNames{{
      {S::kQueued, "queued"},
      {S::kPlanning, "planning"},
      {S::kExploring, "exploring"},
      {S::kStarting, "starting"},
      {S::kRunning, "running"},
      {S::kRecovering, "recovering"},
      {S::kFinishing, "finishing"},
      {S::kFailing, "failing"},
      {S::kCancelling, "cancelling"},
      {S::kSucceeded, "succeeded"},
      {S::kFailed, "failed"},
      {S::kCancelled, "cancelled"},
  }};
};
template <>
struct EnumNames<leader::TaskState> {
  using S = leader::TaskState;
  static constexpr std::array<EnumName<S>, 4> kNames{
      {{S::kPending, "pending"}, {S::kStarting, "starting"}, {S::kRunning, "running"}, {S::kExited, "exited"}}};
};
}  // namespace dltrain

namespace dltrain::leader {

/// succeeded, failed or cancelled.
bool terminal(JobState s);

/// Whether a job may move from `from` to `to`:
///   queued → starting | exploring;  planning → queued | exploring;  exploring → queued (planned);
///   starting → running | recovering | finishing;  running → recovering | finishing;
///   recovering → starting;  finishing → succeeded;
///   every other non-terminal state also → failing | cancelling | failed | cancelled (a
///   job can fail or be cancelled anywhere: the -ing forms while its tasks stop, the
///   terminal forms when it has none running);  failing → failed only; cancelling →
///   cancelled only. Nothing leaves a terminal state; `from` == `to` is no transition
///   (false). Pure.
bool legal_transition(JobState from, JobState to);
/// pending → starting | exited; starting → running | exited; running → exited;
/// exited → starting (a task started again: a new generation or a restart). Pure.
bool legal_transition(TaskState from, TaskState to);

/// A transition legal_transition forbids: a bug of the leader, never of the user. The
/// caller handles it (the job stays as it was); its message names the job's states.
class IllegalTransition : public Error {
 public:
  using Error::Error;
};

/// A job's life: its state and the terminal state it is headed for (succeeded, failed or
/// cancelled) once every task has exited. The only code that changes either: every
/// transition is checked against legal_transition. Plain value; not thread-safe.
class JobLifecycle {
 public:
  /// A new job's state: queued, or planning for one whose resources the planner chooses.
  explicit JobLifecycle(JobState initial = JobState::kQueued) : state_(initial) {}
  /// The state and target of a stored job record, taken as they are (a restore, not a
  /// transition). Throws ConfigError("failing_state") for a target that is not terminal.
  static JobLifecycle restored(JobState state, std::optional<JobState> target);

  JobState state() const { return state_; }
  /// The terminal state the job enters when its tasks have exited; nullopt while it is
  /// not ending.
  std::optional<JobState> target() const { return target_; }
  bool terminal() const { return leader::terminal(state_); }
  /// Whether the job is on its way to an end (a target is set) or has ended.
  bool ending() const { return target_.has_value() || terminal(); }

  /// Moves to `to`. Returns false when the job is in `to` already (no change); throws
  /// IllegalTransition when legal_transition forbids it, leaving the job as it was.
  bool move_to(JobState to);
  /// Sets the terminal state the job ends in (replacing an earlier target: a cancel of a
  /// finishing job) and, with `via`, moves to that -ing state while its tasks stop
  /// (failing, finishing, cancelling; move_to's rules). Throws InvalidArgument for a
  /// `target` that is not terminal, IllegalTransition as move_to.
  void head_for(JobState target, std::optional<JobState> via = std::nullopt);
  /// Enters the target. Throws IllegalTransition when there is none or it is not legal.
  void finish();
  /// A restored job that could not be resumed fails where it stands: it was never live in
  /// this leader, so there is no transition to check and no one to tell.
  void fail_restored() { state_ = JobState::kFailed; }

 private:
  JobState state_;
  std::optional<JobState> target_;
};

/// The string forms: "queued", ..., "cancelled"; "pending", ..., "exited".
std::string_view to_string(JobState s);
std::string_view to_string(TaskState s);
/// The state named `s`; nullopt for any other string.
std::optional<JobState> parse_job_state(std::string_view s);
std::optional<TaskState> parse_task_state(std::string_view s);

/// JSON forms (a string). from_json throws InvalidArgument naming the value for an
/// unknown state, and nlohmann's type_error for a non-string.
void to_json(nlohmann::json& j, JobState s);
void from_json(const nlohmann::json& j, JobState& s);
void to_json(nlohmann::json& j, TaskState s);
void from_json(const nlohmann::json& j, TaskState& s);

}  // namespace dltrain::leader
