#include "gpu/device_compressor.h"

#include <algorithm>

#include <cuda_runtime.h>

#include "compress/topk.h"

namespace dltrain::gpu {
namespace {

constexpr int kThreads = 256;

int blocks_for(std::size_t n) {
  return static_cast<int>(std::clamp<std::size_t>((n + kThreads - 1) / kThreads, 1, 4096));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw CudaError(std::string(kernel) + " failed: " + cudaGetErrorString(e));
}

// u = m·u + g; v += u (DGC §3.2, momentum correction), rounded like the CPU's.
__global__ void momentum_accumulate(const float* g, float* u, float* v, float m, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float ui = __fadd_rn(__fmul_rn(m, u[i]), g[i]);
    u[i] = ui;
    v[i] = __fadd_rn(v[i], ui);
  }
}

// v += g (error feedback).
__global__ void accumulate(const float* g, float* v, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    v[i] = __fadd_rn(v[i], g[i]);
  }
}

// The selected coordinates: their values out, v zeroed there, and (dgc) u zeroed where v
// held more than this step's u, i.e. where it had been held back (factor masking, §3.3).
__global__ void take_selected(const std::uint32_t* idx, std::size_t k, float* v, float* u, float* values) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    const std::uint32_t i = idx[j];
    values[j] = v[i];
    if (u != nullptr && v[i] != u[i]) u[i] = 0.0f;
    v[i] = 0.0f;
  }
}

}  // namespace

DeviceCompressor::DeviceCompressor(const compress::CompressionSpec& spec, std::size_t n, std::uint64_t seed,
                                   std::size_t partition, std::shared_ptr<DeviceTopk> topk)
    : spec_(spec), n_(n), seed_(seed), partition_(partition),
      topk_(topk ? std::move(topk) : std::make_shared<DeviceTopk>()) {
  if (spec.method != compress::Method::kTopk && spec.method != compress::Method::kDgc) {
    throw InvalidArgument("device compressor: method must be topk or dgc");
  }
  if (n == 0 || n >= (std::size_t{1} << 32)) throw InvalidArgument("device compressor: n must be in [1, 2^32)");
  v_.resize(n);
  zero_device(v_.data(), n * sizeof(float));
  if (spec.method == compress::Method::kDgc) {
    u_.resize(n);
    zero_device(u_.data(), n * sizeof(float));
  }
}

void DeviceCompressor::encode(const float* grad, double density, std::uint64_t step, std::vector<std::uint32_t>& indices,
                              std::vector<float>& values) {
  const std::size_t k = compress::k_for(n_, density);
  const std::uint64_t step_seed =
      compress::splitmix64(seed_ ^ compress::splitmix64(step * 0x100000001B3ull + partition_));
  const bool dgc = spec_.method == compress::Method::kDgc;
  if (dgc) {
    momentum_accumulate<<<blocks_for(n_), kThreads>>>(grad, u_.data(), v_.data(), static_cast<float>(spec_.momentum), n_);
    check_launch("momentum_accumulate");
    topk_->sampled(v_.data(), n_, k, spec_.sample_ratio, step_seed, idx_);
  } else {
    accumulate<<<blocks_for(n_), kThreads>>>(grad, v_.data(), n_);
    check_launch("accumulate");
    topk_->exact(v_.data(), n_, k, idx_);
  }
  const std::size_t got = idx_.size();
  values_.resize(got);
  if (got > 0) {
    take_selected<<<blocks_for(got), kThreads>>>(idx_.data(), got, v_.data(), dgc ? u_.data() : nullptr,
                                                 values_.data());
    check_launch("take_selected");
  }
  indices = idx_.download();
  values = values_.download();
  bytes_to_host_ = got * (sizeof(std::uint32_t) + sizeof(float));
}

}  // namespace dltrain::gpu
