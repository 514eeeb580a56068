// StepReporter (train/step_reporter.h): a worker's losses, skipped steps, progress
// window and step timeline.
#include "train/step_reporter.h"

#include <cmath>

#include <spdlog/spdlog.h>

#include "common/errors.h"

namespace dltrain::train::detail {

void StepReporter::begin_epoch() {
  loss_sum_ = 0;
  loss_count_ = 0;
  recent_loss_ = 0;  // a progress event's loss is the mean since the last one in this epoch
  recent_count_ = 0;
}

void StepReporter::add_step(std::int64_t images, double loss, std::int64_t global_step) {
  if (global_step == kProfileWarmupSteps) t_profile_ = Clock::now();
  if (global_step > kProfileWarmupSteps) profile_images_ += images;
  loss_sum_ += loss;
  ++loss_count_;
  recent_loss_ += loss;
  ++recent_count_;
  images_since_report_ += images;
  counters_.images += images;
  ++counters_.steps;
}

// A NaN/Inf loss or gradient is never pushed: the step is skipped and counted; too many
// in a row end the worker (the model diverged).
bool StepReporter::check_finite(bool finite, double loss, int epoch, std::int64_t step) {
  if (finite) {
    consecutive_skips_ = 0;
    return true;
  }
  ++skipped_steps_;
  if (++consecutive_skips_ > kMaxConsecutiveSkips) {
    throw DivergedError("worker " + std::to_string(cfg_.rank) + ": " + std::to_string(consecutive_skips_) +
                        " consecutive steps had a NaN/Inf loss or gradient (epoch " + std::to_string(epoch + 1) +
                        ", step " + std::to_string(step + 1) +
                        "); the model diverged: lower optimizer.lr or set compression.clip_norm");
  }
  wire::events::SkippedStep ev;
  ev.rank = cfg_.rank;
  ev.epoch = epoch + 1;
  ev.step = step + 1;
  if (std::isfinite(loss)) ev.loss = loss;
  ev.skipped_steps = skipped_steps_;
  sink_(ev.to_json());
  return false;
}

double StepReporter::take_progress(wire::events::Progress& ev) {
  const double since = seconds_since(last_report_);
  if (since < cfg_.progress_interval_s) return 0;
  ev.loss = recent_loss_ / static_cast<double>(recent_count_);
  ev.images_per_sec = static_cast<double>(images_since_report_) / since;
  last_report_ = Clock::now();
  images_since_report_ = 0;
  recent_loss_ = 0;
  recent_count_ = 0;
  return since;
}

void StepReporter::fill_profile(wire::events::Profile& ev) const {
  const double secs = t_profile_ == Clock::time_point{} ? 0.0 : seconds_since(t_profile_);
  ev.measured_images = profile_images_;
  ev.measured_seconds = secs;
  ev.images_per_sec = secs > 0 ? static_cast<double>(profile_images_) / secs : 0.0;
}

void StepReporter::end_step() {
  const auto now = Clock::now();
  step_.t[wire::kStepPhases] = unix_us(now);
  trace_.push(step_);
  if (!cfg_.trace_path.empty() && std::chrono::duration<double>(now - last_trace_write_).count() >= cfg_.trace_interval_s) {
    write_trace();
    last_trace_write_ = now;
  }
}

void StepReporter::write_trace() noexcept {
  if (cfg_.trace_path.empty() || trace_.size() == 0) return;
  try {
    wire::write_step_trace(cfg_.trace_path, wire::step_trace_json("worker-" + std::to_string(cfg_.rank), trace_.last(trace_.size())));
  } catch (const std::exception& e) {
    if (!trace_warned_) spdlog::warn("the step timeline is not kept: {}", e.what());
    trace_warned_ = true;
  }
}

}  // namespace dltrain::train::detail
