// The worker's step loop (internal to lib/train: run_worker in trainer.h is its API).
// One class, WorkerLoop, whose members are defined in four files along its seams, and
// whose state is grouped the same way: the data feed (feed_), the exchange with the PS
// (ex_), the reports (rep_) and the local group (grp_):
//   trainer.cpp          the run: data and model, connection, epochs, the step and its gradient
//   worker_exchange.cpp  the exchange with the PS shards, overlap's hooks and pipelined pulls
//   worker_group.cpp     local groups (docs/gpu.md): the group's sum, member 0's exchange
//   worker_reports.cpp   events, evaluation, stopping, the step timeline
// Its CPU/GPU differences are behind two interfaces (train/backends.h: the local group's
// reduction and the device push encoder), chosen once in backends.cpp.
// Not thread-safe: one training thread owns a WorkerLoop (overlap's pipelined pull runs
// on a thread of its own, ps::PendingPull from PsClient::start_pull, but touches only the
// client and ex_.replica,
// worker_exchange.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "compress/compressor.h"
#include "train/data_feed.h"
#include "ps/exchange.h"
#include "group/local_group.h"
#include "train/models.h"
#include "ps/overlap.h"
#include "wire/step_trace.h"
#include "train/backends.h"
#include "train/trainer.h"
#include "wire/task_events.h"

namespace dltrain::train::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Copies the model's parameters into / out of one flat float vector, in parameters() order.
class FlatParams {
 public:
  explicit FlatParams(torch::nn::Module& m) : params_(m.parameters()) {
    for (const auto& p : params_) {
      sizes_.push_back(p.numel());
      rows_.push_back(p.dim() >= 2 ? p.size(0) : 1);
    }
  }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  /// Each tensor's first dimension (1 for a vector): the rows of its matrix view.
  const std::vector<std::int64_t>& rows() const { return rows_; }
  std::vector<torch::Tensor>& tensors() { return params_; }
  void read_params(std::vector<float>& out) const { gather(out, false); }
  void read_grads(std::vector<float>& out) const { gather(out, true); }
  void write_params(const std::vector<float>& in) {
    torch::NoGradGuard ng;
    std::int64_t off = 0;
    for (auto& p : params_) {
      if (p.is_cuda()) {
        // The host floats to the parameter's device (one copy per tensor).
        p.copy_(torch::from_blob(const_cast<float*>(in.data() + off), p.sizes(), torch::kFloat32));
      } else {
        std::memcpy(p.data_ptr<float>(), in.data() + off, sizeof(float) * p.numel());
      }
      off += p.numel();
    }
  }

 private:
  void gather(std::vector<float>& out, bool grad) const {
    std::int64_t off = 0;
    for (const auto& p : params_) {
      const auto t = grad ? p.grad() : p;
      if (grad && !t.defined()) {
        std::fill(out.begin() + off, out.begin() + off + p.numel(), 0.0f);
      } else {
        auto c = t.to(torch::kCPU).contiguous();  // a device tensor is copied to the host
        std::memcpy(out.data() + off, c.data_ptr<float>(), sizeof(float) * p.numel());
      }
      off += p.numel();
    }
  }
  std::vector<torch::Tensor> params_;
  std::vector<std::int64_t> sizes_, rows_;
};

/// One worker's run: its data, model, PS client and counters, and the step loop of the
/// sparse bidirectional method (docs/compression.md): per step, forward and backward on
/// the local batch, then either a dense push_pull, or the compressor's top-k push
/// (momentum correction, error feedback) and the PS's sparse downlink of what changed
/// since this worker's last pull.
class WorkerLoop {
 public:
  WorkerLoop(const WorkerConfig& cfg, const ProgressSink& sink)
      : cfg_(cfg), spec_(cfg.spec), sink_(sink), rep_(std::clamp<std::size_t>(cfg.trace_steps, 1, 4096)) {}

