// WorkerLoop in a local group (train/worker_loop.h; docs/gpu.md, "Local groups"): the
// members' gradients summed in the group (over its socket, or with NCCL on GPUs), member
// 0's exchange with the PS, the pulled parameters from member 0 to every member.
#include <algorithm>
#include <cmath>

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
  grp_.group = group::LocalGroup::join(o);
  grp_.reduction = make_group_reduction(*grp_.group, device_, o.timeout, cfg_.stop_requested);
  std::vector<float> agree(2 * static_cast<std::size_t>(grp_.group->size()), 0.0f);
  agree[2 * static_cast<std::size_t>(grp_.group->rank())] = static_cast<float>(steps_per_epoch_);
  agree[2 * static_cast<std::size_t>(grp_.group->rank()) + 1] = static_cast<float>(cfg_.resume_epoch);
  grp_.group->allreduce_sum(agree);
  for (int r = 0; r < grp_.group->size(); ++r) {
    steps_per_epoch_ = std::min(steps_per_epoch_, static_cast<std::int64_t>(agree[2 * static_cast<std::size_t>(r)]));
    resume_epoch_ = std::min(resume_epoch_, static_cast<int>(agree[2 * static_cast<std::size_t>(r) + 1]));
  }
  spdlog::info("local group: {} joined; {} steps per epoch, training from epoch {}", grp_.group->describe(grp_.group->rank()),
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
  const auto t0 = Clock::now();
  grp_.reduction->sum_gradients(
      {grads_, params_, flat_->tensors(), ok, static_cast<float>(spec_.optimizer.weight_decay)});
  rep_.counters.exchange_seconds += seconds_since(t0);
  if (grp_.group->pushes()) exchange(lr, density, downlink, pos);
  const auto t1 = Clock::now();
  grp_.reduction->broadcast_params(params_);
  rep_.counters.exchange_seconds += seconds_since(t1);
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

}  // namespace dltrain::train::detail
