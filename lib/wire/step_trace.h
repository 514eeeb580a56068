// Step timeline (`dltrain trace`): a worker's last steps, phase by phase. The worker keeps
// a bounded ring of per-step timestamps (StepTraceRing) and writes it, every few seconds
// and when it ends, to a small JSON file in its task directory (write_step_trace, an
// atomic replace); the client reads that file through the leader and the task's agent
// and turns it into the Chrome trace-event format (chrome_trace), the format of
// Horovod's timeline, which chrome://tracing and Perfetto open. No LibTorch here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dltrain::wire {

/// The phases of one worker step, in the order they happen (lib/train/worker_loop.h,
/// WorkerLoop::step):
///   data      — the batch's images and labels gathered from the worker's shard
///   forward   — the model's forward pass and the loss
///   backward  — the backward pass and the gradient copied into one flat vector
///   compress  — weight decay and the encoder's top-k selection (0 µs for a dense job)
///   push_pull — the exchange with the PS shards: the push and the pull are one round
///               trip per shard (the pull's reply follows the push), so they are one phase;
///               a resync after a lost shard is counted here too
///   apply     — the pulled parameters written into the model
/// A skipped step (NaN/Inf gradient) ends after backward and is not recorded.
enum class StepPhase : std::uint8_t { kData, kForward, kBackward, kCompress, kPushPull, kApply };
inline constexpr std::size_t kStepPhases = 6;

/// The phase's name as the trace shows it ("data", "forward", ...).
std::string_view phase_name(StepPhase p);

/// One step: its global step number (1-based) and kStepPhases + 1 timestamps,
/// microseconds since the Unix epoch: `t[i]` is where phase i begins, `t[kStepPhases]`
/// where the step ends; non-decreasing.
struct StepRecord {
  std::int64_t step = 0;
  std::array<std::int64_t, kStepPhases + 1> t{};
};

/// A bounded ring of the last `capacity` steps. Memory: capacity × 64 bytes, allocated
/// once; push() is O(1) and never allocates. Not thread-safe (the training thread owns it).
class StepTraceRing {
 public:
  /// Throws InvalidArgument for capacity 0.
  explicit StepTraceRing(std::size_t capacity);
  /// Adds `r`, dropping the oldest step when full.
  void push(const StepRecord& r);
  /// The last min(n, size()) steps, oldest first.
  std::vector<StepRecord> last(std::size_t n) const;
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return ring_.size(); }

 private:
  std::vector<StepRecord> ring_;
  std::size_t next_ = 0, size_ = 0;
};

/// The file a worker writes: {"format": "dltrain-step-trace", "version": 1, "task":
/// "worker-0", "phases": [names], "steps": [[step, t0, ..., t6], ...]} (oldest first).
nlohmann::json step_trace_json(const std::string& task, const std::vector<StepRecord>& steps);

/// Writes `doc` to `path` atomically: to `path`.tmp, then rename(2) over `path`, so a
/// reader sees the old file or the new one, never half of one. Throws IoError naming the
/// path.
void write_step_trace(const std::string& path, const nlohmann::json& doc);

/// One task's steps as read back from its file.
struct TaskTrace {
  std::string task;                ///< "worker-0"
  std::vector<StepRecord> steps;   ///< oldest first
};

/// Parses a file written by write_step_trace (its text). Throws ProtocolError naming
/// `source` and the problem (not JSON, another format or version, a step with the wrong
/// number of timestamps or decreasing ones).
TaskTrace parse_step_trace(const std::string& text, const std::string& source);

/// The Chrome trace-event document ("JSON Object Format" of the Trace Event Format,
/// Google, 2016) of the last `last_n` steps of each task: per task a process (pid 1, 2,
/// ... in the order given) named by a "process_name" metadata event and its one thread
/// ("step loop", tid 1); per step a complete event ("ph": "X") named "step" spanning it
/// (args: step) and one complete event per phase inside it (cat "phase", args: step).
/// `ts`/`dur` are microseconds; `ts` counts from the earliest timestamp of the document
/// (its Unix time, µs, is in "otherData": {"start_unix_us"}), so timelines of several
/// workers line up as their clocks do. displayTimeUnit "ms".
nlohmann::json chrome_trace(const std::vector<TaskTrace>& tasks, std::size_t last_n);

}  // namespace dltrain::wire
