// WorkerLoop's exchange with the PS shards (train/worker_loop.h): the step's push and
// pull, dense or compressed, on the host or from the GPU; overlap's pushes from the
// backward hooks and its pipelined pulls (docs/training.md, "Overlap").
#include <algorithm>
#include <cmath>
#include <cstring>

#include <torch/torch.h>

#include "train/worker_loop.h"

namespace dltrain::train::detail {

// Overlap (docs/training.md, "Overlap"): a hook on every parameter copies its gradient
// into grads_ when backward has produced it; a partition whose floats are all in is
// pushed from the hook, while backward goes on with the layers before it. The write
// returns once the kernel holds the frame, which it sends meanwhile.
void WorkerLoop::install_push_hooks() {
  tracker_ = std::make_unique<ps::PartitionTracker>(flat_->sizes(), layout_);
  auto& tensors = flat_->tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
  }
}

void WorkerLoop::on_gradient(std::size_t i, const torch::Tensor& grad) {
  if (!hook_.active) return;
  const auto c = grad.to(torch::kCPU).contiguous();
  std::memcpy(grads_.data() + tracker_->offset(i), c.data_ptr<float>(), sizeof(float) * c.numel());
  for (const auto key : tracker_->arrived(i)) push_partition(key, true);
}

// Weight decay, the finiteness check and the encoding of partition `key` of grads_,
// then its push. A non-finite partition is not pushed and marks the step skipped
// (the partitions already pushed stay applied); a failed push is kept for exchange().
void WorkerLoop::push_partition(std::uint32_t key, bool in_backward) {
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

// compute_gradient with overlap: backward runs with the push hooks armed, so most
// partitions are pushed before it returns; a NaN/Inf loss skips backward (nothing is
// pushed). The partitions still unpushed are exchange()'s.
double WorkerLoop::compute_gradient_overlapped(const torch::Tensor& xb, const torch::Tensor& yb) {
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
  end_compute(t1, t2);
  return value;
}

// Push this step's gradient and pull; a lost shard drops the step's gradient and leaves
// params_ holding the PS's values.
void WorkerLoop::exchange(float lr, double density, double downlink, double pos) {
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
      mark(wire::StepPhase::kPushPull, t0);
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
      mark(wire::StepPhase::kPushPull, t0);
      client_->push_pull(grads_, lr, params_);
      counters_.exchange_seconds += seconds_since(t0);
    } else {
      const auto t0 = Clock::now();
      const auto pushes = encode_pushes(density);
      const auto t1 = Clock::now();
      mark(wire::StepPhase::kPushPull, t1);
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
std::span<const ps::PartitionPush> WorkerLoop::encode_pushes(double density) {
  if (device_encoder_) {
    const double clip = spec_.compression.clip_norm > 0
                            ? spec_.compression.clip_norm / std::sqrt(static_cast<double>(std::max(1, spec_.workers)))
                            : 0.0;
    return device_encoder_->encode(density, static_cast<std::uint64_t>(global_step_), clip);
  }
  return encoder_->encode(grads_, spec_.workers, density, static_cast<std::uint64_t>(global_step_));
}

// Pipelined pulls (overlap in async and ssp): the pull runs on a thread of its own into
// replica_ (dense: overwritten; sparse: the top-k of what changed added to it, replica_
// being what the shards think this worker holds) while the main thread takes the next
// batch and runs forward, which touch neither the client nor replica_.
void WorkerLoop::start_pull(double downlink) {
  pending_pull_ = std::async(std::launch::async, [this, downlink] { client_->pull(replica_, downlink); });
}

// Waits for the pull in flight, if any (before anything else uses the client). A lost
// connection is recovered as in exchange(); the replica then holds the PS's values.
void WorkerLoop::await_pull() {
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
void WorkerLoop::drain_pull() {
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

}  // namespace dltrain::train::detail
