#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <future>
#include <numbers>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/errors.h"
#include "compress/compressor.h"
#include "ps/checkpoint.h"
#include "train/data_feed.h"
#include "train/idx.h"
#include "train/local_group.h"
#if DLTRAIN_HAVE_GPU
#include "gpu/device_push_encoder.h"
#include "gpu/nccl_group.h"
#endif
#include "train/models.h"
#include "train/overlap.h"
#include "train/step_trace.h"
#include "train/exchange.h"
#include "train/tensors.h"
#include "wire/task_events.h"

namespace dltrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Copies the model's parameters into / out of one flat float vector, in parameters() order.
class FlatParams {
 public:
  explicit FlatParams(torch::nn::Module& m) : params_(m.parameters()) {
    for (const auto& p : params_) sizes_.push_back(p.numel());
  }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
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
  std::vector<std::int64_t> sizes_;
};

/// BatchNorm running statistics are not trained parameters and are not held by the PS.
/// Before every evaluation they are re-estimated for the evaluated parameters: reset,
/// then a cumulative average (momentum = None) over `batches` training batches in train
/// mode (the procedure of Izmailov et al. 2018, "Averaging Weights Leads to Wider Optima",
/// §3.2, bn_update).
void recalibrate_batchnorm(torch::nn::Module& m, const Model& model, const torch::Tensor& x,
                           int batches, int batch) {
  std::vector<torch::nn::BatchNorm2dImpl*> bns;
  for (auto& mod : m.modules(false)) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(mod.get())) bns.push_back(bn);
  }
  if (bns.empty()) return;
  for (auto* bn : bns) {
    bn->reset_running_stats();
    bn->options.momentum(c10::nullopt);
  }
  torch::NoGradGuard ng;
  m.train(true);
  const std::int64_t n = x.size(0);
  for (int b = 0; b < batches; ++b) {
    const std::int64_t lo = (static_cast<std::int64_t>(b) * batch) % n;
    const std::int64_t hi = std::min(n, lo + batch);
    model.forward(x.slice(0, lo, hi));
  }
  for (auto* bn : bns) bn->options.momentum(0.1);
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> to_tensors(const Split& s, const std::string& dataset) {
  // Per-dataset pixel mean and standard deviation over the training set.
  const double mean = dataset == "mnist" ? 0.1307 : 0.2860;
  const double stdv = dataset == "mnist" ? 0.3081 : 0.3530;
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

double evaluate(torch::nn::Module& m, const Model& model, const torch::Tensor& x,
                const torch::Tensor& y) {
  torch::NoGradGuard ng;
  m.eval();
  std::int64_t correct = 0;
  const std::int64_t n = x.size(0);
  for (std::int64_t lo = 0; lo < n; lo += 1000) {
    const std::int64_t hi = std::min(n, lo + 1000);
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
  if (opt.lr_schedule == "cosine") {
    const double span = epochs - opt.warmup_epochs;
    const double t = span > 0 ? std::clamp((epoch_pos - opt.warmup_epochs) / span, 0.0, 1.0) : 1.0;
    return opt.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  if (opt.lr_schedule == "step") {
    const double f = epoch_pos / epochs;
    return opt.lr * (f >= 0.75 ? 0.01 : f >= 0.5 ? 0.1 : 1.0);
  }
  return opt.lr;
}

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// One worker's run: its data, model, PS client and counters, and the step loop of the
/// sparse bidirectional method (docs/compression.md): per step, forward and backward on
/// the local batch, then either a dense push_pull, or the compressor's top-k push
/// (momentum correction, error feedback) and the PS's sparse downlink of what changed
/// since this worker's last pull.
class WorkerLoop {
 public:
  WorkerLoop(const WorkerConfig& cfg, const ProgressSink& sink)
      : cfg_(cfg), spec_(cfg.spec), sink_(sink), trace_(std::clamp<std::size_t>(cfg.trace_steps, 1, 4096)) {}

  double run() {
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

 private:
  static constexpr std::int64_t kMaxConsecutiveSkips = 20;
  static constexpr std::int64_t kProfileWarmupSteps = 5;  // exploration runs measure after these

  // Data: this worker's shard of the training set; rank 0 also loads the test set. Model:
  // identical initial replicas on every worker (same seed); the PS keeps the first.
  void load() {
    torch::set_num_threads(std::max(1, cfg_.threads));
    device_ = training_device(spec_.device);  // before the data: a missing GPU fails at once
    gen_ = at::detail::createCPUGenerator(static_cast<std::uint64_t>(spec_.seed) * 1000003ULL +
                                          static_cast<std::uint64_t>(cfg_.rank));
    feed_ = make_data_feed(spec_, cfg_.rank, cfg_.threads, gen_);
    const auto info = feed_->info();
    torch::manual_seed(static_cast<std::uint64_t>(spec_.seed));
    model_ = to_device(make_model(spec_.model, info.channels, feed_->classes(), info.image_size), device_);
    model_.module->train(true);
    flat_ = std::make_unique<FlatParams>(*model_.module);
    layout_ = ps::make_layout(flat_->sizes(), spec_.partition_size, spec_.ps_shards);
    params_.resize(static_cast<std::size_t>(layout_.total_floats));
    grads_.resize(params_.size());
    flat_->read_params(params_);
    n_ = feed_->shard_examples();
    steps_per_epoch_ = std::max<std::int64_t>(1, (n_ + spec_.batch_size - 1) / spec_.batch_size);
    if (spec_.overlap) install_push_hooks();
    resume_epoch_ = cfg_.resume_epoch;
  }

  // The workers of this job on this machine (docs/gpu.md, "Local groups"): they agree on
  // the steps of an epoch (the fewest of any member's shard, so that every member calls
  // the group's operations as often) and on where a restarted group resumes (the
  // earliest epoch any member had not finished).
  void join_local_group() {
    auto o = *cfg_.local_group;
    o.stop_requested = cfg_.stop_requested;
    group_ = LocalGroup::join(o);
#if DLTRAIN_HAVE_GPU
    // GPU workers reduce on their GPUs with NCCL, formed through the group's socket.
    if (device_.is_cuda() && group_->size() > 1) {
      nccl_ = std::make_unique<gpu::NcclGroup>(*group_, 0, o.timeout, cfg_.stop_requested);
    }
#endif
    std::vector<float> agree(2 * static_cast<std::size_t>(group_->size()), 0.0f);
    agree[2 * static_cast<std::size_t>(group_->rank())] = static_cast<float>(steps_per_epoch_);
    agree[2 * static_cast<std::size_t>(group_->rank()) + 1] = static_cast<float>(cfg_.resume_epoch);
    group_->allreduce_sum(agree);
    for (int r = 0; r < group_->size(); ++r) {
      steps_per_epoch_ = std::min(steps_per_epoch_, static_cast<std::int64_t>(agree[2 * static_cast<std::size_t>(r)]));
      resume_epoch_ = std::min(resume_epoch_, static_cast<int>(agree[2 * static_cast<std::size_t>(r) + 1]));
    }
    spdlog::info("local group: {} joined; {} steps per epoch, training from epoch {}", group_->describe(group_->rank()),
                 steps_per_epoch_, resume_epoch_ + 1);
  }

  // Overlap (docs/training.md, "Overlap"): a hook on every parameter copies its gradient
  // into grads_ when backward has produced it; a partition whose floats are all in is
  // pushed from the hook, while backward goes on with the layers before it. The write
  // returns once the kernel holds the frame, which it sends meanwhile.
  void install_push_hooks() {
    tracker_ = std::make_unique<PartitionTracker>(flat_->sizes(), layout_);
    auto& tensors = flat_->tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      tensors[i].register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
    }
  }

  void on_gradient(std::size_t i, const torch::Tensor& grad) {
    if (!hook_.active) return;
    const auto c = grad.to(torch::kCPU).contiguous();
    std::memcpy(grads_.data() + tracker_->offset(i), c.data_ptr<float>(), sizeof(float) * c.numel());
    for (const auto key : tracker_->arrived(i)) push_partition(key, true);
  }

  // Weight decay, the finiteness check and the encoding of partition `key` of grads_,
  // then its push. A non-finite partition is not pushed and marks the step skipped
  // (the partitions already pushed stay applied); a failed push is kept for exchange().
  void push_partition(std::uint32_t key, bool in_backward) {
    if (hook_.error || hook_.nonfinite || !tracker_->claim(key)) return;
    const auto& p = layout_.partitions[key];
    auto g = std::span<float>(grads_).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length));
    const auto x = std::span<const float>(params_).subspan(static_cast<std::size_t>(p.offset), g.size());
    if (std::any_of(g.begin(), g.end(), [](float v) { return !std::isfinite(v); })) {
      hook_.nonfinite = true;
      return;
    }
    const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
    if (wd > 0) {
      for (std::size_t j = 0; j < g.size(); ++j) g[j] += wd * x[j];
    }
    try {
      std::span<const ps::PartitionPush> pushes;
      if (plain_) {
        auto& pp = plain_pushes_[key];
        pp.codec = wire::Codec::kDenseF32;
        pp.count = static_cast<std::uint32_t>(g.size());
        pp.first = std::as_bytes(std::span<const float>(g));
        pushes = plain_pushes_;
      } else {
        const auto t0 = Clock::now();
        pushes = encoder_->encode_partition(key, g, hook_.density, static_cast<std::uint64_t>(global_step_));
        counters_.compress_seconds += seconds_since(t0);
      }
      const std::uint32_t keys[] = {key};
      client_->push(pushes, keys, hook_.lr);
      if (in_backward) ++counters_.overlapped_pushes;
    } catch (...) {
      hook_.error = std::current_exception();
    }
  }

  // Connects to the PS shards, offers this worker's parameters as their initial values
  // (a re-assigned job: its saved replica) and takes theirs.
  void connect() {
    ps::PsClientOptions popt;
    popt.job = cfg_.job;
    popt.generation = cfg_.generation;
    popt.secret = cfg_.secret;
    popt.rank = static_cast<std::uint32_t>(cfg_.rank);
    popt.num_workers = static_cast<std::uint32_t>(spec_.workers);
    popt.timeout = cfg_.ps_timeout;
    popt.reconnect_timeout = cfg_.ps_timeout;
    popt.sparse_downlink = spec_.compression.downlink_ratio < 1.0;
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
    client_ = std::make_unique<ps::PsClient>(cfg_.shards, layout_, popt);
    try {
      client_->connect();
      client_->init(params_);
      client_->pull(params_);
    } catch (const ps::StopRequested&) {
      wire::events::WorkerStopped ev;
      ev.rank = cfg_.rank;
      sink_(ev.to_json());
      throw Stopped("worker " + std::to_string(cfg_.rank) + ": stopped before it held the PS's parameters");
    }
    pulled_at_ = unix_now();
    flat_->write_params(params_);
    encoder_ = std::make_unique<PushEncoder>(
        spec_.compression, layout_,
        static_cast<std::uint64_t>(spec_.seed) * 7919ULL + static_cast<std::uint64_t>(cfg_.rank));
#if DLTRAIN_HAVE_GPU
    // A GPU worker selects its pushes on the GPU (top-k, DGC: gpu/device_push_encoder.h):
    // only the selected pairs come to the host. Not with overlap (partition pushes from
    // the backward hooks) nor in a local group (member 0 pushes the group's sum).
    if (device_.is_cuda() && !spec_.overlap && !cfg_.local_group &&
        gpu::DevicePushEncoder::handles(spec_.compression)) {
      device_encoder_ = std::make_unique<gpu::DevicePushEncoder>(
          spec_.compression, layout_,
          static_cast<std::uint64_t>(spec_.seed) * 7919ULL + static_cast<std::uint64_t>(cfg_.rank));
    }
#endif
    meter_ = std::make_unique<TrafficMeter>(layout_, wire::kHeaderSize);
    resyncer_ = std::make_unique<PsResyncer>(
        *client_, std::span<float>(params_), cfg_.rank, [this] { flat_->write_params(params_); }, sink_);
    downlink_spec_ = spec_.compression;
    downlink_spec_.ratio = spec_.compression.downlink_ratio;
    plain_ = spec_.compression.method == compress::Method::kNone && spec_.compression.downlink_ratio >= 1.0;
    pipelined_ = spec_.overlap && spec_.sync != "sync";
    replica_ = params_;
    set_resume_point();
  }

  // After a restart the worker continues after the last epoch it finished (in a local
  // group: the earliest any member had not), from the PS's current parameters (pulled in
  // connect), with the learning-rate schedule where it was.
  void set_resume_point() {
    first_epoch_ = std::clamp(resume_epoch_, 0, spec_.epochs - 1);
    global_step_ = first_epoch_ * steps_per_epoch_;
    epochs_finished_ = first_epoch_;
  }

  void started() {
    wire::events::Started ev;
    ev.rank = cfg_.rank;
    ev.train_examples = n_;
    ev.steps_per_epoch = steps_per_epoch_;
    ev.parameters = layout_.total_floats;
    ev.partitions = static_cast<std::int64_t>(layout_.partitions.size());
    ev.load_seconds = seconds_since(t_start_);
    ev.resume_epoch = cfg_.resume_epoch;
    sink_(ev.to_json());
    sink_(feed_->info().to_json());  // the data set as this worker reads it
    last_report_ = Clock::now();
  }

  // One skipped_image event for each of the first unreadable files (DataFeed keeps the count).
  void report_skipped_images() {
    for (auto& m : feed_->take_skip_messages()) {
      wire::events::SkippedImage ev;
      ev.rank = cfg_.rank;
      ev.message = std::move(m);
      ev.skipped_images = feed_->skipped_images();
      sink_(ev.to_json());
    }
  }

  void check_stop() const {
    if (cfg_.stop_requested != nullptr && cfg_.stop_requested->load(std::memory_order_relaxed)) {
      throw ps::StopRequested("the worker was asked to stop");
    }
  }

  void run_epoch(int epoch) {
    const auto t_epoch = Clock::now();
    replica_ = params_;  // after worker 0's dense pull for its evaluation, too
    meter_up0_ = client_->bytes_pushed();  // that pull is not a step's traffic
    meter_down0_ = client_->bytes_pulled();
    const double wait0 = feed_->wait_seconds();
    feed_->start_epoch(epoch);
    loss_sum_ = 0;
    loss_count_ = 0;
    recent_loss_ = 0;  // a progress event's loss is the mean since the last one in this epoch
    recent_count_ = 0;
    torch::Tensor xb, yb;
    for (std::int64_t step = 0; step < steps_per_epoch_; ++step) {
      check_stop();
      const auto t_data = Clock::now();
      const bool more = feed_->next(xb, yb);
      counters_.data_seconds += seconds_since(t_data);  // the batch's gather, or the wait for the loader
      mark(StepPhase::kData, t_data);
      if (!more) break;
      report_skipped_images();
      if (xb.size(0) == 0 && !group_) continue;  // every image of the batch was unreadable
      if (device_.is_cuda()) xb = xb.pin_memory();  // copied to the GPU asynchronously by forward
      this->step(epoch, step, xb, yb);
      if (stop_) break;
    }
    drain_pull();  // evaluation and the next epoch start from the last pull's values
    epoch_wait_ = feed_->wait_seconds() - wait0;
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
  void step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb) {
    const std::int64_t images = xb.size(0);
    step_.step = global_step_ + 1;
    const double pos = epoch + static_cast<double>(step) / steps_per_epoch_;
    const auto lr = static_cast<float>(learning_rate(spec_.optimizer, pos, spec_.epochs));
    const double density =
        spec_.compression.method == compress::Method::kNone ? 1.0 : compress::density_at(spec_.compression, pos);
    if (group_) return group_step(epoch, step, xb, yb, lr, density, compress::density_at(downlink_spec_, pos), pos);
    if (spec_.overlap) {
      hook_.lr = lr;
      hook_.density = density;
      const double loss = compute_gradient_overlapped(xb, yb);
      if (!finite_step(loss, epoch, step, hook_.nonfinite)) return;
      exchange(lr, density, compress::density_at(downlink_spec_, pos), pos);
      finish_step(images, loss, epoch, step, lr, density);
      return;
    }
    const double loss = compute_gradient(xb, yb);
    if (!finite_step(loss, epoch, step)) return;
    const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
    if (wd > 0 && !device_encoder_active()) {  // on the device, device_gradient() added it
      for (std::size_t i = 0; i < grads_.size(); ++i) grads_[i] += wd * params_[i];
    }
    exchange(lr, density, compress::density_at(downlink_spec_, pos), pos);
    finish_step(images, loss, epoch, step, lr, density);
  }

  // A step in a local group: every member's gradient (zeros for a skipped step or an
  // empty batch) summed in the group, member 0's push of the sum and its pull, the pulled
  // parameters from member 0 to every member.
  void group_step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb, float lr,
                  double density, double downlink, double pos) {
    const std::int64_t images = xb.size(0);
    const double loss = images > 0 ? compute_gradient(xb, yb) : std::nan("");
    const bool ok = images > 0 && finite_step(loss, epoch, step);
    if (ok) {
      const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
      if (wd > 0) {
        for (std::size_t i = 0; i < grads_.size(); ++i) grads_[i] += wd * params_[i];
      }
    } else {
      std::fill(grads_.begin(), grads_.end(), 0.0f);
    }
    const auto t0 = Clock::now();
#if DLTRAIN_HAVE_GPU
    if (nccl_) return nccl_group_step(epoch, step, images, loss, ok, lr, density, downlink, pos);
#endif
    group_->allreduce_sum(grads_);
    counters_.exchange_seconds += seconds_since(t0);
    if (group_->pushes()) exchange(lr, density, downlink, pos);
    const auto t1 = Clock::now();
    group_->broadcast(params_);
    counters_.exchange_seconds += seconds_since(t1);
    if (!ok) return skipped_group_step();
    finish_step(images, loss, epoch, step, lr, density);
  }

  // A member's skipped step still was a step of its group (member 0 pushed the sum): the
  // parameters it received go into the model and the step counts, so that every member
  // stops at the same step (max_steps).
  void skipped_group_step() {
    flat_->write_params(params_);
    ++global_step_;
    if (spec_.max_steps > 0 && global_step_ >= spec_.max_steps) stop_ = true;
  }

#if DLTRAIN_HAVE_GPU
  // group_step with NCCL (GPU workers): the gradients (weight decay added) are summed on
  // the GPUs and member 0 copies the sum to the host for its push; the parameters it
  // pulled go to the others by ncclBroadcast from its GPU (and to their hosts, for the
  // replica they save when stopped). Every member has also copied its own gradient to the
  // host in compute_gradient, for the NaN/Inf check.
  void nccl_group_step(int epoch, std::int64_t step, std::int64_t images, double loss, bool ok, float lr,
                       double density, double downlink, double pos) {
    const auto t0 = Clock::now();
    torch::Tensor flat;
    {
      torch::NoGradGuard ng;
      const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
      std::vector<torch::Tensor> parts;
      for (auto& p : flat_->tensors()) {
        torch::Tensor g = ok && p.grad().defined() ? p.grad() : torch::zeros_like(p);
        if (ok && wd > 0) g = g + wd * p;
        parts.push_back(g.reshape({-1}));
      }
      flat = torch::cat(parts).contiguous();
    }
    nccl_->allreduce_sum(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()));
    if (group_->pushes()) {
      const auto host = flat.to(torch::kCPU);
      std::memcpy(grads_.data(), host.data_ptr<float>(), sizeof(float) * grads_.size());
    }
    counters_.exchange_seconds += seconds_since(t0);
    if (group_->pushes()) exchange(lr, density, downlink, pos);
    const auto t1 = Clock::now();
    torch::Tensor shared = group_->pushes()
                               ? torch::from_blob(params_.data(), {static_cast<std::int64_t>(params_.size())},
                                                  torch::kFloat32)
                                     .to(device_)
                               : torch::empty({static_cast<std::int64_t>(params_.size())},
                                              torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    nccl_->broadcast(shared.data_ptr<float>(), params_.size());
    if (!group_->pushes()) {
      const auto host = shared.to(torch::kCPU);
      std::memcpy(params_.data(), host.data_ptr<float>(), sizeof(float) * params_.size());
    }
    counters_.exchange_seconds += seconds_since(t1);
    if (!ok) return skipped_group_step();
    finish_step(images, loss, epoch, step, lr, density);
  }
#endif

  // After the exchange: the pulled parameters into the model, counters, reports.
  void finish_step(std::int64_t images, double loss, int epoch, std::int64_t step, float lr, double density) {
    last_density_ = density;
    mark(StepPhase::kApply, Clock::now());
    flat_->write_params(params_);
    end_step_trace();
    ++global_step_;
    if (global_step_ == kProfileWarmupSteps) t_profile_ = Clock::now();
    if (global_step_ > kProfileWarmupSteps) profile_images_ += images;
    if (spec_.max_steps > 0 && global_step_ >= spec_.max_steps) stop_ = true;
    loss_sum_ += loss;
    ++loss_count_;
    recent_loss_ += loss;
    ++recent_count_;
    images_since_report_ += images;
    counters_.images += images;
    ++counters_.steps;
    maybe_report(epoch, step, lr);
  }

  // Forward and backward on the batch; the flat gradient is in grads_. Returns the loss.
  double compute_gradient(const torch::Tensor& xb, const torch::Tensor& yb) {
    const auto t1 = Clock::now();
    model_.module->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model_.forward(xb), yb);
    const auto t2 = Clock::now();
    loss.backward();
    if (device_encoder_active()) {
      device_gradient();
    } else {
      flat_->read_grads(grads_);
    }
    const double value = loss.item<double>();
    const auto t3 = Clock::now();
    counters_.compute_seconds += std::chrono::duration<double>(t3 - t1).count();
    mark(StepPhase::kForward, t1);
    mark(StepPhase::kBackward, t2);
    mark(StepPhase::kCompress, t3);
    return value;
  }

  // compute_gradient with overlap: backward runs with the push hooks armed, so most
  // partitions are pushed before it returns; a NaN/Inf loss skips backward (nothing is
  // pushed). The partitions still unpushed are exchange()'s.
  double compute_gradient_overlapped(const torch::Tensor& xb, const torch::Tensor& yb) {
    const auto t1 = Clock::now();
    model_.module->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model_.forward(xb), yb);
    const double value = loss.item<double>();
    const auto t2 = Clock::now();
    await_pull();  // the hooks push through the client
    tracker_->begin_step();
    hook_.nonfinite = false;
    hook_.error = nullptr;
    if (plain_pushes_.size() != layout_.partitions.size()) plain_pushes_.resize(layout_.partitions.size());
    if (std::isfinite(value)) {
      hook_.active = true;
      try {
        loss.backward();
      } catch (...) {
        hook_.active = false;
        throw;
      }
      hook_.active = false;
    } else {
      hook_.nonfinite = true;
    }
    const auto t3 = Clock::now();
    counters_.compute_seconds += std::chrono::duration<double>(t3 - t1).count();
    mark(StepPhase::kForward, t1);
    mark(StepPhase::kBackward, t2);
    mark(StepPhase::kCompress, t3);
    return value;
  }

  // A NaN/Inf loss or gradient is never pushed: the step is skipped and counted; too many
  // in a row end the worker (the model diverged). With overlap the gradient was checked
  // partition by partition as it was pushed (`nonfinite`).
  bool finite_step(double loss, int epoch, std::int64_t step, bool nonfinite = false) {
    bool finite = std::isfinite(loss) && !nonfinite && !(device_encoder_active() && device_nonfinite_);
    for (std::size_t i = 0; finite && !spec_.overlap && !device_encoder_active() && i < grads_.size(); ++i) {
      finite = std::isfinite(grads_[i]);
    }
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

  // Push this step's gradient and pull; a lost shard drops the step's gradient and leaves
  // params_ holding the PS's values.
  void exchange(float lr, double density, double downlink, double pos) {
    // With overlap the step's bytes count from the end of the previous step's exchange:
    // they include the pushes backward's hooks wrote and the pipelined pull's replies.
    const auto up0 = spec_.overlap ? meter_up0_ : client_->bytes_pushed();
    const auto down0 = spec_.overlap ? meter_down0_ : client_->bytes_pulled();
    bool pull_ahead = false;
    try {
      if (spec_.overlap) {
        // The partitions backward did not complete (parameters without a gradient: zero),
        // then the pull. A push that failed in a hook fails the step here.
        const auto t0 = Clock::now();
        mark(StepPhase::kPushPull, t0);
        for (const auto& p : layout_.partitions) {
          if (tracker_->claimed(p.key)) continue;
          tracker_->zero_missing(p, grads_);
          push_partition(p.key, false);
        }
        if (hook_.error) std::rethrow_exception(hook_.error);
        if (pipelined_) {
          // The values the pull issued after the previous step brought (awaited before
          // backward) go into the model now; this step's pull runs while the next
          // step's data and forward do.
          params_ = replica_;
          pull_ahead = true;
        } else {
          client_->pull(params_, downlink);
        }
        counters_.exchange_seconds += seconds_since(t0);
      } else if (plain_) {
        const auto t0 = Clock::now();
        mark(StepPhase::kPushPull, t0);
        client_->push_pull(grads_, lr, params_);
        counters_.exchange_seconds += seconds_since(t0);
      } else {
        const auto t0 = Clock::now();
        const auto pushes = encode_pushes(density);
        const auto t1 = Clock::now();
        mark(StepPhase::kPushPull, t1);
        client_->push_pull(pushes, lr, downlink, params_);
        counters_.compress_seconds += std::chrono::duration<double>(t1 - t0).count();
        counters_.exchange_seconds += seconds_since(t1);
      }
      resyncer_->succeeded();
    } catch (const ps::PsConnectionLost& lost) {
      const auto t0 = Clock::now();
      resyncer_->recover(lost);
      replica_ = params_;  // a resync ends with a dense pull: what the shards think it holds
      counters_.exchange_seconds += seconds_since(t0);
    }
    pulled_at_ = unix_now();
    meter_->add_step(client_->bytes_pushed() - up0, client_->bytes_pulled() - down0, pos,
                     spec_.compression.warmup_epochs);
    last_pos_ = pos;
    meter_up0_ = client_->bytes_pushed();  // before the pipelined pull: no other thread uses the client
    meter_down0_ = client_->bytes_pulled();
    if (pull_ahead) start_pull(downlink);
  }

  // The step's pushes: the compressor's on the host, or on the GPU for a GPU worker.
  std::span<const ps::PartitionPush> encode_pushes(double density) {
#if DLTRAIN_HAVE_GPU
    if (device_encoder_) {
      // Local gradient clipping (DGC §3.4) of the device gradient: GradientCompressor::clip's
      // rule, with the norm summed in float on the device (in double on the host).
      if (spec_.compression.clip_norm > 0) {
        const double norm = device_grad_.norm().item<double>();
        const double limit = spec_.compression.clip_norm / std::sqrt(static_cast<double>(std::max(1, spec_.workers)));
        if (norm > limit) device_grad_.mul_(limit / norm);
      }
      return device_encoder_->encode(device_grad_.data_ptr<float>(), density, static_cast<std::uint64_t>(global_step_));
    }
#endif
    return encoder_->encode(grads_, spec_.workers, density, static_cast<std::uint64_t>(global_step_));
  }

  bool device_encoder_active() const {
#if DLTRAIN_HAVE_GPU
    return device_encoder_ != nullptr;
#else
    return false;
#endif
  }

  // The flat gradient on the GPU (weight decay added there), and whether it is finite:
  // what the device encoder selects from. Nothing dense comes to the host.
  void device_gradient() {
#if DLTRAIN_HAVE_GPU
    torch::NoGradGuard ng;
    const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
    std::vector<torch::Tensor> parts;
    for (auto& p : flat_->tensors()) {
      torch::Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
      if (wd > 0) g = g + wd * p;
      parts.push_back(g.reshape({-1}));
    }
    device_grad_ = torch::cat(parts).contiguous();
    device_nonfinite_ = !torch::isfinite(device_grad_).all().item<bool>();
#endif
  }

  // Pipelined pulls (overlap in async and ssp): the pull runs on a thread of its own into
  // replica_ (dense: overwritten; sparse: the top-k of what changed added to it, replica_
  // being what the shards think this worker holds) while the main thread takes the next
  // batch and runs forward, which touch neither the client nor replica_.
  void start_pull(double downlink) {
    pending_pull_ = std::async(std::launch::async, [this, downlink] { client_->pull(replica_, downlink); });
  }

  // Waits for the pull in flight, if any (before anything else uses the client). A lost
  // connection is recovered as in exchange(); the replica then holds the PS's values.
  void await_pull() {
    if (!pending_pull_.valid()) return;
    try {
      pending_pull_.get();
      resyncer_->succeeded();
    } catch (const ps::PsConnectionLost& lost) {
      const auto t0 = Clock::now();
      resyncer_->recover(lost);  // params_ and the model now hold the PS's values
      replica_ = params_;
      counters_.exchange_seconds += seconds_since(t0);
    }
  }

  // The pull in flight, awaited and taken into the model (the end of an epoch, a stop).
  void drain_pull() {
    if (!pending_pull_.valid()) return;
    await_pull();
    // Its replies belong to the epoch's last step, whose traffic was counted before them.
    meter_->add_bytes(client_->bytes_pushed() - meter_up0_, client_->bytes_pulled() - meter_down0_, last_pos_,
                      spec_.compression.warmup_epochs);
    meter_up0_ = client_->bytes_pushed();
    meter_down0_ = client_->bytes_pulled();
    params_ = replica_;
    flat_->write_params(params_);
  }

  void maybe_report(int epoch, std::int64_t step, float lr) {
    const double since = seconds_since(last_report_);
    if (since < cfg_.progress_interval_s) return;
    wire::events::Progress ev;
    ev.rank = cfg_.rank;
    ev.epoch = epoch + 1;
    ev.step = step + 1;
    ev.steps_per_epoch = steps_per_epoch_;
    ev.global_step = global_step_;
    ev.loss = recent_loss_ / static_cast<double>(recent_count_);
    ev.lr = lr;
    ev.images_per_sec = static_cast<double>(images_since_report_) / since;
    ev.bytes_pushed = client_->bytes_pushed();
    ev.bytes_pulled = client_->bytes_pulled();
    ev.density = last_density_;
    ev.compression_ratio = meter_->total().ratio();
    ev.skipped_steps = skipped_steps_;
    ev.counters = counters();
    if (feed_->streaming()) {
      const double wait = feed_->wait_seconds();
      ev.data_wait_seconds = wait - wait_at_report_;
      ev.data_wait_fraction = std::clamp((wait - wait_at_report_) / since, 0.0, 1.0);
      ev.skipped_images = feed_->skipped_images();
      wait_at_report_ = wait;
    }
    sink_(ev.to_json());
    last_report_ = Clock::now();
    images_since_report_ = 0;
    recent_loss_ = 0;
    recent_count_ = 0;
  }

  void profiled() {
    const double secs = t_profile_ == Clock::time_point{} ? 0.0 : seconds_since(t_profile_);
    wire::events::Profile ev;
    ev.rank = cfg_.rank;
    ev.steps = global_step_;
    ev.measured_images = profile_images_;
    ev.measured_seconds = secs;
    ev.images_per_sec = secs > 0 ? static_cast<double>(profile_images_) / secs : 0.0;
    ev.bytes_pushed = client_->bytes_pushed();
    ev.bytes_pulled = client_->bytes_pulled();
    sink_(ev.to_json());
    stop_ = true;
  }

  void end_epoch(int epoch, double epoch_seconds) {
    wire::events::EpochEnd ev;
    ev.rank = cfg_.rank;
    ev.epoch = epoch + 1;
    ev.epochs = spec_.epochs;
    ev.train_loss = loss_sum_ / static_cast<double>(std::max<std::int64_t>(1, loss_count_));
    ev.epoch_seconds = epoch_seconds;
    ev.images_per_sec = static_cast<double>(n_) / epoch_seconds;
    if (feed_->streaming()) ev.data_wait_seconds = epoch_wait_;
    if (epoch + 1 == spec_.epochs || stop_) finish();
    if (cfg_.rank == 0) evaluate_on_test(ev);
    if (feed_->streaming()) ev.skipped_images = feed_->skipped_images();
    report_skipped_images();
    ev.bytes_pushed = client_->bytes_pushed();
    ev.bytes_pulled = client_->bytes_pulled();
    sink_(ev.to_json());
    epochs_finished_ = epoch + 1;
  }

  // Tells the PS this worker is done; rank 0 then waits for the others so that the final
  // accuracy is that of the finished model.
  void finish() {
    resyncer_->run([&] { client_->done(); });
    resyncer_->set_done_sent();
    if (cfg_.rank != 0) return;
    const auto deadline = Clock::now() + cfg_.finish_timeout;
    for (;;) {
      std::uint32_t finished = 0;
      resyncer_->run([&] { finished = client_->workers_done(); });
      if (finished >= static_cast<std::uint32_t>(spec_.workers)) return;
      if (Clock::now() >= deadline) {
        throw TimeoutError("worker 0: the other workers did not finish within " +
                           std::to_string(cfg_.finish_timeout.count()) + " s");
      }
      check_stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Rank 0: the test accuracy of the PS's current parameters (a dense pull), with the
  // BatchNorm statistics re-estimated for them.
  void evaluate_on_test(wire::events::EpochEnd& ev) {
    const auto t_eval = Clock::now();
    try {
      client_->pull(params_);
    } catch (const ps::PsConnectionLost& lost) {
      resyncer_->recover(lost);  // ends with a dense pull too
    }
    flat_->write_params(params_);
    // Up to 20 batches of 250, at most one pass over a smaller sample (a ResNet's forward
    // passes cost as much as the evaluation itself).
    const auto& recal = feed_->recalibration_inputs();
    const int batches = static_cast<int>(std::min<std::int64_t>(20, (recal.size(0) + 249) / 250));
    recalibrate_batchnorm(*model_.module, model_, recal, batches, 250);
    const double acc = feed_->evaluate(*model_.module, model_);
    ev.test_accuracy = acc;
    ev.eval_seconds = seconds_since(t_eval);
    final_accuracy_ = acc;
  }

  // Asked to stop (its job is being re-assigned, or its agent stops): the replica is the
  // PS's parameters as of this worker's last pull, the freshest copy the job may have of a
  // shard that was lost. `pulled_at` ranks the replicas of several workers.
  [[noreturn]] void stopped() {
    if (pending_pull_.valid()) {
      try {
        pending_pull_.get();
        params_ = replica_;  // the newest values this worker got
      } catch (...) {
        // the stop ended the pull in flight too: params_ keeps the last complete one
      }
    }
    wire::events::WorkerStopped ev;
    ev.rank = cfg_.rank;
    ev.epochs_done = epochs_finished_;
    if (!cfg_.replica_path.empty()) {
      wire::events::Replica r;
      try {
        ps::write_replica_file(cfg_.replica_path, params_, layout_, cfg_.job, static_cast<std::uint64_t>(global_step_));
        r.path = cfg_.replica_path;
        r.steps = global_step_;
        r.epochs_done = epochs_finished_;
        r.pulled_at = pulled_at_;
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      ev.replica = r;
    }
    sink_(ev.to_json());
    throw Stopped("worker " + std::to_string(cfg_.rank) + ": stopped at step " + std::to_string(global_step_));
  }

  void done() {
    wire::events::Done ev;
    ev.rank = cfg_.rank;
    if (final_accuracy_ >= 0) ev.test_accuracy = final_accuracy_;
    ev.steps = global_step_;
    ev.skipped_steps = skipped_steps_;
    ev.wall_seconds = seconds_since(t_start_);
    ev.bytes_pushed = client_->bytes_pushed();
    ev.bytes_pulled = client_->bytes_pulled();
    ev.traffic = meter_->total();
    ev.traffic_after_warmup = meter_->after_warmup();
    ev.compression_ratio = ev.traffic->ratio();
    ev.compression_ratio_after_warmup = ev.traffic_after_warmup->ratio();
    ev.counters = counters();
    if (feed_->streaming()) {
      ev.skipped_images = feed_->skipped_images();
      ev.data_wait_seconds = feed_->wait_seconds();
    }
    sink_(ev.to_json());
  }

  // The step timeline (train/step_trace.h): phase i of the step in progress begins at
  // step_.t[i]; a finished step goes into the ring, which is written to cfg_.trace_path
  // every cfg_.trace_interval_s.
  void mark(StepPhase p, Clock::time_point t) { step_.t[static_cast<std::size_t>(p)] = unix_us(t); }
  std::int64_t unix_us(Clock::time_point t) const {
    return unix_origin_us_ + std::chrono::duration_cast<std::chrono::microseconds>(t - steady_origin_).count();
  }
  void end_step_trace() {
    const auto now = Clock::now();
    step_.t[kStepPhases] = unix_us(now);
    trace_.push(step_);
    if (!cfg_.trace_path.empty() && std::chrono::duration<double>(now - last_trace_write_).count() >= cfg_.trace_interval_s) {
      write_trace();
      last_trace_write_ = now;
    }
  }
  // A timeline that cannot be written costs the timeline, not the training: one warning.
  void write_trace() noexcept {
    if (cfg_.trace_path.empty() || trace_.size() == 0) return;
    try {
      write_step_trace(cfg_.trace_path, step_trace_json("worker-" + std::to_string(cfg_.rank), trace_.last(trace_.size())));
    } catch (const std::exception& e) {
      if (!trace_warned_) spdlog::warn("the step timeline is not kept: {}", e.what());
      trace_warned_ = true;
    }
  }

  wire::events::StepCounters counters() const {
    auto c = counters_;
    c.resyncs = resyncer_ ? resyncer_->resyncs() : 0;
    return c;
  }

  const WorkerConfig& cfg_;
  const JobSpec& spec_;
  const ProgressSink& sink_;
  const Clock::time_point t_start_ = Clock::now();
  std::unique_ptr<DataFeed> feed_;
  double epoch_wait_ = 0, wait_at_report_ = 0;  // seconds the steps waited for the loader
  Model model_;
  std::unique_ptr<FlatParams> flat_;
  ps::PartitionLayout layout_;
  std::vector<float> params_, grads_;
  std::unique_ptr<ps::PsClient> client_;
  std::unique_ptr<PushEncoder> encoder_;
  std::unique_ptr<TrafficMeter> meter_;
  std::unique_ptr<PsResyncer> resyncer_;
  compress::CompressionSpec downlink_spec_;
  bool plain_ = true;
  // Overlap: which partitions backward has completed (train/overlap.h), and the step in
  // progress.
  std::unique_ptr<PartitionTracker> tracker_;
  std::vector<ps::PartitionPush> plain_pushes_;
  struct {
    bool active = false;     // backward of a training step is running
    float lr = 0;
    double density = 1;
    bool nonfinite = false;  // a NaN/Inf loss or partition: the rest of the step is not pushed
    std::exception_ptr error;  // a push that failed in a hook, rethrown by exchange()
  } hook_;
  // The client's byte counts when the last step's traffic was counted (overlap) or when
  // the epoch began: the next step's traffic is what they grew by.
  std::uint64_t meter_up0_ = 0, meter_down0_ = 0;
  double last_pos_ = 0;  // the training position of the last step counted
  // Overlap in async and ssp: this step's pull runs during the next step's forward.
  bool pipelined_ = false;
  std::vector<float> replica_;          // the pipelined pull's target (see start_pull)
  std::future<void> pending_pull_;
  torch::Generator gen_;
  std::int64_t n_ = 0, steps_per_epoch_ = 1;
  int first_epoch_ = 0, epochs_finished_ = 0;
  std::int64_t global_step_ = 0;
  double pulled_at_ = 0;  // when params_ last took the PS's values (Unix time, s)
  double final_accuracy_ = -1.0;
  double last_density_ = 1.0;
  double loss_sum_ = 0, recent_loss_ = 0;
  std::int64_t loss_count_ = 0, recent_count_ = 0, images_since_report_ = 0;
  std::int64_t skipped_steps_ = 0, consecutive_skips_ = 0;
  Clock::time_point last_report_{}, t_profile_{};
  std::int64_t profile_images_ = 0;
  wire::events::StepCounters counters_;  // cumulative, this process (resyncs from resyncer_)
  bool stop_ = false;
  torch::Device device_{torch::kCPU};  // where the model trains (spec.device)
  std::unique_ptr<LocalGroup> group_;  // this worker's local group, if it is in one
#if DLTRAIN_HAVE_GPU
  std::unique_ptr<gpu::NcclGroup> nccl_;  // its NCCL backend (GPU workers); destroyed before group_
  std::unique_ptr<gpu::DevicePushEncoder> device_encoder_;  // a GPU worker's pushes selected on its GPU
#endif
  torch::Tensor device_grad_;      // the device encoder's input: the flat gradient on the GPU
  bool device_nonfinite_ = false;  // device_grad_ holds a NaN/Inf
  int resume_epoch_ = 0;               // cfg.resume_epoch, or the group's agreed one
  // The step timeline: steady-clock reads placed on the Unix time line (so that the
  // timelines of several workers line up) through one pair of reads taken together.
  const Clock::time_point steady_origin_ = Clock::now();
  const std::int64_t unix_origin_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count();
  StepTraceRing trace_;
  StepRecord step_;
  Clock::time_point last_trace_write_ = Clock::now();
  bool trace_warned_ = false;
};

}  // namespace

double run_worker(const WorkerConfig& cfg, const ProgressSink& sink) { return WorkerLoop(cfg, sink).run(); }

}  // namespace dltrain::train
