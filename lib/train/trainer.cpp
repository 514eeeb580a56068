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
    join_local_group();
    set_resume_point();
  }
  try {
    try {
      for (int epoch = first_epoch_; epoch < spec_.epochs && !stop_; ++epoch) run_epoch(epoch);
    } catch (const ps::StopRequested&) {
      stopped();
    }
  } catch (...) {
    write_trace();  // the timeline of a worker that failed says what its last steps did
    throw;
  }
  write_trace();
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
  feed_ = make_data_feed(spec_, cfg_.rank, cfg_.threads, gen_);
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
  flat_ = std::make_unique<FlatParams>(*model_.module);
  layout_ = ps::make_layout(flat_->sizes(), spec_.partition_size, spec_.ps_shards);
  params_.resize(static_cast<std::size_t>(layout_.total_floats));
  grads_.resize(params_.size());
  flat_->read_params(params_);
  n_ = feed_->shard_examples();
  steps_per_epoch_ = std::max<std::int64_t>(1, (n_ + spec_.batch_size - 1) / spec_.batch_size);
  if (spec_.overlap) {
    install_push_hooks();
    // Overlap pushes whole partitions (docs/training.md, "Overlap"): with one, the push
    // waits for backward's end as without overlap.
    if (layout_.partitions.size() == 1 && cfg_.rank == 0) {
      spdlog::warn("overlap: the model's {} parameters are one PS partition ([ps] partition_size = {}), so its "
                   "push cannot start before backward ends; a smaller partition_size lets the last layers go "
                   "first",
                   layout_.total_floats, spec_.partition_size);
    }
  }
  resume_epoch_ = cfg_.resume_epoch;
}

// Connects to the PS shards, offers this worker's parameters as their initial values
// (a re-assigned job: its saved replica) and takes theirs.
void WorkerLoop::connect() {
  ps::PsClientOptions popt;
  popt.job = cfg_.job;
  popt.generation = cfg_.generation;
  popt.secret = cfg_.secret;
  popt.rank = static_cast<std::uint32_t>(cfg_.rank);
  popt.num_workers = static_cast<std::uint32_t>(spec_.workers);
  popt.timeout = cfg_.ps_timeout;
  popt.reconnect_timeout = cfg_.ps_timeout;
  popt.sparse_downlink = compress::keeps_x_seen(spec_.compression);
  popt.half_downlink = compress::half_downlink(spec_.compression);
  popt.lowrank_downlink = ps::lowrank_pull_headers(spec_.compression, layout_, flat_->sizes(), flat_->rows());
  popt.stop_requested = cfg_.stop_requested;
  if (!cfg_.init_replica_path.empty()) {
    // A re-assigned job: this worker's saved replica is the freshest copy of the
    // parameters; a shard rebuilt elsewhere takes it as its initial values.
    const auto steps = ps::read_replica_file(cfg_.init_replica_path, params_, layout_, cfg_.job);
    wire::events::ReplicaLoaded ev;
    ev.rank = cfg_.rank;
    ev.path = cfg_.init_replica_path;
    ev.steps = static_cast<std::int64_t>(steps);
    sink_(ev.to_json());
  }
  ex_.client = std::make_unique<ps::PsClient>(cfg_.shards, layout_, popt);
  try {
    ex_.client->connect();
    ex_.client->init(params_);
    ex_.client->pull(params_);
  } catch (const ps::StopRequested&) {
    wire::events::WorkerStopped ev;
    ev.rank = cfg_.rank;
    sink_(ev.to_json());
    throw Stopped("worker " + std::to_string(cfg_.rank) + ": stopped before it held the PS's parameters");
  }
  pulled_at_ = unix_now();
  flat_->write_params(params_);
  ex_.encoder = std::make_unique<ps::PushEncoder>(
      spec_.compression, layout_,
      static_cast<std::uint64_t>(spec_.seed) * 7919ULL + static_cast<std::uint64_t>(cfg_.rank), flat_->sizes(),
      flat_->rows());
  if (ex_.encoder->always_sent_floats() > 0 && cfg_.rank == 0) {
    spdlog::info("compression: {} of {} floats (the tensors below min_compress_bytes = {}, or no matrix for powersgd) "
                 "are sent in full every step",
                 ex_.encoder->always_sent_floats(), layout_.total_floats, spec_.compression.min_compress_bytes);
  }
  // A GPU worker selects its pushes on the GPU where it can (train/backends.h).
  ex_.device_encoder = make_device_encoder(
      spec_.compression, layout_, static_cast<std::uint64_t>(spec_.seed) * 7919ULL + static_cast<std::uint64_t>(cfg_.rank),
      device_, spec_.overlap, cfg_.local_group.has_value());
  ex_.meter = std::make_unique<ps::TrafficMeter>(layout_, wire::kHeaderSize);
  ex_.resyncer = std::make_unique<ps::PsResyncer>(
      *ex_.client, std::span<float>(params_), cfg_.rank, [this] { flat_->write_params(params_); }, sink_);
  ex_.always_sent_fraction =
      static_cast<double>(ex_.encoder->always_sent_floats()) / static_cast<double>(std::max<std::int64_t>(1, layout_.total_floats));
  ex_.plain = spec_.compression.method == compress::Method::kNone && spec_.compression.downlink_ratio >= 1.0;
  ex_.pipelined = spec_.overlap && spec_.sync != ps::SyncMode::kBsp;
  ex_.replica = params_;
  set_resume_point();
}

