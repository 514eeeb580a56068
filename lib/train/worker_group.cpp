// WorkerLoop in a local group (train/worker_loop.h; docs/gpu.md, "Local groups"): the
// members' gradients summed in the group (over its socket, or with NCCL on GPUs), member
// 0's exchange with the PS, the pulled parameters from member 0 to every member.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "train/worker_loop.h"

namespace dltrain::train::detail {

// The workers of this job on this machine (docs/gpu.md, "Local groups"): they agree on
// the steps of an epoch (the fewest of any member's shard, so that every member calls
// the group's operations as often) and on where a restarted group resumes (the
// earliest epoch any member had not finished).
void WorkerLoop::join_local_group() {
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

// A step in a local group: every member's gradient (zeros for a skipped step or an
// empty batch) summed in the group, member 0's push of the sum and its pull, the pulled
// parameters from member 0 to every member.
void WorkerLoop::group_step(int epoch, std::int64_t step, const torch::Tensor& xb, const torch::Tensor& yb, float lr,
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
void WorkerLoop::skipped_group_step() {
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
void WorkerLoop::nccl_group_step(int epoch, std::int64_t step, std::int64_t images, double loss, bool ok, float lr,
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

}  // namespace dltrain::train::detail
