#include "leader/states.h"

#include <array>
#include <utility>

#include "common/errors.h"

namespace dltrain::leader {
namespace {

constexpr std::array<std::pair<JobState, std::string_view>, 12> kJobNames{{
    {JobState::kQueued, "queued"},
    {JobState::kPlanning, "planning"},
    {JobState::kExploring, "exploring"},
    {JobState::kStarting, "starting"},
    {JobState::kRunning, "running"},
    {JobState::kRecovering, "recovering"},
    {JobState::kFinishing, "finishing"},
    {JobState::kFailing, "failing"},
    {JobState::kCancelling, "cancelling"},
    {JobState::kSucceeded, "succeeded"},
    {JobState::kFailed, "failed"},
    {JobState::kCancelled, "cancelled"},
}};
constexpr std::array<std::pair<TaskState, std::string_view>, 4> kTaskNames{{
    {TaskState::kPending, "pending"},
    {TaskState::kStarting, "starting"},
    {TaskState::kRunning, "running"},
    {TaskState::kExited, "exited"},
}};

template <typename E, std::size_t N>
std::string_view name_of(const std::array<std::pair<E, std::string_view>, N>& names, E e) {
  for (const auto& [v, n] : names) {
    if (v == e) return n;
  }
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> value_of(const std::array<std::pair<E, std::string_view>, N>& names, std::string_view s) {
  for (const auto& [v, n] : names) {
    if (n == s) return v;
  }
  return std::nullopt;
}

}  // namespace

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

std::string_view to_string(JobState s) { return name_of(kJobNames, s); }
std::string_view to_string(TaskState s) { return name_of(kTaskNames, s); }
std::optional<JobState> parse_job_state(std::string_view s) { return value_of(kJobNames, s); }
std::optional<TaskState> parse_task_state(std::string_view s) { return value_of(kTaskNames, s); }

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