// After a restart the worker continues after the last epoch it finished (in a local
// group: the earliest any member had not), from the PS's current parameters (pulled in
// connect), with the learning-rate schedule where it was.
void WorkerLoop::set_resume_point() {
  first_epoch_ = std::clamp(resume_epoch_, 0, spec_.epochs - 1);
  global_step_ = first_epoch_ * steps_per_epoch_;
  epochs_finished_ = first_epoch_;
}

void WorkerLoop::started() {
  wire::events::Started ev;
  ev.rank = cfg_.rank;
  ev.train_examples = n_;
  ev.steps_per_epoch = steps_per_epoch_;
  ev.parameters = layout_.total_floats;
  ev.partitions = static_cast<std::int64_t>(layout_.partitions.size());
  ev.load_seconds = seconds_since(t_start_);
  ev.resume_epoch = cfg_.resume_epoch;
  ev.allocator = allocator_name();
  ev.blas = blas_name();
  sink_(ev.to_json());
  sink_(feed_->info().to_json());  // the data set as this worker reads it
  rep_.last_report = Clock::now();
}

void WorkerLoop::run_epoch(int epoch) {
  const auto t_epoch = Clock::now();
  ex_.replica = params_;  // after worker 0's dense pull for its evaluation, too
  ex_.meter_up0 = ex_.client->bytes_pushed();  // that pull is not a step's traffic
  ex_.meter_down0 = ex_.client->bytes_pulled();
  const double wait0 = feed_->wait_seconds();
  feed_->start_epoch(epoch);
  rep_.loss_sum = 0;
  rep_.loss_count = 0;
  rep_.recent_loss = 0;  // a progress event's loss is the mean since the last one in this epoch
  rep_.recent_count = 0;
  torch::Tensor xb, yb;
  for (std::int64_t step = 0; step < steps_per_epoch_; ++step) {
    check_stop();
    const auto t_data = Clock::now();
    const bool more = feed_->next(xb, yb);
    rep_.counters.data_seconds += seconds_since(t_data);  // the batch's gather, or the wait for the loader
    mark(wire::StepPhase::kData, t_data);
    if (!more) break;
    report_skipped_images();
    if (xb.size(0) == 0 && !grp_.group) continue;  // every image of the batch was unreadable
    if (device_.is_cuda()) xb = xb.pin_memory();  // copied to the GPU asynchronously by forward
    this->step(epoch, step, xb, yb);
    if (stop_) break;
  }
  drain_pull();  // evaluation and the next epoch start from the last pull's values
  rep_.epoch_wait = feed_->wait_seconds() - wait0;
  if (spec_.profile) {
    if (stop_ || epoch + 1 == spec_.epochs) profiled();
    return;
  }
  end_epoch(epoch, seconds_since(t_epoch));
}

// One step of worker i with gradient g of its local batch (docs/architecture.md, "Sparse
// bidirectional training"): compute g; skip it if not finite; add weight decay; push
// (dense, or top-k of the momentum-corrected accumulator) and pull (dense, or the top-k
// of x − x_seen[i]); take the pulled parameters.
void WorkerLoop::step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb) {
  const std::int64_t images = xb.size(0);
  rep_.step.step = global_step_ + 1;
  const double pos = epoch + static_cast<double>(step) / steps_per_epoch_;
  const auto lr = static_cast<float>(learning_rate(spec_.optimizer, pos, spec_.epochs));
  const double density =
      spec_.compression.method == compress::Method::kNone ? 1.0 : compress::density_at(spec_.compression, pos);
  // The downlink of the "auto" setting follows this step's uplink (compression_spec.h).
  const double downlink =
      compress::downlink_density(spec_.compression, pos, spec_.workers, ex_.always_sent_fraction);
  if (grp_.group) return group_step(epoch, step, xb, yb, lr, density, downlink, pos);
  if (spec_.overlap) {
    ex_.hook.lr = lr;
    ex_.hook.density = density;
    const double loss = compute_gradient_overlapped(xb, yb);
    if (!finite_step(loss, epoch, step, ex_.hook.nonfinite)) return;
    exchange(lr, density, downlink, pos);
    finish_step(images, loss, epoch, step, lr, density);
    return;
  }
  const double loss = compute_gradient(xb, yb);
  if (!finite_step(loss, epoch, step)) return;
  const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
  if (wd > 0 && !device_encoder_active()) {  // on the device, gather() added it
    for (std::size_t i = 0; i < grads_.size(); ++i) grads_[i] += wd * params_[i];
  }
  exchange(lr, density, downlink, pos);
  finish_step(images, loss, epoch, step, lr, density);
}

