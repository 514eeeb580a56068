// What a task is: a PS shard or a worker. One enum for the agent and the leader; its
// string form ("ps", "worker") exists only at the JSON boundary (messages, events, the
// stored job records).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/enum_names.h"

namespace dltrain::wire {

enum class TaskKind { kPs, kWorker };

}  // namespace dltrain::wire

namespace dltrain {
template <>
struct EnumNames<wire::TaskKind> {
  static constexpr std::array<EnumName<wire::TaskKind>, 2> kNames{
      {{wire::TaskKind::kPs, "ps"}, {wire::TaskKind::kWorker, "worker"}}};
};
}  // namespace dltrain

namespace dltrain::wire {

/// "ps" or "worker".
std::string_view to_string(TaskKind k);
/// The kind named `s`; nullopt for any other string.
std::optional<TaskKind> parse_task_kind(std::string_view s);

/// JSON forms (a string). from_json throws InvalidArgument naming the value for a string
/// that is neither "ps" nor "worker", and nlohmann's type_error for a non-string.
void to_json(nlohmann::json& j, TaskKind k);
void from_json(const nlohmann::json& j, TaskKind& k);

}  // namespace dltrain::wire
