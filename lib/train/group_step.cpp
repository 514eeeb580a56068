// LocalGroupStep (train/group_step.h), and WorkerLoop's step in a local group
// (train/worker_loop.h; docs/gpu.md, "Local groups").
#include "train/group_step.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "train/worker_loop.h"

namespace dltrain::train::detail {

void LocalGroupStep::join(group::LocalGroupOptions options, torch::Device device,
                          const std::atomic<bool>* stop_requested, std::int64_t& steps_per_epoch, int& resume_epoch) {
  options.stop_requested = stop_requested;
  group_ = group::LocalGroup::join(options);
  reduction_ = make_group_reduction(*group_, device, options.timeout, stop_requested);
  const auto me = static_cast<std::size_t>(group_->rank());
  std::vector<float> agree(2 * static_cast<std::size_t>(group_->size()), 0.0f);
  agree[2 * me] = static_cast<float>(steps_per_epoch);
  agree[2 * me + 1] = static_cast<float>(resume_epoch);
  group_->allreduce_sum(agree);
  for (std::size_t r = 0; r < static_cast<std::size_t>(group_->size()); ++r) {
    steps_per_epoch = std::min(steps_per_epoch, static_cast<std::int64_t>(agree[2 * r]));
    resume_epoch = std::min(resume_epoch, static_cast<int>(agree[2 * r + 1]));
  }
  spdlog::info("local group: {} joined; {} steps per epoch, training from epoch {}", group_->describe(group_->rank()),
               steps_per_epoch, resume_epoch + 1);
}

void LocalGroupStep::sum_gradients(ModelReplica& replica, bool ok, float weight_decay) {
  reduction_->sum_gradients({replica.grads, replica.params, replica.flat->tensors(), ok, weight_decay});
}

// A step in a local group: every member's gradient (zeros for a skipped step or an
// empty batch) summed in the group, member 0's push of the sum and its pull, the pulled
// parameters from member 0 to every member.
void WorkerLoop::group_step(const StepPlan& s, const torch::Tensor& xb, const torch::Tensor& yb) {
  const std::int64_t images = xb.size(0);
  const double loss = images > 0 ? compute_gradient(xb, yb) : std::nan("");
  const bool ok = images > 0 && finite_step(loss, s);
  const auto t0 = Clock::now();
  grp_.sum_gradients(replica_, ok, static_cast<float>(spec_.optimizer.weight_decay));
  rep_.counters().exchange_seconds += seconds_since(t0);
  if (grp_.pushes()) ex_.exchange(s.lr, s.density, s.downlink, s.pos);
  const auto t1 = Clock::now();
  grp_.broadcast_params(replica_);
  rep_.counters().exchange_seconds += seconds_since(t1);
  if (!ok) {
    // A member's skipped step still was a step of its group (member 0 pushed the sum):
    // the parameters it received go into the model and the step counts, so that every
    // member stops at the same step (max_steps).
    replica_.write_model();
    ++replica_.global_step;
    if (spec_.max_steps > 0 && replica_.global_step >= spec_.max_steps) stop_ = true;
    return;
  }
  finish_step(images, loss, s);
}

}  // namespace dltrain::train::detail
