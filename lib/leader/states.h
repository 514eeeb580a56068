// The job and task state machines of the leader (docs/architecture.md, "The leader"):
// the states as enums, and the one table of which transitions are legal. Their string
// forms ("running", "exited", ...) exist only at the JSON boundary: `dltrain status`,
// events, metrics labels and the stored job records, whose spelling is unchanged.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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
