// The one parse of a task's events (wire/task_events.h): a line its agent read, or an
// event the leader received, as a TaskEvent that its readers visit (std::visit with
// common/overloaded.h), and which of them the leader relays to a job's followers.
#pragma once

#include <optional>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "wire/task_events.h"
#include "wire/task_kind.h"

namespace dltrain::wire::events {

/// An event a task reports, parsed once (parse_task_event) and visited where it is used:
/// one alternative per kind a task or its agent writes. The kind "stopped" is a
/// WorkerStopped from a worker and a PsStopped from a PS shard; LogLine is a line of the
/// task's output that is not an event (event_of_line).
using TaskEvent = std::variant<Started, Progress, EpochEnd, Done, SkippedStep, DataInfo, SkippedImage, WorkerStopped,
                               Profile, ReplicaLoaded, PsResync, TaskError, Listening, PsStats, PsStopped, Restarting,
                               Left, LogLine>;

/// `ev`, reported by a task of kind `from`, as the event its "event" field names;
/// nullopt for a kind this build does not know (a task of another version). Throws
/// nlohmann::json::exception naming the field when a known kind's fields are mistyped.
std::optional<TaskEvent> parse_task_event(const nlohmann::json& ev, TaskKind from);

/// Whether followers get events of type E relayed by the leader (with "task" added): a
/// worker's progress, epochs, start and end, errors, skipped steps and images, restarts,
/// resyncs, replicas and data; not a shard's counters, its address or log lines.
template <typename E>
inline constexpr bool kRelayedToFollowers =
    std::is_same_v<E, Progress> || std::is_same_v<E, EpochEnd> || std::is_same_v<E, Started> ||
    std::is_same_v<E, Done> || std::is_same_v<E, TaskError> || std::is_same_v<E, SkippedStep> ||
    std::is_same_v<E, Restarting> || std::is_same_v<E, PsResync> || std::is_same_v<E, WorkerStopped> ||
    std::is_same_v<E, PsStopped> || std::is_same_v<E, ReplicaLoaded> || std::is_same_v<E, DataInfo> ||
    std::is_same_v<E, SkippedImage> || std::is_same_v<E, Left>;

}  // namespace dltrain::wire::events
