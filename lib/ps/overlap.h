// Overlap's bookkeeping (docs/training.md, "Overlap"): during backward, which partitions
// of the flat gradient are complete, so that each is pushed as soon as the last of its
// parameter tensors has its gradient. No LibTorch here: the worker (train/ps_exchange.cpp)
// calls it from its autograd hooks.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "ps/partition.h"

namespace dltrain::ps {

/// Tracks one step's gradients tensor by tensor against a partition layout. Tensors are
/// the model's parameter tensors in flat-vector order, tensor i covering the floats
/// [offset(i), offset(i) + size_i) of the flat vector; the layout covers the same
/// vector. Memory: O(tensors + partitions + overlapping pairs). Not thread-safe (the
/// training thread owns it; autograd calls the hooks on it).
class PartitionTracker {
 public:
  /// `tensor_sizes`: floats per parameter tensor, each >= 0, adding up to
  /// layout.total_floats.
  PartitionTracker(const std::vector<std::int64_t>& tensor_sizes, const ps::PartitionLayout& layout);

  /// Starts a step: no tensor has its gradient, no partition is claimed.
  void begin_step();
  /// First float of tensor `i` in the flat vector.
  std::int64_t offset(std::size_t i) const { return offsets_[i]; }
  /// Tensor `i`'s gradient arrived (once per step); returns the keys of the partitions
  /// it completed, in layout order.
  std::vector<std::uint32_t> arrived(std::size_t i);
  /// Claims partition `key` for its push: true the first time in a step, false after.
  bool claim(std::uint32_t key);
  bool claimed(std::uint32_t key) const { return claimed_[key]; }
  /// Zeroes the floats of partition `p` in `grads` (the flat gradient) whose tensors got
  /// no gradient this step (parameters the loss does not depend on).
  void zero_missing(const ps::Partition& p, std::span<float> grads) const;

 private:
  std::vector<std::int64_t> sizes_, offsets_;
  std::vector<std::vector<std::pair<std::uint32_t, std::int64_t>>> parts_;  // per tensor: (key, floats)
  std::vector<std::int64_t> lengths_, remaining_;  // per partition: floats, floats still to come
  std::vector<bool> claimed_, got_;                // per partition, per tensor
};

}  // namespace dltrain::ps
