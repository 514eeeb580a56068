// What a worker says of its steps (internal to lib/train): the losses and counters its
// progress, epoch and done events carry, its skipped steps, the exploration run's
// measured window, and the step timeline (wire/step_trace.h). WorkerLoop owns one; its
// PsExchange adds the exchange's seconds to the counters and marks the timeline.
// Not thread-safe: the training thread owns it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "train/model_replica.h"
#include "train/trainer.h"
#include "wire/step_trace.h"
#include "wire/task_events.h"

namespace dltrain::train::detail {

/// The losses, counters, skipped steps and step timeline of one worker's run.
class StepReporter {
 public:
  /// Consecutive skipped steps (a NaN/Inf loss or gradient) after which the model counts
  /// as diverged.
  static constexpr std::int64_t kMaxConsecutiveSkips = 20;
  /// An exploration run measures its speed after these steps (the first ones pay for
  /// allocation and warm-up).
  static constexpr std::int64_t kProfileWarmupSteps = 5;

  /// Events go to `sink` as worker `cfg.rank`'s; the timeline keeps cfg.trace_steps steps
  /// (clamped to [1, 4096]) and is written to cfg.trace_path ("" = not kept) every
  /// cfg.trace_interval_s seconds. `cfg` and `sink` must outlive the reporter.
  StepReporter(const WorkerConfig& cfg, const ProgressSink& sink)
      : cfg_(cfg), sink_(sink), trace_(std::clamp<std::size_t>(cfg.trace_steps, 1, 4096)) {}

  /// Cumulative this process (the caller adds the resyncer's resyncs when it reports).
  wire::events::StepCounters& counters() { return counters_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }

  /// The run begins: the first progress event comes cfg.progress_interval_s from now.
  void started() { last_report_ = Clock::now(); }
  /// An epoch begins: its loss and the next progress event's are summed afresh.
  void begin_epoch();
  /// Mean loss of the epoch's finished steps (0 before any).
  double epoch_loss() const { return loss_sum_ / static_cast<double>(std::max<std::int64_t>(1, loss_count_)); }
  /// A step finished with `images` images and loss `loss`; `global_step` is its count
  /// over the run (from 1), which opens the exploration run's window after
  /// kProfileWarmupSteps.
  void add_step(std::int64_t images, double loss, std::int64_t global_step);
  /// Whether step `step` of epoch `epoch` (both from 0) may be pushed: `finite` says the
  /// loss and gradient were. A step that may not is counted and sent as a skipped_step
  /// event. Throws DivergedError after kMaxConsecutiveSkips in a row.
  bool check_finite(bool finite, double loss, int epoch, std::int64_t step);
  /// When cfg.progress_interval_s passed since the last one: fills the progress event's
  /// loss (mean since the last) and images_per_sec, starts the next interval and returns
  /// the seconds since the last; 0 when none is due.
  double take_progress(wire::events::Progress& ev);
  /// The data wait since the last call (`wait` cumulative, seconds).
  double wait_since_report(double wait) {
    const double d = wait - wait_at_report_;
    wait_at_report_ = wait;
    return d;
  }
  /// The exploration run's window: images and seconds since kProfileWarmupSteps.
  void fill_profile(wire::events::Profile& ev) const;

  /// The step timeline: step `number` (from 1) begins; phase `p` of it began at `t`.
  void begin_step(std::int64_t number) { step_.step = number; }
  void mark(wire::StepPhase p, Clock::time_point t) { step_.t[static_cast<std::size_t>(p)] = unix_us(t); }
  /// The step ends now: into the ring, which is written when cfg.trace_interval_s passed.
  void end_step();
  /// Writes the timeline to cfg.trace_path; a timeline that cannot be written costs the
  /// timeline, not the training: one warning.
  void write_trace() noexcept;

 private:
  // A steady-clock read on the Unix time line (so that the timelines of several workers
  // line up), through one pair of reads taken together.
  std::int64_t unix_us(Clock::time_point t) const {
    return unix_origin_us_ + std::chrono::duration_cast<std::chrono::microseconds>(t - steady_origin_).count();
  }

  const WorkerConfig& cfg_;
  const ProgressSink& sink_;
  wire::events::StepCounters counters_;
  double loss_sum_ = 0, recent_loss_ = 0;
  std::int64_t loss_count_ = 0, recent_count_ = 0, images_since_report_ = 0;
  double wait_at_report_ = 0;  // the feed's cumulative wait at the last progress event
  std::int64_t skipped_steps_ = 0, consecutive_skips_ = 0;
  Clock::time_point last_report_{}, t_profile_{};
  std::int64_t profile_images_ = 0;
  const Clock::time_point steady_origin_ = Clock::now();
  const std::int64_t unix_origin_us_ =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  wire::StepTraceRing trace_;
  wire::StepRecord step_;
  Clock::time_point last_trace_write_ = Clock::now();
  bool trace_warned_ = false;
};

}  // namespace dltrain::train::detail
