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
  ex_.tracker = std::make_unique<ps::PartitionTracker>(flat_->sizes(), layout_);
  auto& tensors = flat_->tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
  }
}

void WorkerLoop::on_gradient(std::size_t i, const torch::Tensor& grad) {
  if (!ex_.hook.active) return;
  const auto c = grad.to(torch::kCPU).contiguous();
  std::memcpy(grads_.data() + ex_.tracker->offset(i), c.data_ptr<float>(), sizeof(float) * c.numel());
  for (const auto key : ex_.tracker->arrived(i)) push_partition(key, true);
}

// Weight decay, the finiteness check and the encoding of partition `key` of grads_,
// then its push. A non-finite partition is not pushed and marks the step skipped
// (the partitions already pushed stay applied); a failed push is kept for exchange().
void WorkerLoop::push_partition(std::uint32_t key, bool in_backward) {
  if (ex_.hook.error || ex_.hook.nonfinite || !ex_.tracker->claim(key)) return;
  const auto& p = layout_.partitions[key];
  auto g = std::span<float>(grads_).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length));
  const auto x = std::span<const float>(params_).subspan(static_cast<std::size_t>(p.offset), g.size());
  if (std::any_of(g.begin(), g.end(), [](float v) { return !std::isfinite(v); })) {
    ex_.hook.nonfinite = true;
    return;
  }
  const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
  if (wd > 0) {
    for (std::size_t j = 0; j < g.size(); ++j) g[j] += wd * x[j];
  }
  try {
    std::span<const ps::PartitionPush> pushes;
    if (ex_.plain) {
      auto& pp = ex_.plain_pushes[key];
      pp.codec = wire::Codec::kDenseF32;
      pp.count = static_cast<std::uint32_t>(g.size());
      pp.first = std::as_bytes(std::span<const float>(g));
      pushes = ex_.plain_pushes;
    } else {
      const auto t0 = Clock::now();
      pushes = ex_.encoder->encode_partition(key, g, ex_.hook.density, static_cast<std::uint64_t>(global_step_));
      rep_.counters.compress_seconds += seconds_since(t0);
    }
    const std::uint32_t keys[] = {key};
    ex_.client->push(pushes, keys, ex_.hook.lr);
    if (in_backward) ++rep_.counters.overlapped_pushes;
  } catch (...) {
    ex_.hook.error = std::current_exception();
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
  ex_.tracker->begin_step();
  ex_.hook.nonfinite = false;
  ex_.hook.error = nullptr;
  if (ex_.plain_pushes.size() != layout_.partitions.size()) ex_.plain_pushes.resize(layout_.partitions.size());
  if (std::isfinite(value)) {
    ex_.hook.active = true;
    try {
      loss.backward();
    } catch (...) {
      ex_.hook.active = false;
      throw;
    }
    ex_.hook.active = false;
  } else {
    ex_.hook.nonfinite = true;
  }
  end_compute(t1, t2);
  return value;
}

