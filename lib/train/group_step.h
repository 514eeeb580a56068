// A worker's local group (internal to lib/train; docs/gpu.md, "Local groups"): the
// workers of a job on one machine, whose gradients are summed in the group (over its
// socket, or with NCCL on GPUs) and pushed by member 0, whose pulled parameters go from
// member 0 to every member. WorkerLoop owns one; empty unless the job runs in groups.
// Not thread-safe: the training thread owns it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <torch/torch.h>

#include "group/local_group.h"
#include "train/backends.h"
#include "train/model_replica.h"

namespace dltrain::train::detail {

/// This worker's place in its local group and the group's reduction.
class LocalGroupStep {
 public:
  /// Joins the group `options` describe, its reduction on `device` (NCCL for a GPU).
  /// The members agree on the steps of an epoch (the fewest of any member's shard, so
  /// that every member calls the group's operations as often: `steps_per_epoch` is
  /// lowered to it) and on where a restarted group resumes (the earliest epoch any
  /// member had not finished: `resume_epoch` is lowered to it). `stop_requested` (may be
  /// null) ends a wait. Throws the group's errors (group/local_group.h).
  void join(group::LocalGroupOptions options, torch::Device device, const std::atomic<bool>* stop_requested,
            std::int64_t& steps_per_epoch, int& resume_epoch);
  /// True once joined.
  explicit operator bool() const { return group_ != nullptr; }
  /// True for the member that pushes the group's sum and pulls (member 0).
  bool pushes() const { return group_->pushes(); }
  /// Sums the members' gradients into replica.grads (a member whose step was not `ok`
  /// adds zeros), with `weight_decay` added once.
  void sum_gradients(ModelReplica& replica, bool ok, float weight_decay);
  /// Member 0's replica.params to every member.
  void broadcast_params(ModelReplica& replica) { reduction_->broadcast_params(replica.params); }

 private:
  std::unique_ptr<group::LocalGroup> group_;
  std::unique_ptr<GroupReduction> reduction_;  // its sum (sockets or NCCL); destroyed before group_
};

}  // namespace dltrain::train::detail