  /// Trains until the job's epochs (or max_steps) are done; returns rank 0's final test
  /// accuracy (-1 on the other ranks). Throws Stopped, DivergedError, TimeoutError and
  /// the PS client's errors (trainer.h, run_worker).
  double run();

 private:
  static constexpr std::int64_t kMaxConsecutiveSkips = 20;
  static constexpr std::int64_t kProfileWarmupSteps = 5;  // exploration runs measure after these

  // The run and its steps (trainer.cpp).
  void load();
  void connect();
  void set_resume_point();
  void started();
  void run_epoch(int epoch);
  void step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb);
  void finish_step(std::int64_t images, double loss, int epoch, std::int64_t step, float lr, double density);
  double compute_gradient(const torch::Tensor& xb, const torch::Tensor& yb);
  void end_compute(Clock::time_point t1, Clock::time_point t2);
  bool finite_step(double loss, int epoch, std::int64_t step, bool nonfinite = false);
  void check_stop() const {
    if (cfg_.stop_requested != nullptr && cfg_.stop_requested->load(std::memory_order_relaxed)) {
      throw ps::StopRequested("the worker was asked to stop");
    }
  }

  // The exchange with the PS shards: pushes, pulls, overlap's hooks and pipelined pulls,
  // the GPU encoder's input (worker_exchange.cpp).
  void exchange(float lr, double density, double downlink, double pos);
  std::span<const ps::PartitionPush> encode_pushes(double density);
  bool device_encoder_active() const { return ex_.device_encoder != nullptr; }
  void install_push_hooks();
  void on_gradient(std::size_t i, const torch::Tensor& grad);
  void push_partition(std::uint32_t key, bool in_backward);
  double compute_gradient_overlapped(const torch::Tensor& xb, const torch::Tensor& yb);
  void start_pull(double downlink);
  void await_pull();
  void drain_pull();

  // Local groups (worker_group.cpp).
  void join_local_group();
  void group_step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb, float lr,
                  double density, double downlink, double pos);
  void skipped_group_step();

  // Events, evaluation, the end of the run and the step timeline (worker_reports.cpp).
  void report_skipped_images();
  void maybe_report(int epoch, std::int64_t step, float lr);
  void profiled();
  void end_epoch(int epoch, double epoch_seconds);
  void finish();
  void evaluate_on_test(wire::events::EpochEnd& ev);
  [[noreturn]] void stopped();
  /// Rank 0: the model it last evaluated, as checkpoint `checkpoint` ("last", "best",
  /// "epoch-N"), into cfg_.artifact_dir ("last") or the directory beside it named
  /// model-<checkpoint>.
  void save_artifact(const std::string& checkpoint) noexcept;
  /// Rank 0 after an evaluation: the [checkpoint] models the job asks for.
  void save_checkpoints(int epoch) noexcept;
  /// The checkpoints written beside "last" (directories model-<name> with a metadata.json).
  std::vector<std::string> written_checkpoints() const;
  void done();
  // The step timeline (wire/step_trace.h): phase i of the step in progress begins at
  // rep_.step.t[i]; a finished step goes into the ring, which is written to cfg_.trace_path
  // every cfg_.trace_interval_s.
  void mark(wire::StepPhase p, Clock::time_point t) { rep_.step.t[static_cast<std::size_t>(p)] = unix_us(t); }
  std::int64_t unix_us(Clock::time_point t) const {
    return rep_.unix_origin_us + std::chrono::duration_cast<std::chrono::microseconds>(t - rep_.steady_origin).count();
  }
  void end_step_trace();
  void write_trace() noexcept;
  wire::events::StepCounters counters() const {
    auto c = rep_.counters;
    c.resyncs = ex_.resyncer ? ex_.resyncer->resyncs() : 0;
    return c;
  }

  const WorkerConfig& cfg_;
  const JobSpec& spec_;
  const ProgressSink& sink_;
  const Clock::time_point t_start_ = Clock::now();
  torch::Device device_{torch::kCPU};  // where the model trains (spec.device)
  // The data feed (train/data_feed.h) and the model with its flat copy.
  std::unique_ptr<DataFeed> feed_;
  Model model_;
  std::unique_ptr<FlatParams> flat_;
  ps::PartitionLayout layout_;
  std::vector<float> params_, grads_;
  torch::Generator gen_;
  // Where the run is.
  std::int64_t n_ = 0, steps_per_epoch_ = 1;
  int first_epoch_ = 0, epochs_finished_ = 0;
  int resume_epoch_ = 0;  // cfg.resume_epoch, or the group's agreed one
  std::int64_t global_step_ = 0;
  double pulled_at_ = 0;  // when params_ last took the PS's values (Unix time, s)
  double final_accuracy_ = -1.0;
  double best_accuracy_ = -1.0;  ///< of the "best" checkpoint written (-1: none yet)
  double last_density_ = 1.0;
  bool stop_ = false;

  // The exchange with the PS shards (worker_exchange.cpp).
  struct Exchange {
    std::unique_ptr<ps::PsClient> client;
    std::unique_ptr<ps::PushEncoder> encoder;  // the host's pushes (ps/exchange.h)
    std::unique_ptr<DeviceEncoder> device_encoder;  // a GPU worker's pushes, selected on its GPU
    bool device_nonfinite = false;  // the device encoder's gathered gradient holds a NaN/Inf
    std::unique_ptr<ps::TrafficMeter> meter;
    std::unique_ptr<ps::PsResyncer> resyncer;
    double always_sent_fraction = 0;  // floats sent in full every step ÷ all (the "auto" downlink)
    bool plain = true;
    // Overlap: which partitions backward has completed (ps/overlap.h), and the step in
    // progress.
    std::unique_ptr<ps::PartitionTracker> tracker;
    std::vector<ps::PartitionPush> plain_pushes;
    struct {
      bool active = false;     // backward of a training step is running
      float lr = 0;
      double density = 1;
      bool nonfinite = false;  // a NaN/Inf loss or partition: the rest of the step is not pushed
      std::exception_ptr error;  // a push that failed in a hook, rethrown by exchange()
    } hook;
    // The client's byte counts when the last step's traffic was counted (overlap) or when
    // the epoch began: the next step's traffic is what they grew by.
    std::uint64_t meter_up0 = 0, meter_down0 = 0;
    double last_pos = 0;  // the training position of the last step counted
    // Overlap in async and ssp: this step's pull runs during the next step's forward.
    bool pipelined = false;
    std::vector<float> replica;  // the pipelined pull's target (see start_pull)
    ps::PendingPull pending_pull;  // the pipelined pull in flight (ps/client.h)
  } ex_;

  // What the worker reports (worker_reports.cpp): its losses and counters, and the step
  // timeline.
  struct Reports {
    double epoch_wait = 0, wait_at_report = 0;  // seconds the steps waited for the loader
    double loss_sum = 0, recent_loss = 0;
    std::int64_t loss_count = 0, recent_count = 0, images_since_report = 0;
    std::int64_t skipped_steps = 0, consecutive_skips = 0;
    Clock::time_point last_report{}, t_profile{};
    std::int64_t profile_images = 0;
    wire::events::StepCounters counters;  // cumulative, this process (resyncs from the resyncer)
    // The step timeline: steady-clock reads placed on the Unix time line (so that the
    // timelines of several workers line up) through one pair of reads taken together.
    const Clock::time_point steady_origin = Clock::now();
    const std::int64_t unix_origin_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count();
    wire::StepTraceRing trace;
    wire::StepRecord step;
    Clock::time_point last_trace_write = Clock::now();
    bool trace_warned = false;
    explicit Reports(std::size_t trace_steps) : trace(trace_steps) {}
  } rep_;

  // This worker's local group, if it is in one (worker_group.cpp).
  struct Group {
    std::unique_ptr<group::LocalGroup> group;
    std::unique_ptr<GroupReduction> reduction;  // its sum (sockets or NCCL); destroyed before group
  } grp_;
};

}  // namespace dltrain::train::detail