// Push this step's gradient and pull; a lost shard drops the step's gradient and leaves
// params_ holding the PS's values.
void WorkerLoop::exchange(float lr, double density, double downlink, double pos) {
  // With overlap the step's bytes count from the end of the previous step's exchange:
  // they include the pushes backward's hooks wrote and the pipelined pull's replies.
  const auto up0 = spec_.overlap ? ex_.meter_up0 : ex_.client->bytes_pushed();
  const auto down0 = spec_.overlap ? ex_.meter_down0 : ex_.client->bytes_pulled();
  bool pull_ahead = false;
  try {
    if (spec_.overlap) {
      // The partitions backward did not complete (parameters without a gradient: zero),
      // then the pull. A push that failed in a hook fails the step here.
      const auto t0 = Clock::now();
      mark(wire::StepPhase::kPushPull, t0);
      for (const auto& p : layout_.partitions) {
        if (ex_.tracker->claimed(p.key)) continue;
        ex_.tracker->zero_missing(p, grads_);
        push_partition(p.key, false);
      }
      if (ex_.hook.error) std::rethrow_exception(ex_.hook.error);
      if (ex_.pipelined) {
        // The values the pull issued after the previous step brought (awaited before
        // backward) go into the model now; this step's pull runs while the next
        // step's data and forward do.
        params_ = ex_.replica;
        pull_ahead = true;
      } else {
        ex_.client->pull(params_, downlink);
      }
      rep_.counters.exchange_seconds += seconds_since(t0);
    } else if (ex_.plain) {
      const auto t0 = Clock::now();
      mark(wire::StepPhase::kPushPull, t0);
      ex_.client->push_pull(grads_, lr, params_);
      rep_.counters.exchange_seconds += seconds_since(t0);
    } else {
      const auto t0 = Clock::now();
      const auto pushes = encode_pushes(density);
      const auto t1 = Clock::now();
      mark(wire::StepPhase::kPushPull, t1);
      ex_.client->push_pull(pushes, lr, downlink, params_);
      rep_.counters.compress_seconds += std::chrono::duration<double>(t1 - t0).count();
      rep_.counters.exchange_seconds += seconds_since(t1);
    }
    ex_.resyncer->succeeded();
  } catch (const ps::PsConnectionLost& lost) {
    const auto t0 = Clock::now();
    ex_.resyncer->recover(lost);
    ex_.replica = params_;  // a resync ends with a dense pull: what the shards think it holds
    rep_.counters.exchange_seconds += seconds_since(t0);
  }
  pulled_at_ = unix_now();
  ex_.meter->add_step(ex_.client->bytes_pushed() - up0, ex_.client->bytes_pulled() - down0, pos,
                   spec_.compression.warmup_epochs);
  ex_.last_pos = pos;
  ex_.meter_up0 = ex_.client->bytes_pushed();  // before the pipelined pull: no other thread uses the client
  ex_.meter_down0 = ex_.client->bytes_pulled();
  if (pull_ahead) start_pull(downlink);
}

// The step's pushes: the compressor's on the host, or on the GPU for a GPU worker.
std::span<const ps::PartitionPush> WorkerLoop::encode_pushes(double density) {
  if (ex_.device_encoder) {
    const double clip = spec_.compression.clip_norm > 0
                            ? spec_.compression.clip_norm / std::sqrt(static_cast<double>(std::max(1, spec_.workers)))
                            : 0.0;
    return ex_.device_encoder->encode(density, static_cast<std::uint64_t>(global_step_), clip);
  }
  return ex_.encoder->encode(grads_, spec_.workers, density, static_cast<std::uint64_t>(global_step_));
}

// Pipelined pulls (overlap in async and ssp): the pull runs on a thread of its own into
// ex_.replica (dense: overwritten; sparse: the top-k of what changed added to it, ex_.replica
// being what the shards think this worker holds) while the main thread takes the next
// batch and runs forward, which touch neither the client nor ex_.replica.
void WorkerLoop::start_pull(double downlink) {
  ex_.pending_pull = ex_.client->start_pull(ex_.replica, downlink);
}

// Waits for the pull in flight, if any (before anything else uses the client). A lost
// connection is recovered as in exchange(); the replica then holds the PS's values.
void WorkerLoop::await_pull() {
  if (!ex_.pending_pull.active()) return;
  try {
    ex_.pending_pull.wait();
    ex_.resyncer->succeeded();
  } catch (const ps::PsConnectionLost& lost) {
    const auto t0 = Clock::now();
    ex_.resyncer->recover(lost);  // params_ and the model now hold the PS's values
    ex_.replica = params_;
    rep_.counters.exchange_seconds += seconds_since(t0);
  }
}

// The pull in flight, awaited and taken into the model (the end of an epoch, a stop).
void WorkerLoop::drain_pull() {
  if (!ex_.pending_pull.active()) return;
  await_pull();
  // Its replies belong to the epoch's last step, whose traffic was counted before them.
  ex_.meter->add_bytes(ex_.client->bytes_pushed() - ex_.meter_up0, ex_.client->bytes_pulled() - ex_.meter_down0, ex_.last_pos,
                    spec_.compression.warmup_epochs);
  ex_.meter_up0 = ex_.client->bytes_pushed();
  ex_.meter_down0 = ex_.client->bytes_pulled();
  params_ = ex_.replica;
  flat_->write_params(params_);
}

}  // namespace dltrain::train::detail
