// Top-k selection by magnitude on device memory (CUDA; built with -DDLTRAIN_WITH_CUDA=ON),
// with the results of lib/compress/topk.h: the same index sets for the same input, so
// that a worker selecting on its GPU pushes what a CPU worker would.
//
// Magnitudes are compared through a 32-bit key per element — the bits of |x| plus one
// (the order of non-negative IEEE floats is that of their bits), 0 for NaN, below every
// number, as topk.h orders them — and the k-th largest key is found by radix selection:
// four passes of a 256-bin histogram over the elements whose higher digits match
// (Alabi et al. 2012, "Fast k-selection algorithms for graphics processing units",
// §3). The indices are then compacted in ascending order with CUB's DeviceSelect; ties
// at the k-th key go to the lowest indices (a scan ranks them) exactly as topk.h does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "compress/topk.h"
#include "gpu/device.h"

namespace dltrain::gpu {

/// Device top-k with its scratch buffers (reused between calls, grown as needed).
/// Thread-safety: one thread per instance; work runs on the default stream and each call
/// returns once its result is in `out`.
class DeviceTopk {
 public:
  DeviceTopk();
  ~DeviceTopk();
  DeviceTopk(const DeviceTopk&) = delete;
  DeviceTopk& operator=(const DeviceTopk&) = delete;

  /// compress::topk_exact on device: the indices of the k largest |x[i]| of the n floats
  /// at device pointer `x`, ascending, ties at the k-th magnitude towards lower indices;
  /// k is clipped to n. `out` is resized to the count. Throws InvalidArgument for n >
  /// kMaxElements (before touching the device), CudaError.
  void exact(const float* x, std::size_t n, std::size_t k, DeviceArray<std::uint32_t>& out);

  /// compress::topk_sampled on device, with the same sample (runs of 32 elements at
  /// offsets drawn from `seed` by splitmix64, as topk.h draws them), the same threshold
  /// rounds and the same fall-back to exact(): its result is topk_sampled's. Returns the
  /// same statistics. Throws InvalidArgument for n > kMaxElements, CudaError.
  compress::SampledStats sampled(const float* x, std::size_t n, std::size_t k, double sample_ratio, std::uint64_t seed,
                                 DeviceArray<std::uint32_t>& out);

  /// The most elements a selection takes: its indices are 32-bit.
  static constexpr std::size_t kMaxElements = 0xFFFFFFFFu;

  struct Impl;

 private:
  static void check_index_range(std::size_t n, const char* what);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::gpu
