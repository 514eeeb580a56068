// What the control-plane load tool measures: latency samples per request kind, errors by
// category, and a process's memory and CPU time read from /proc. Single-threaded: the
// tool runs one event loop and records from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dltrain::load {

/// Latency samples (milliseconds) per kind ("heartbeat", "status", ...).
class Latencies {
 public:
  /// Adds one sample of `kind`, in milliseconds (>= 0).
  void add(const std::string& kind, double ms) { samples_[kind].push_back(ms); }
  /// Samples of `kind` so far (0 for an unknown kind).
  std::size_t count(const std::string& kind) const;
  /// {"kind": {"n", "mean", "p50", "p90", "p99", "max"}} for every kind, in milliseconds.
  /// Percentiles are nearest-rank (the smallest sample with at least p % of the samples at
  /// or below it).
  nlohmann::json to_json() const;

 private:
  std::map<std::string, std::vector<double>> samples_;
};

/// Nearest-rank percentile `p` in [0, 100] of `v` (sorted in place); 0 for an empty `v`.
double percentile(std::vector<double>& v, double p);

/// Errors by category ("timeout:status", "error_reply:submit:invalid_job",
/// "session_closed:agent", ...) with the first few messages kept as examples.
class Errors {
 public:
  /// Counts one error of `category`; `detail` is kept when fewer than kExamples were.
  void add(const std::string& category, const std::string& detail);
  /// All errors so far.
  std::uint64_t total() const { return total_; }
  /// {"total", "by_category": {category: count}, "examples": ["category: detail", ...]}.
  nlohmann::json to_json() const;

  static constexpr std::size_t kExamples = 20;

 private:
  std::uint64_t total_ = 0;
  std::map<std::string, std::uint64_t> by_category_;
  std::vector<std::string> examples_;
};

/// One reading of a process from /proc/PID/status and /proc/PID/stat.
struct ProcSample {
  std::chrono::steady_clock::time_point at;  ///< when it was read
  double rss_mb = 0;        ///< VmRSS, MiB
  double hwm_mb = 0;        ///< VmHWM (peak resident set so far), MiB
  double cpu_seconds = 0;   ///< utime + stime, seconds (every thread)
  int threads = 0;          ///< Threads
};

/// Reads process `pid` (0 = this process); nullopt when it is gone or /proc is unreadable.
std::optional<ProcSample> read_proc(int pid);

/// The machine's CPU time from the first line of /proc/stat, seconds summed over cores.
struct MachineCpu {
  std::chrono::steady_clock::time_point at;
  double busy = 0;   ///< user, nice, system, irq, softirq, steal
  double total = 0;  ///< busy plus idle and iowait
};
/// Reads /proc/stat; nullopt when unreadable.
std::optional<MachineCpu> read_machine_cpu();

/// CPU use between two samples of one process, in percent of one core (100 = one core
/// fully busy); 0 when no time passed.
double cpu_percent(const ProcSample& from, const ProcSample& to);

}  // namespace dltrain::load
