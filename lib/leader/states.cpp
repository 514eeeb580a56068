#include "leader/states.h"

#include <array>
#include <utility>

#include "common/errors.h"

namespace dltrain::leader {

bool terminal(JobState s) { return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled; }

bool legal_transition(JobState from, JobState to) {
  using S = JobState;
  if (from == to || terminal(from)) return false;
  if (from == S::kFailing) return to == S::kFailed;
  if (from == S::kCancelling) return to == S::kCancelled;
  if (to == S::kFailing || to == S::kCancelling || to == S::kFailed || to == S::kCancelled) return true;
  switch (from) {
    case S::kQueued:
      return to == S::kStarting || to == S::kExploring;  // an automatic job explores from the queue
    case S::kPlanning:
      return to == S::kQueued || to == S::kExploring;
    case S::kExploring:
      return to == S::kQueued;
    case S::kStarting:
      return to == S::kRunning || to == S::kRecovering || to == S::kFinishing;
    case S::kRunning:
      return to == S::kRecovering || to == S::kFinishing;
    case S::kRecovering:
      return to == S::kStarting;
    case S::kFinishing:
      return to == S::kSucceeded;
    default:
      return false;
  }
}

bool legal_transition(TaskState from, TaskState to) {
  using S = TaskState;
  switch (from) {
    case S::kPending:
      return to == S::kStarting || to == S::kExited;
    case S::kStarting:
      return to == S::kRunning || to == S::kExited;
    case S::kRunning:
      return to == S::kExited;
    case S::kExited:
      return to == S::kStarting;
  }
  return false;
}

JobLifecycle JobLifecycle::restored(JobState state, std::optional<JobState> target) {
  if (target && !leader::terminal(*target)) {
    throw ConfigError("failing_state", "\"" + std::string(to_string(*target)) + "\" is not a terminal state");
  }
  JobLifecycle l(state);
  l.target_ = target;
  return l;
}

bool JobLifecycle::move_to(JobState to) {
  if (state_ == to) return false;
  if (!legal_transition(state_, to)) {
    throw IllegalTransition("illegal state transition " + std::string(to_string(state_)) + " -> " +
                            std::string(to_string(to)) + " refused");
  }
  state_ = to;
  return true;
}

void JobLifecycle::head_for(JobState target, std::optional<JobState> via) {
  if (!leader::terminal(target)) {
    throw InvalidArgument("a job heads for a terminal state, not \"" + std::string(to_string(target)) + "\"");
  }
  if (via && via != state_ && !legal_transition(state_, *via)) {
    throw IllegalTransition("illegal state transition " + std::string(to_string(state_)) + " -> " +
                            std::string(to_string(*via)) + " refused");
  }
  target_ = target;
  if (via) state_ = *via;
}

void JobLifecycle::finish() {
  if (!target_) throw IllegalTransition("job in state " + std::string(to_string(state_)) + " has no end to enter");
  move_to(*target_);
}

std::string_view to_string(JobState s) { return enum_name(s); }
std::string_view to_string(TaskState s) { return enum_name(s); }
std::optional<JobState> parse_job_state(std::string_view s) { return enum_from_name<JobState>(s); }
std::optional<TaskState> parse_task_state(std::string_view s) { return enum_from_name<TaskState>(s); }

void to_json(nlohmann::json& j, JobState s) { j = std::string(to_string(s)); }
void to_json(nlohmann::json& j, TaskState s) { j = std::string(to_string(s)); }

void from_json(const nlohmann::json& j, JobState& s) {
  const auto text = j.get<std::string>();
  const auto v = parse_job_state(text);
  if (!v) throw InvalidArgument("job state: unknown state \"" + text + "\"");
  s = *v;
}

void from_json(const nlohmann::json& j, TaskState& s) {
  const auto text = j.get<std::string>();
  const auto v = parse_task_state(text);
  if (!v) throw InvalidArgument("task state: unknown state \"" + text + "\"");
  s = *v;
}

}  // namespace dltrain::leader
