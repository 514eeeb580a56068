// The push frames of a GPU worker whose gradient stays on its device (-DDLTRAIN_WITH_CUDA=ON):
// ps::PushEncoder's mapping (ps/exchange.h) over one gpu::DeviceCompressor per
// partition, so that a step copies only each partition's k selected (index, value) pairs
// to the host — 8 bytes per selected coordinate, against 4 per parameter for the dense
// gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/compression_spec.h"
#include "gpu/device_compressor.h"
#include "ps/client.h"
#include "ps/partition.h"

namespace dltrain::gpu {

/// Thread-safety: one thread per instance.
class DevicePushEncoder {
 public:
  /// `spec.method` topk or dgc (InvalidArgument otherwise); `seed` as PushEncoder's, so a
  /// GPU worker samples what a CPU worker of the same rank would.
  DevicePushEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout, std::uint64_t seed);

  /// One push per partition of the flat gradient at device pointer `grad`
  /// (layout.total_floats floats, already clipped) at `density` for global step `step`:
  /// sparse (indices, values), or dense when k is the partition's length. The pushes point
  /// into buffers owned by this encoder, valid until the next call. Throws CudaError.
  std::span<const ps::PartitionPush> encode(const float* grad, double density, std::uint64_t step);

  /// Bytes the last encode copied from the device to the host.
  std::size_t bytes_to_host() const { return bytes_to_host_; }

  /// Whether `spec` is one this encoder handles (topk, dgc, without min_compress_bytes).
  static bool handles(const compress::CompressionSpec& spec);

 private:
  const ps::PartitionLayout& layout_;
  std::vector<std::unique_ptr<DeviceCompressor>> compressors_;
  std::vector<std::vector<std::uint32_t>> indices_;
  std::vector<std::vector<float>> values_;
  std::vector<ps::PartitionPush> pushes_;
  std::size_t bytes_to_host_ = 0;
};

}  // namespace dltrain::gpu
