// One partition's top-k or DGC compression on device memory (CUDA; -DDLTRAIN_WITH_CUDA=ON):
// the rules of compress::GradientCompressor (lib/compress/compressor.h) — error feedback,
// DGC's momentum correction and momentum factor masking (Lin et al., ICLR 2018, §3.2,
// §3.3, Algorithm 1) — with the residual v and the velocity u kept in device memory, so
// that only the k selected (index, value) pairs cross PCIe to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/compression_spec.h"
#include "gpu/device.h"
#include "gpu/device_topk.h"

namespace dltrain::gpu {

/// Thread-safety: one thread per instance (work on the default stream; encode returns
/// once the selected pairs are on the host).
class DeviceCompressor {
 public:
  /// `spec.method` must be topk or dgc (InvalidArgument otherwise); `n` floats, >= 1,
  /// < 2^32; `seed` and `partition` derive each step's sampling seed exactly as
  /// GradientCompressor does for partition `partition` of a worker seeded `seed`.
  /// `topk`: the selection and its scratch buffers (candidates, histograms; grown to the
  /// largest n), shared by the compressors of one worker's partitions, which encode one
  /// after the other; null: a selection of its own.
  DeviceCompressor(const compress::CompressionSpec& spec, std::size_t n, std::uint64_t seed, std::size_t partition,
                   std::shared_ptr<DeviceTopk> topk = nullptr);

  /// One step with the gradient at device pointer `grad` (n floats) at `density` for
  /// global step `step`: topk: v += g, exact top-k of |v|; dgc: u = m·u + g, v += u,
  /// sampled top-k of |v|, u zeroed where a sent coordinate had been held back. The
  /// selected coordinates of v are sent and zeroed. Writes their indices (ascending) and
  /// values to the host vectors. Each multiply and add is rounded separately (no fused
  /// multiply-add), as the CPU compressor rounds them. Throws CudaError.
  void encode(const float* grad, double density, std::uint64_t step, std::vector<std::uint32_t>& indices,
              std::vector<float>& values);

  /// v and u (empty for topk) on the host, for tests.
  std::vector<float> residual() const { return v_.download(); }
  std::vector<float> velocity() const { return u_.download(); }
  /// Bytes the last encode copied to the host (8 per selected coordinate).
  std::size_t bytes_to_host() const { return bytes_to_host_; }

 private:
  compress::CompressionSpec spec_;
  std::size_t n_;
  std::uint64_t seed_;
  std::size_t partition_;
  DeviceArray<float> v_, u_, values_;
  DeviceArray<std::uint32_t> idx_;
  std::shared_ptr<DeviceTopk> topk_;
  std::size_t bytes_to_host_ = 0;
};

}  // namespace dltrain::gpu
