#include "wire/task_kind.h"

#include "common/errors.h"

namespace dltrain::wire {

std::string_view to_string(TaskKind k) { return enum_name(k); }

std::optional<TaskKind> parse_task_kind(std::string_view s) { return enum_from_name<TaskKind>(s); }

void to_json(nlohmann::json& j, TaskKind k) { j = std::string(to_string(k)); }

void from_json(const nlohmann::json& j, TaskKind& k) {
  const auto s = j.get<std::string>();
  const auto parsed = parse_task_kind(s);
  if (!parsed) throw InvalidArgument("task kind: expected ps or worker, got \"" + s + "\"");
  k = *parsed;
}

}  // namespace dltrain::wire
