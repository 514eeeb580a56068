// The GPU forms of the worker's backends (train/backends.h), built only with CUDA
// (-DDLTRAIN_WITH_CUDA=ON): NCCL for a local group's sum, lib/gpu's device push encoder.
// Only backends.cpp, the factory, includes this header.
#pragma once

#include "train/backends.h"

namespace dltrain::train::detail {

/// NCCL over the group's GPUs (gpu/nccl_group.h), the communicator formed through
/// `group`'s sockets; `device` is this member's GPU. Throws group::LocalGroupError when
/// forming it fails or a member ends.
std::unique_ptr<GroupReduction> make_nccl_reduction(group::LocalGroup& group, const torch::Device& device,
                                                    std::chrono::milliseconds timeout,
                                                    const std::atomic<bool>* stop_requested);

/// True when gpu::DevicePushEncoder implements `spec`'s method (top-k, DGC).
bool gpu_encoder_handles(const compress::CompressionSpec& spec);

/// gpu::DevicePushEncoder behind DeviceEncoder, on the current CUDA device.
std::unique_ptr<DeviceEncoder> make_gpu_device_encoder(const compress::CompressionSpec& spec,
                                                       const ps::PartitionLayout& layout, std::uint64_t seed);

}  // namespace dltrain::train::detail
