// The worker's two hardware seams (internal to lib/train; docs/architecture.md, "The
// worker"): how a local group sums its members' gradients, and how a GPU worker turns
// its gradient into pushes without bringing it to the host. Each has a CPU form and a
// GPU form, and backends.cpp is the one place that chooses between them (and the only
// file of lib/train that knows whether the build has CUDA: dltrain/config.h's
// DLTRAIN_WITH_CUDA). The step loop (worker_loop.h) holds the interfaces only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "common/compression_spec.h"
#include "group/local_group.h"
#include "ps/client.h"
#include "ps/partition.h"

namespace dltrain::train::detail {

/// One step's gradient as a local group's reduction sees it. `grads` and `params` are the
/// member's flat host floats (same length, parameters() order); `tensors` its parameter
/// tensors (on its training device). `ok` false: the member's step was skipped (NaN/Inf or
/// an empty batch) and it contributes zeros. `weight_decay` >= 0 is added as wd·θ to a
/// contributed gradient (L2 regularisation, applied before the sum as in a single
/// worker's step).
struct StepGradient {
  std::vector<float>& grads;
  const std::vector<float>& params;
  std::vector<torch::Tensor>& tensors;
  bool ok = true;
  float weight_decay = 0;
};

/// A local group's reduction (docs/gpu.md, "Local groups"; BytePS's intra-machine
/// synchronous sum, Jiang et al. 2020 §4). Every member calls the same operations in the
/// same order. Throws group::LocalGroupError when a member ends, leaves or stalls past
/// the group's timeout. Not thread-safe: the training thread.
class GroupReduction {
 public:
  virtual ~GroupReduction() = default;
  /// Sums every member's gradient. On return the pushing member's (member 0's)
  /// `g.grads` holds the sum on the host; another member's `g.grads` is unspecified.
  virtual void sum_gradients(StepGradient g) = 0;
  /// Member 0's `params` (host floats, what it pulled) to every member's `params`.
  virtual void broadcast_params(std::vector<float>& params) = 0;
};

/// The reduction for a group of workers training on `device`: over the group's Unix
/// sockets on the host (group::LocalGroup's CPU backend), or with NCCL on the GPUs when
/// the build has CUDA, `device` is a GPU and the group has more than one member. `group`
/// must outlive the result; `stop_requested` (may be null) ends a wait early.
std::unique_ptr<GroupReduction> make_group_reduction(group::LocalGroup& group, const torch::Device& device,
                                                     std::chrono::milliseconds timeout,
                                                     const std::atomic<bool>* stop_requested);

/// A GPU worker's push encoder (gpu/device_push_encoder.h behind this seam): the step's
/// gradient is gathered and compressed on the device, and only the selected (index,
/// value) pairs come to the host. Not thread-safe: the training thread.
class DeviceEncoder {
 public:
  virtual ~DeviceEncoder() = default;
  /// After backward: the model's gradients (zeros for a tensor without one) plus
  /// `weight_decay`·θ, flattened on the device. Returns false when any is NaN/Inf.
  virtual bool gather(std::vector<torch::Tensor>& tensors, float weight_decay) = 0;
  /// The pushes of the gathered gradient at `density` in (0, 1], for global step
  /// `step` (the seed of seeded methods), after local gradient clipping to L2 norm
  /// `clip_limit` (0 = none; Lin et al. 2018, "Deep Gradient Compression", §3.4). The
  /// span stays valid until the next call.
  virtual std::span<const ps::PartitionPush> encode(double density, std::uint64_t step, double clip_limit) = 0;
};

/// The device encoder for a worker on `device` with compression `spec` over `layout`,
/// seeded with `seed`; nullptr where pushes are encoded on the host: a CPU device or a
/// build without CUDA, overlap (partitions pushed from backward's hooks), a local group
/// (member 0 pushes the group's sum), or a method the device does not implement.
std::unique_ptr<DeviceEncoder> make_device_encoder(const compress::CompressionSpec& spec,
                                                   const ps::PartitionLayout& layout, std::uint64_t seed,
                                                   const torch::Device& device, bool overlap, bool in_local_group);

}  // namespace dltrain::train::detail
