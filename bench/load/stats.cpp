#include "load/stats.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

namespace dltrain::load {

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::size_t Latencies::count(const std::string& kind) const {
  auto it = samples_.find(kind);
  return it == samples_.end() ? 0 : it->second.size();
}

nlohmann::json Latencies::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [kind, samples] : samples_) {
    std::vector<double> v = samples;
    const double mean = v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    out[kind] = {{"n", v.size()},
                 {"mean", mean},
                 {"p50", percentile(v, 50)},
                 {"p90", percentile(v, 90)},
                 {"p99", percentile(v, 99)},
                 {"max", v.empty() ? 0.0 : v.back()}};
  }
  return out;
}

void Errors::add(const std::string& category, const std::string& detail) {
  ++total_;
  ++by_category_[category];
  if (examples_.size() < kExamples) examples_.push_back(category + ": " + detail);
}

nlohmann::json Errors::to_json() const {
  return {{"total", total_}, {"by_category", by_category_}, {"examples", examples_}};
}

std::optional<ProcSample> read_proc(int pid) {
  const std::string dir = pid == 0 ? "/proc/self" : "/proc/" + std::to_string(pid);
  ProcSample s;
  s.at = std::chrono::steady_clock::now();
  std::ifstream status(dir + "/status");
  if (!status) return std::nullopt;
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream in(line);
    std::string key;
    double value = 0;
    in >> key >> value;
    if (key == "VmRSS:") s.rss_mb = value / 1024.0;  // kB
    if (key == "VmHWM:") s.hwm_mb = value / 1024.0;
    if (key == "Threads:") s.threads = static_cast<int>(value);
  }
  std::ifstream stat(dir + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  // The command name (field 2) is in parentheses and may hold spaces: fields are counted
  // after the last ')'. utime and stime are fields 14 and 15, in clock ticks.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
  }
  s.cpu_seconds = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return s;
}

std::optional<MachineCpu> read_machine_cpu() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  if (cpu != "cpu") return std::nullopt;
  // user nice system idle iowait irq softirq steal (guest time is inside user already).
  double v[8] = {};
  for (double& x : v) in >> x;
  if (!in) return std::nullopt;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  MachineCpu m;
  m.at = std::chrono::steady_clock::now();
  m.busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
  m.total = m.busy + (v[3] + v[4]) / tick;
  return m;
}

double cpu_percent(const ProcSample& from, const ProcSample& to) {
  const double wall = std::chrono::duration<double>(to.at - from.at).count();
  return wall <= 0 ? 0 : 100.0 * (to.cpu_seconds - from.cpu_seconds) / wall;
}

}  // namespace dltrain::load
