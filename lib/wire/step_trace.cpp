#include "wire/step_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/errors.h"

namespace dltrain::wire {

using json = nlohmann::json;

namespace {

constexpr std::array<std::string_view, kStepPhases> kPhaseNames{"data",     "forward",   "backward",
                                                                "compress", "push_pull", "apply"};
constexpr const char* kFormat = "dltrain-step-trace";
constexpr int kVersion = 1;

}  // namespace

std::string_view phase_name(StepPhase p) { return kPhaseNames.at(static_cast<std::size_t>(p)); }

StepTraceRing::StepTraceRing(std::size_t capacity) {
  if (capacity == 0) throw InvalidArgument("a step trace ring needs a capacity of at least 1 step");
  ring_.resize(capacity);
}

void StepTraceRing::push(const StepRecord& r) {
  ring_[next_] = r;
  next_ = (next_ + 1) % ring_.size();
  size_ = std::min(size_ + 1, ring_.size());
}

std::vector<StepRecord> StepTraceRing::last(std::size_t n) const {
  n = std::min(n, size_);
  std::vector<StepRecord> out;
  out.reserve(n);
  // The oldest of the last n is n slots behind next_.
  for (std::size_t k = n; k > 0; --k) out.push_back(ring_[(next_ + ring_.size() - k) % ring_.size()]);
  return out;
}

json step_trace_json(const std::string& task, const std::vector<StepRecord>& steps) {
  json rows = json::array();
  for (const auto& s : steps) {
    json row = json::array({s.step});
    for (const auto t : s.t) row.push_back(t);
    rows.push_back(std::move(row));
  }
  return json{{"format", kFormat}, {"version", kVersion}, {"task", task},
              {"phases", kPhaseNames}, {"steps", std::move(rows)}};
}

void write_step_trace(const std::string& path, const json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError("cannot write the step trace \"" + tmp + "\": " + std::strerror(errno));
    out << doc.dump() << '\n';
    out.flush();
    if (!out) throw IoError("cannot write the step trace \"" + tmp + "\": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw IoError("cannot rename \"" + tmp + "\" to \"" + path + "\": " + std::strerror(errno));
  }
}

TaskTrace parse_step_trace(const std::string& text, const std::string& source) {
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) throw ProtocolError(source + ": the step trace is not a JSON object");
  if (doc.value("format", "") != kFormat || doc.value("version", 0) != kVersion) {
    throw ProtocolError(source + ": not a " + kFormat + " version " + std::to_string(kVersion) + " file");
  }
  if (!doc.contains("steps") || !doc["steps"].is_array()) {
    throw ProtocolError(source + ": field \"steps\": expected an array");
  }
  TaskTrace out;
  out.task = doc.value("task", "");
  for (const auto& row : doc["steps"]) {
    const std::string where = source + ": step " + std::to_string(out.steps.size() + 1);
    if (!row.is_array() || row.size() != kStepPhases + 2) {
      throw ProtocolError(where + ": expected [step, " + std::to_string(kStepPhases + 1) + " timestamps]");
    }
    StepRecord r;
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (!row[i].is_number_integer()) throw ProtocolError(where + ": expected integers");
      const auto v = row[i].get<std::int64_t>();
      if (i == 0) {
        r.step = v;
      } else {
        r.t[i - 1] = v;
        if (i > 1 && v < r.t[i - 2]) throw ProtocolError(where + ": timestamps decrease");
      }
    }
    out.steps.push_back(r);
  }
  return out;
}

json chrome_trace(const std::vector<TaskTrace>& tasks, std::size_t last_n) {
  // The index of a task's first step shown.
  const auto first_shown = [last_n](const TaskTrace& task) {
    return task.steps.size() > last_n ? task.steps.size() - last_n : std::size_t{0};
  };
  std::int64_t origin = std::numeric_limits<std::int64_t>::max();
  for (const auto& task : tasks) {
    for (std::size_t i = first_shown(task); i < task.steps.size(); ++i) origin = std::min(origin, task.steps[i].t[0]);
  }
  if (origin == std::numeric_limits<std::int64_t>::max()) origin = 0;
  json events = json::array();
  int pid = 0;
  for (const auto& task : tasks) {
    ++pid;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", task.task}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"sort_index", pid}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "step loop"}}}});
    for (std::size_t i = first_shown(task); i < task.steps.size(); ++i) {
      const auto& s = task.steps[i];
      const json args{{"step", s.step}};
      events.push_back({{"name", "step"}, {"cat", "step"}, {"ph", "X"}, {"pid", pid}, {"tid", 1},
                        {"ts", s.t[0] - origin}, {"dur", s.t[kStepPhases] - s.t[0]}, {"args", args}});
      for (std::size_t p = 0; p < kStepPhases; ++p) {
        events.push_back({{"name", kPhaseNames[p]}, {"cat", "phase"}, {"ph", "X"}, {"pid", pid}, {"tid", 1},
                          {"ts", s.t[p] - origin}, {"dur", s.t[p + 1] - s.t[p]}, {"args", args}});
      }
    }
  }
  return json{{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"start_unix_us", origin}}}};
}

}  // namespace dltrain::wire
