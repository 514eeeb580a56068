// The worker's step loop (internal to lib/train: run_worker in trainer.h is its API).
// WorkerLoop runs the epochs and the steps; its parts own their state and are classes of
// their own:
//   model_replica.h      the model as flat parameter and gradient vectors (ModelReplica)
//   ps_exchange.h/.cpp   the exchange with the PS shards, overlap's hooks, pipelined pulls
//   step_reporter.h/.cpp losses, skipped steps, the progress window, the step timeline
//   group_step.h/.cpp    the local group (docs/gpu.md): its sum, member 0's exchange
// and WorkerLoop's own members are defined in
//   trainer.cpp          the run: data and model, connection, epochs, the step and its gradient
//   group_step.cpp       the step in a local group
//   worker_end.cpp       events, evaluation, checkpoints, stopping, the end of the run
// Its CPU/GPU differences are behind two interfaces (train/backends.h: the local group's
// reduction and the device push encoder), chosen once in backends.cpp.
// Not thread-safe: one training thread owns a WorkerLoop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "train/data_feed.h"
#include "train/group_step.h"
#include "train/model_replica.h"
#include "train/models.h"
#include "train/ps_exchange.h"
#include "train/step_reporter.h"
#include "train/trainer.h"
#include "wire/task_events.h"

namespace dltrain::train::detail {

/// One worker's run: its data, model, PS exchange and reports, and the step loop of the
/// sparse bidirectional method (docs/compression.md): per step, forward and backward on
/// the local batch, then either a dense push_pull, or the compressor's top-k push
/// (momentum correction, error feedback) and the PS's sparse downlink of what changed
/// since this worker's last pull.
class WorkerLoop {
 public:
  WorkerLoop(const WorkerConfig& cfg, const ProgressSink& sink)
      : cfg_(cfg), spec_(cfg.spec), sink_(sink), rep_(cfg, sink), ex_(cfg, replica_, rep_) {}

  /// Trains until the job's epochs (or max_steps) are done; returns rank 0's final test
  /// accuracy (-1 on the other ranks). Throws Stopped, DivergedError, TimeoutError and
  /// the PS client's errors (trainer.h, run_worker).
  double run();

 private:
  /// Where a step stands and what it sends: epoch and step within it (from 0), training
  /// position (fractional epochs), learning rate, uplink and downlink densities.
  struct StepPlan {
    int epoch = 0;
    std::int64_t step = 0;
    double pos = 0;
    float lr = 0;
    double density = 1, downlink = 1;
  };

  // The run and its steps (trainer.cpp).
  void load();
  void connect();
  void set_resume_point();
  void started();
  void run_epoch(int epoch);
  void step(const StepPlan& s, const torch::Tensor& xb, const torch::Tensor& yb);
  void group_step(const StepPlan& s, const torch::Tensor& xb, const torch::Tensor& yb);  // group_step.cpp
  void finish_step(std::int64_t images, double loss, const StepPlan& s);
  double compute_gradient(const torch::Tensor& xb, const torch::Tensor& yb);
  double compute_gradient_overlapped(const torch::Tensor& xb, const torch::Tensor& yb, const StepPlan& s);
  void end_compute(Clock::time_point t1, Clock::time_point t2);
  bool finite_step(double loss, const StepPlan& s);
  void check_stop() const {
    if (cfg_.stop_requested != nullptr && cfg_.stop_requested->load(std::memory_order_relaxed)) {
      throw ps::StopRequested("the worker was asked to stop");
    }
  }

  // Events, evaluation, the end of the run (worker_end.cpp).
  void report_skipped_images();
  void maybe_report(const StepPlan& s);
  void profiled();
  void end_epoch(int epoch, double epoch_seconds, double epoch_wait);
  void evaluate_on_test(wire::events::EpochEnd& ev);
  [[noreturn]] void stopped();
  /// Thrown at a step boundary when cfg.leave_requested is set (caught in run()).
  struct LeaveRequested {};
  /// An elastic job's worker leaves (WorkerConfig::leave_requested): the shards stop
  /// waiting for it, its unfinished chunks go back, it reports "left".
  void left();
  /// Rank 0: the model it last evaluated, as checkpoint `checkpoint` ("last", "best",
  /// "epoch-N"), into cfg_.artifact_dir ("last") or the directory beside it named
  /// model-<checkpoint>.
  void save_artifact(const std::string& checkpoint) noexcept;
  /// Rank 0 after an evaluation: the [checkpoint] models the job asks for.
  void save_checkpoints(int epoch) noexcept;
  /// The checkpoints written beside "last" (directories model-<name> with a metadata.json).
  std::vector<std::string> written_checkpoints() const;
  void done();
  /// The counters the reports carry: the reporter's, with the exchange's resyncs.
  wire::events::StepCounters counters() {
    auto c = rep_.counters();
    c.resyncs = ex_.resyncs();
    return c;
  }

  const WorkerConfig& cfg_;
  const JobSpec& spec_;
  const ProgressSink& sink_;
  const Clock::time_point t_start_ = Clock::now();
  torch::Device device_{torch::kCPU};  // where the model trains (spec.device)
  std::unique_ptr<DataFeed> feed_;     // this worker's batches (train/data_feed.h)
  torch::Generator gen_;
  Model model_;
  ModelReplica replica_;  // the model's flat parameters and gradient, the step count
  StepReporter rep_;
  PsExchange ex_;
  LocalGroupStep grp_;
  // Where the run is.
  std::int64_t n_ = 0, steps_per_epoch_ = 1;
  int first_epoch_ = 0, epochs_finished_ = 0;
  int resume_epoch_ = 0;  // cfg.resume_epoch, or the group's agreed one
  double final_accuracy_ = -1.0;
  double best_accuracy_ = -1.0;  ///< of the "best" checkpoint written (-1: none yet)
  double last_density_ = 1.0;
  bool stop_ = false;
};

}  // namespace dltrain::train::detail
