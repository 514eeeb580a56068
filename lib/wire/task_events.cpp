#include "wire/task_events.h"

#include "wire/task_event.h"

#include "common/errors.h"
#include "wire/control.h"

#include <csignal>

namespace dltrain::wire::events {

TaskError TaskError::of(const std::exception& e) {
  TaskError t;
  t.message = e.what();
  if (dynamic_cast<const DivergedError*>(&e) != nullptr) {
    t.cause = "divergence";
  } else if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
    t.cause = "timeout";
  } else if (dynamic_cast<const ConfigError*>(&e) != nullptr) {
    t.cause = "config";
  }
  return t;
}

namespace {

// `out` = E read from `ev` when `kind` is E's and nothing matched before.
template <typename E>
void read_if(const std::string& kind, const nlohmann::json& ev, std::optional<TaskEvent>& out) {
  if (!out && kind == E::kKind) out = E::from_json(ev);
}

}  // namespace

std::optional<TaskEvent> parse_task_event(const nlohmann::json& ev, TaskKind from) {
  const std::string kind = kind_of(ev);
  if (kind == WorkerStopped::kKind) {  // the one kind two task types share
    if (from == TaskKind::kPs) return PsStopped::from_json(ev);
    return WorkerStopped::from_json(ev);
  }
  std::optional<TaskEvent> out;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (read_if<std::variant_alternative_t<I, TaskEvent>>(kind, ev, out), ...);
  }(std::make_index_sequence<std::variant_size_v<TaskEvent>>{});
  return out;
}

std::string kind_of(const nlohmann::json& ev) {
  if (!ev.is_object()) return "";
  const auto it = ev.find("event");
  return it != ev.end() && it->is_string() ? it->get<std::string>() : std::string();
}

nlohmann::json event_of_line(const std::string& line) {
  try {
    auto ev = parse_peer_json(line);
    if (ev.is_object()) return ev;
  } catch (const ProtocolError&) {
  }
  return LogLine{{}, line}.to_json();
}

void write_line(std::ostream& out, const nlohmann::json& ev) { out << ev.dump() << '\n' << std::flush; }

Nullable<double> ratio_or_null(double dense, double actual) {
  if (actual <= 0) return {};
  return dense / actual;
}

void Summary::set_ratios(const Traffic& t, bool after_warmup) {
  auto& total = after_warmup ? compression_ratio_after_warmup : compression_ratio;
  auto& up = after_warmup ? compression_ratio_up_after_warmup : compression_ratio_up;
  auto& down = after_warmup ? compression_ratio_down_after_warmup : compression_ratio_down;
  total = t.ratio();
  up = ratio_or_null(static_cast<double>(t.dense_up), static_cast<double>(t.up));
  down = ratio_or_null(static_cast<double>(t.dense_down), static_cast<double>(t.down));
}

std::string classify_exit(int exit_code, int signal, const std::string& reported, bool oom_killed) {
  if (!reported.empty()) return reported;
  if (signal == SIGKILL && oom_killed) return "oom";
  if (signal != 0) return "signal";
  if (exit_code == 126) return "start";
  return "exit_code";
}

}  // namespace dltrain::wire::events