// After the exchange: the pulled parameters into the model, counters, reports.
void WorkerLoop::finish_step(std::int64_t images, double loss, int epoch, std::int64_t step, float lr, double density) {
  last_density_ = density;
  mark(wire::StepPhase::kApply, Clock::now());
  flat_->write_params(params_);
  end_step_trace();
  ++global_step_;
  if (global_step_ == kProfileWarmupSteps) rep_.t_profile = Clock::now();
  if (global_step_ > kProfileWarmupSteps) rep_.profile_images += images;
  if (spec_.max_steps > 0 && global_step_ >= spec_.max_steps) stop_ = true;
  rep_.loss_sum += loss;
  ++rep_.loss_count;
  rep_.recent_loss += loss;
  ++rep_.recent_count;
  rep_.images_since_report += images;
  rep_.counters.images += images;
  ++rep_.counters.steps;
  maybe_report(epoch, step, lr);
}

// Forward and backward on the batch; the flat gradient is in grads_. Returns the loss.
double WorkerLoop::compute_gradient(const torch::Tensor& xb, const torch::Tensor& yb) {
  const auto t1 = Clock::now();
  model_.module->zero_grad();
  auto loss = torch::nn::functional::cross_entropy(model_.forward(xb), yb);
  const auto t2 = Clock::now();
  loss.backward();
  if (device_encoder_active()) {
    ex_.device_nonfinite = !ex_.device_encoder->gather(flat_->tensors(), static_cast<float>(spec_.optimizer.weight_decay));
  } else {
    flat_->read_grads(grads_);
  }
  const double value = loss.item<double>();
  end_compute(t1, t2);
  return value;
}

// Forward began at t1 and backward at t2; backward has just ended: the step's compute
// time and its timeline marks.
void WorkerLoop::end_compute(Clock::time_point t1, Clock::time_point t2) {
  const auto t3 = Clock::now();
  rep_.counters.compute_seconds += std::chrono::duration<double>(t3 - t1).count();
  mark(wire::StepPhase::kForward, t1);
  mark(wire::StepPhase::kBackward, t2);
  mark(wire::StepPhase::kCompress, t3);
}

// A NaN/Inf loss or gradient is never pushed: the step is skipped and counted; too many
// in a row end the worker (the model diverged). With overlap the gradient was checked
// partition by partition as it was pushed (`nonfinite`).
bool WorkerLoop::finite_step(double loss, int epoch, std::int64_t step, bool nonfinite) {
  bool finite = std::isfinite(loss) && !nonfinite && !(device_encoder_active() && ex_.device_nonfinite);
  for (std::size_t i = 0; finite && !spec_.overlap && !device_encoder_active() && i < grads_.size(); ++i) {
    finite = std::isfinite(grads_[i]);
  }
  if (finite) {
    rep_.consecutive_skips = 0;
    return true;
  }
  ++rep_.skipped_steps;
  if (++rep_.consecutive_skips > kMaxConsecutiveSkips) {
    throw DivergedError("worker " + std::to_string(cfg_.rank) + ": " + std::to_string(rep_.consecutive_skips) +
                " consecutive steps had a NaN/Inf loss or gradient (epoch " + std::to_string(epoch + 1) +
                ", step " + std::to_string(step + 1) +
                "); the model diverged: lower optimizer.lr or set compression.clip_norm");
  }
  wire::events::SkippedStep ev;
  ev.rank = cfg_.rank;
  ev.epoch = epoch + 1;
  ev.step = step + 1;
  if (std::isfinite(loss)) ev.loss = loss;
  ev.skipped_steps = rep_.skipped_steps;
  sink_(ev.to_json());
  return false;
}

}  // namespace detail

double run_worker(const WorkerConfig& cfg, const ProgressSink& sink) { return detail::WorkerLoop(cfg, sink).run(); }

}  // namespace dltrain::train
