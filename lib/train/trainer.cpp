#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/native_libs.h"
#include "common/errors.h"
#include "ps/checkpoint.h"
#include "data/idx.h"
#include "train/worker_loop.h"

namespace dltrain::train {

double idx_mean(DatasetKind dataset) { return dataset == DatasetKind::kMnist ? 0.1307 : 0.2860; }
double idx_std(DatasetKind dataset) { return dataset == DatasetKind::kMnist ? 0.3081 : 0.3530; }

std::pair<torch::Tensor, torch::Tensor> to_tensors(const data::Split& s, DatasetKind dataset) {
  const double mean = idx_mean(dataset);
  const double stdv = idx_std(dataset);
  auto x = torch::from_blob(const_cast<std::uint8_t*>(s.images.pixels.data()),
                            {s.images.count, 1, s.images.rows, s.images.cols}, torch::kUInt8)
               .to(torch::kFloat32)
               .div_(255.0)
               .sub_(mean)
               .div_(stdv);
  auto y = torch::from_blob(const_cast<std::uint8_t*>(s.labels.data()),
                            {static_cast<std::int64_t>(s.labels.size())}, torch::kUInt8)
               .to(torch::kInt64);
  return {x, y};
}

double evaluate(torch::nn::Module& m, const Model& model, const torch::Tensor& x, const torch::Tensor& y,
                int batch) {
  if (batch < 1) throw ConfigError("eval_batch_size", "expected at least 1, got " + std::to_string(batch));
  torch::NoGradGuard ng;
  m.eval();
  std::int64_t correct = 0;
  const std::int64_t n = x.size(0);
  for (std::int64_t lo = 0; lo < n; lo += batch) {
    const std::int64_t hi = std::min(n, lo + batch);
    auto pred = model.forward(x.slice(0, lo, hi)).argmax(1);
    correct += pred.eq(y.slice(0, lo, hi)).sum().item<std::int64_t>();
  }
  m.train(true);
  return static_cast<double>(correct) / static_cast<double>(n);
}

double learning_rate(const OptimizerSpec& opt, double epoch_pos, int epochs) {
  if (opt.warmup_epochs > 0 && epoch_pos < opt.warmup_epochs) {
    return opt.lr * (0.1 + 0.9 * epoch_pos / opt.warmup_epochs);
  }
  if (opt.lr_schedule == LrSchedule::kCosine) {
    const double span = epochs - opt.warmup_epochs;
    const double t = span > 0 ? std::clamp((epoch_pos - opt.warmup_epochs) / span, 0.0, 1.0) : 1.0;
    return opt.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  if (opt.lr_schedule == LrSchedule::kStep) {
    const double f = epoch_pos / epochs;
    return opt.lr * (f >= 0.75 ? 0.01 : f >= 0.5 ? 0.1 : 1.0);
  }
  return opt.lr;
}

namespace detail {

double WorkerLoop::run() {
  load();
  connect();
  started();
  // The local group forms once this worker holds the PS's parameters and has said so:
  // after a re-assignment that rebuilds a shard, the leader starts the other workers
  // (this worker's group-mates among them) only once the seed has initialised it.
  if (cfg_.local_group) {
    grp_.join(*cfg_.local_group, device_, cfg_.stop_requested, steps_per_epoch_, resume_epoch_);
    set_resume_point();
  }
  try {
    try {
      for (int epoch = first_epoch_; epoch < spec_.epochs && !stop_; ++epoch) run_epoch(epoch);
    } catch (const ps::StopRequested&) {
      stopped();
    } catch (const LeaveRequested&) {
      left();
      rep_.write_trace();
      return -1.0;
    }
  } catch (...) {
    rep_.write_trace();  // the timeline of a worker that failed says what its last steps did
    throw;
  }
  rep_.write_trace();
  done();
  return final_accuracy_;
}

// Data: this worker's shard of the training set; rank 0 also loads the test set. Model:
// identical initial replicas on every worker (same seed); the PS keeps the first.
void WorkerLoop::load() {
  torch::set_num_threads(std::max(1, cfg_.threads));
  device_ = training_device(spec_.device);  // before the data: a missing GPU fails at once
  gen_ = at::detail::createCPUGenerator(static_cast<std::uint64_t>(spec_.seed) * 1000003ULL +
                                        static_cast<std::uint64_t>(cfg_.rank));
  ClaimsFactory claims;
  if (spec_.elastic.on()) {
    // An elastic job's data: chunks claimed from PS shard 0 (ps/dispatch.h), on a
    // connection of their own.
    claims = [this](std::uint32_t chunks_per_epoch, std::uint32_t ahead) {
      ps::PsClientOptions o;
      o.job = cfg_.job;
      o.generation = cfg_.generation;
      o.secret = cfg_.secret;
      o.rank = static_cast<std::uint32_t>(cfg_.rank);
      o.num_workers = static_cast<std::uint32_t>(spec_.elastic.max_workers);
      o.timeout = cfg_.ps_timeout;
      o.stop_requested = cfg_.stop_requested;
      return std::make_unique<ChunkClaims>(std::make_unique<ps::ChunkClient>(cfg_.shards.at(0), o), chunks_per_epoch,
                                           ahead);
    };
  }
  feed_ = make_data_feed(spec_, cfg_.rank, cfg_.threads, gen_, claims);
  const auto info = feed_->info();
  torch::manual_seed(static_cast<std::uint64_t>(spec_.seed));
  model_ = to_device(spec_.model == ModelKind::kTorchScript
                         // An uploaded model file is in the task directory (its agent put it there).
                         ? load_torchscript_model(spec_.model_sha256.empty() ? spec_.model_file : kUploadedModelFile,
                                                  info.channels, feed_->classes(), info.image_size, spec_.model_file)
                         : make_model(spec_.model, info.channels, feed_->classes(), info.image_size),
                     device_);
  if (!spec_.init_sha256.empty()) {
    // Fine-tuning: every worker starts from the same trained values (its agent fetched
    // them), so the replicas stay identical and the PS keeps them as its initial values.
    spdlog::info("init_from: {}", init_from_state_dict(model_, kInitStateDictFile, spec_.init_from));
  }
  model_.module->train(true);
  replica_.flat = std::make_unique<FlatParams>(*model_.module);
  replica_.layout = ps::make_layout(replica_.flat->sizes(), spec_.partition_size, spec_.ps_shards);
  replica_.params.resize(static_cast<std::size_t>(replica_.layout.total_floats));
  replica_.grads.resize(replica_.params.size());
  replica_.flat->read_params(replica_.params);
  n_ = feed_->shard_examples();
  steps_per_epoch_ = std::max<std::int64_t>(1, (n_ + spec_.batch_size - 1) / spec_.batch_size);
  if (spec_.overlap) {
    ex_.install_push_hooks();
    // Overlap pushes whole partitions (docs/training.md, "Overlap"): with one, the push
    // waits for backward's end as without overlap.
    if (replica_.layout.partitions.size() == 1 && cfg_.rank == 0) {
      spdlog::warn("overlap: the model's {} parameters are one PS partition ([ps] partition_size = {}), so its "
                   "push cannot start before backward ends; a smaller partition_size lets the last layers go "
                   "first",
                   replica_.layout.total_floats, spec_.partition_size);
    }
  }
  resume_epoch_ = cfg_.resume_epoch;
}

// Connects to the PS shards, offers this worker's parameters as their initial values
// (a re-assigned job: its saved replica) and takes theirs.
void WorkerLoop::connect() {
  if (!cfg_.init_replica_path.empty()) {
    // A re-assigned job: this worker's saved replica is the freshest copy of the
    // parameters; a shard rebuilt elsewhere takes it as its initial values.
    const auto steps = ps::read_replica_file(cfg_.init_replica_path, replica_.params, replica_.layout, cfg_.job);
    wire::events::ReplicaLoaded ev;
    ev.rank = cfg_.rank;
    ev.path = cfg_.init_replica_path;
    ev.steps = static_cast<std::int64_t>(steps);
    sink_(ev.to_json());
  }
  try {
    ex_.connect(device_, sink_);
  } catch (const ps::StopRequested&) {
    wire::events::WorkerStopped ev;
    ev.rank = cfg_.rank;
    sink_(ev.to_json());
    throw Stopped("worker " + std::to_string(cfg_.rank) + ": stopped before it held the PS's parameters");
  }
  set_resume_point();
}

// After a restart the worker continues after the last epoch it finished (in a local
// group: the earliest any member had not), from the PS's current parameters (pulled in
// connect), with the learning-rate schedule where it was.
void WorkerLoop::set_resume_point() {
  first_epoch_ = std::clamp(resume_epoch_, 0, spec_.epochs - 1);
  replica_.global_step = first_epoch_ * steps_per_epoch_;
  epochs_finished_ = first_epoch_;
}

void WorkerLoop::started() {
  wire::events::Started ev;
  ev.rank = cfg_.rank;
  ev.train_examples = n_;
  ev.steps_per_epoch = steps_per_epoch_;
  ev.parameters = replica_.layout.total_floats;
  ev.partitions = static_cast<std::int64_t>(replica_.layout.partitions.size());
  ev.load_seconds = seconds_since(t_start_);
  ev.resume_epoch = cfg_.resume_epoch;
  ev.allocator = allocator_name();
  ev.blas = blas_name();
  sink_(ev.to_json());
  sink_(feed_->info().to_json());  // the data set as this worker reads it
  rep_.started();
}

void WorkerLoop::run_epoch(int epoch) {
  const auto t_epoch = Clock::now();
  ex_.begin_epoch();
  const double wait0 = feed_->wait_seconds();
  feed_->start_epoch(epoch);
  rep_.begin_epoch();
  torch::Tensor xb, yb;
  // An elastic job's epoch ends when the dispatch has no chunk of it left.
  const bool elastic = spec_.elastic.on();
  for (std::int64_t step = 0; elastic || step < steps_per_epoch_; ++step) {
    check_stop();
    const auto t_data = Clock::now();
    const bool more = feed_->next(xb, yb);
    rep_.counters().data_seconds += seconds_since(t_data);  // the batch's gather, or the wait for the loader
    rep_.mark(wire::StepPhase::kData, t_data);
    if (!more) break;
    report_skipped_images();
    if (xb.size(0) == 0 && !grp_) continue;  // every image of the batch was unreadable
    if (device_.is_cuda()) xb = xb.pin_memory();  // copied to the GPU asynchronously by forward
    StepPlan s;
    s.epoch = epoch;
    s.step = step;
    s.pos = elastic ? feed_->position() : epoch + static_cast<double>(step) / steps_per_epoch_;
    s.lr = static_cast<float>(learning_rate(spec_.optimizer, s.pos, spec_.epochs));
    s.density =
        spec_.compression.method == compress::Method::kNone ? 1.0 : compress::density_at(spec_.compression, s.pos);
    s.downlink = ex_.downlink_density(s.pos);  // "auto" follows this step's uplink (compression_spec.h)
    this->step(s, xb, yb);
    if (stop_) break;
    if (cfg_.leave_requested != nullptr && cfg_.leave_requested->load(std::memory_order_relaxed)) {
      throw LeaveRequested{};
    }
  }
  ex_.drain_pull();  // evaluation and the next epoch start from the last pull's values
  const double epoch_wait = feed_->wait_seconds() - wait0;
  if (spec_.profile) {
    if (stop_ || epoch + 1 == spec_.epochs) profiled();
    return;
  }
  end_epoch(epoch, seconds_since(t_epoch), epoch_wait);
}

// One step of worker i with gradient g of its local batch (docs/architecture.md, "Sparse
// bidirectional training"): compute g; skip it if not finite; add weight decay; push
// (dense, or top-k of the momentum-corrected accumulator) and pull (dense, or the top-k
// of x − x_seen[i]); take the pulled parameters.
void WorkerLoop::step(const StepPlan& s, const torch::Tensor& xb, const torch::Tensor& yb) {
  const std::int64_t images = xb.size(0);
  rep_.begin_step(replica_.global_step + 1);
  if (grp_) return group_step(s, xb, yb);
  const double loss = spec_.overlap ? compute_gradient_overlapped(xb, yb, s) : compute_gradient(xb, yb);
  if (!finite_step(loss, s)) return;
  const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
  if (wd > 0 && !spec_.overlap && !ex_.device_encoder_active()) {  // overlap's hooks and the device add it
    auto& g = replica_.grads;
    const auto& x = replica_.params;
    for (std::size_t i = 0; i < g.size(); ++i) g[i] += wd * x[i];
  }
  ex_.exchange(s.lr, s.density, s.downlink, s.pos);
  finish_step(images, loss, s);
}

// After the exchange: the pulled parameters into the model, counters, reports.
void WorkerLoop::finish_step(std::int64_t images, double loss, const StepPlan& s) {
  last_density_ = s.density;
  rep_.mark(wire::StepPhase::kApply, Clock::now());
  replica_.write_model();
  rep_.end_step();
  ++replica_.global_step;
  if (spec_.max_steps > 0 && replica_.global_step >= spec_.max_steps) stop_ = true;
  rep_.add_step(images, loss, replica_.global_step);
  maybe_report(s);
}

// Forward and backward on the batch; the flat gradient is in replica_.grads (or on the
// device encoder). Returns the loss.
double WorkerLoop::compute_gradient(const torch::Tensor& xb, const torch::Tensor& yb) {
  const auto t1 = Clock::now();
  model_.module->zero_grad();
  auto loss = torch::nn::functional::cross_entropy(model_.forward(xb), yb);
  const auto t2 = Clock::now();
  loss.backward();
  ex_.take_gradient(static_cast<float>(spec_.optimizer.weight_decay));
  const double value = loss.item<double>();
  end_compute(t1, t2);
  return value;
}

// compute_gradient with overlap: backward runs with the push hooks armed, so most
// partitions are pushed before it returns; a NaN/Inf loss skips backward (nothing is
// pushed). The partitions still unpushed are the exchange's.
double WorkerLoop::compute_gradient_overlapped(const torch::Tensor& xb, const torch::Tensor& yb, const StepPlan& s) {
  const auto t1 = Clock::now();
  model_.module->zero_grad();
  auto loss = torch::nn::functional::cross_entropy(model_.forward(xb), yb);
  const double value = loss.item<double>();
  const auto t2 = Clock::now();
  ex_.begin_backward(s.lr, s.density);
  const bool run = std::isfinite(value);
  if (run) {
    try {
      loss.backward();
    } catch (...) {
      ex_.end_backward(true);
      throw;
    }
  }
  ex_.end_backward(run);
  end_compute(t1, t2);
  return value;
}

// Forward began at t1 and backward at t2; backward has just ended: the step's compute
// time and its timeline marks.
void WorkerLoop::end_compute(Clock::time_point t1, Clock::time_point t2) {
  const auto t3 = Clock::now();
  rep_.counters().compute_seconds += std::chrono::duration<double>(t3 - t1).count();
  rep_.mark(wire::StepPhase::kForward, t1);
  rep_.mark(wire::StepPhase::kBackward, t2);
  rep_.mark(wire::StepPhase::kCompress, t3);
}

// A NaN/Inf loss or gradient is never pushed (StepReporter::check_finite counts it).
// With overlap the gradient was checked partition by partition as it was pushed, on
// the device by its encoder; on the host here.
bool WorkerLoop::finite_step(double loss, const StepPlan& s) {
  bool finite = std::isfinite(loss) && !ex_.gradient_nonfinite();
  if (!spec_.overlap && !ex_.device_encoder_active()) {
    const auto& g = replica_.grads;
    finite = finite && std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); });
  }
  return rep_.check_finite(finite, loss, s.epoch, s.step);
}

}  // namespace detail

double run_worker(const WorkerConfig& cfg, const ProgressSink& sink) { return detail::WorkerLoop(cfg, sink).run(); }

}  // namespace dltrain::train
