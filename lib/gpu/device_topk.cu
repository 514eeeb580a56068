#include "gpu/device_topk.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

namespace dltrain::gpu {
namespace {

constexpr int kThreads = 256;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

int blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<std::size_t>(b, 1, 4096));  // grid-stride loops beyond
}

// |v|'s order as a key: bits of |v| plus one; NaN is 0, below every number (topk.h's mag()).
__device__ __forceinline__ std::uint32_t mag_key(float v) {
  const float a = fabsf(v);
  return a != a ? 0u : __float_as_uint(a) + 1u;
}

__global__ void iota(std::uint32_t* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<std::uint32_t>(i);
  }
}

// The key of item j, where the items are indices into x (a counting iterator, or an
// array of candidate indices).
template <typename Items>
struct KeyOfItem {
  const float* x;
  Items items;
  __device__ std::uint32_t operator()(std::size_t j) const { return mag_key(x[items[j]]); }
};

// Histogram of the digit at `shift` over the items whose key matches `prefix` on `mask`.
template <typename KeyOf>
__global__ void radix_histogram(KeyOf key_of, std::size_t n, std::uint32_t prefix, std::uint32_t mask, int shift,
                                unsigned long long* hist) {
  __shared__ unsigned int h[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
  __syncthreads();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t k = key_of(i);
    if ((k & mask) == prefix) atomicAdd(&h[(k >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (h[i] != 0) atomicAdd(&hist[i], static_cast<unsigned long long>(h[i]));
  }
}

// Item i is taken: its key is above the k-th, or equal to it and among the first
// `ties` equal ones (tie_rank: an exclusive scan of the equal flags).
template <typename Items>
__global__ void take_flags(const float* x, Items items, std::size_t n, std::uint32_t kth, const std::uint32_t* tie_rank,
                           std::uint64_t ties, unsigned char* flags) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t k = mag_key(x[items[i]]);
    flags[i] = k > kth || (k == kth && tie_rank[i] < ties) ? 1 : 0;
  }
}

struct AtLeast {
  const float* x;
  std::uint32_t kth;
  __device__ bool operator()(std::uint32_t i) const { return mag_key(x[i]) >= kth; }
};

template <typename Items>
struct IsTie {
  const float* x;
  Items items;
  std::uint32_t kth;
  __device__ std::uint32_t operator()(std::size_t j) const { return mag_key(x[items[j]]) == kth ? 1u : 0u; }
};

// The sample: runs of 32 consecutive values from the given offsets.
__global__ void gather_runs(const float* x, const std::uint32_t* offsets, std::size_t runs, float* sample) {
  const std::size_t n = runs * 32;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    sample[i] = x[offsets[i / 32] + i % 32];
  }
}

}  // namespace

struct DeviceTopk::Impl {
  DeviceArray<unsigned long long> hist;
  DeviceArray<std::uint32_t> tie_rank, cand, offsets;
  DeviceArray<unsigned char> flags;
  DeviceArray<float> sample;
  DeviceArray<std::uint64_t> count;
  DeviceBytes temp;
  std::array<unsigned long long, 256> host_hist{};

  // The k-th largest key of the n items (1 <= k <= n), and how many items with exactly
  // that key the top k takes (`ties`) of the `equal` there are.
  template <typename Items>
  std::uint32_t kth_key(const float* x, Items items, std::size_t n, std::size_t k, std::uint64_t& ties,
                        std::uint64_t& equal) {
    hist.resize(256);
    std::uint32_t prefix = 0, mask = 0;
    std::uint64_t remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      zero_device(hist.data(), 256 * sizeof(unsigned long long));
      radix_histogram<<<blocks_for(n), kThreads>>>(KeyOfItem<Items>{x, items}, n, prefix, mask, shift, hist.data());
      check_launch("radix_histogram");
      copy_to_host(host_hist.data(), hist.data(), sizeof host_hist);
      std::uint64_t above = 0;
      int digit = 0;
      for (digit = 255; digit > 0; --digit) {
        if (above + host_hist[static_cast<std::size_t>(digit)] >= remaining) break;
        above += host_hist[static_cast<std::size_t>(digit)];
      }
      remaining -= above;
      prefix |= static_cast<std::uint32_t>(digit) << shift;
      mask |= 255u << shift;
      equal = host_hist[static_cast<std::size_t>(digit)];
    }
    ties = remaining;
    return prefix;
  }

  std::uint64_t read_count() {
    std::uint64_t c = 0;
    copy_to_host(&c, count.data(), sizeof c);
    return c;
  }

  // The top k of the n items by key, as x-indices in item order, into `out`.
  template <typename Items>
  void select(const float* x, Items items, std::size_t n, std::size_t k, DeviceArray<std::uint32_t>& out) {
    std::uint64_t ties = 0, equal = 0;
    const std::uint32_t kth = kth_key(x, items, n, k, ties, equal);
    out.resize(k);
    count.resize(1);
    std::size_t bytes = 0;
    if (ties == equal) {
      // Every item with the k-th key is taken: one pass, |x| at or above it.
      check(cub::DeviceSelect::If(nullptr, bytes, items, out.data(), count.data(), n, AtLeast{x, kth}), "DeviceSelect::If");
      temp.reserve(bytes);
      check(cub::DeviceSelect::If(temp.get(), bytes, items, out.data(), count.data(), n, AtLeast{x, kth}),
            "DeviceSelect::If");
    } else {
      // Some ties are left out: rank them (an exclusive scan), take the first `ties`.
      tie_rank.resize(n);
      flags.resize(n);
      auto is_tie = thrust::make_transform_iterator(thrust::counting_iterator<std::size_t>(0), IsTie<Items>{x, items, kth});
      check(cub::DeviceScan::ExclusiveSum(nullptr, bytes, is_tie, tie_rank.data(), n), "DeviceScan::ExclusiveSum");
      temp.reserve(bytes);
      check(cub::DeviceScan::ExclusiveSum(temp.get(), bytes, is_tie, tie_rank.data(), n), "DeviceScan::ExclusiveSum");
      take_flags<<<blocks_for(n), kThreads>>>(x, items, n, kth, tie_rank.data(), ties, flags.data());
      check_launch("take_flags");
      bytes = 0;
      check(cub::DeviceSelect::Flagged(nullptr, bytes, items, flags.data(), out.data(), count.data(), n),
            "DeviceSelect::Flagged");
      temp.reserve(bytes);
      check(cub::DeviceSelect::Flagged(temp.get(), bytes, items, flags.data(), out.data(), count.data(), n),
            "DeviceSelect::Flagged");
    }
    const std::uint64_t got = read_count();
    if (got != k) {
      throw CudaError("device top-k selected " + std::to_string(got) + " of " + std::to_string(k) +
                      " elements (an internal error)");
    }
  }

  void all(std::size_t n, DeviceArray<std::uint32_t>& out) {
    out.resize(n);
    iota<<<blocks_for(n), kThreads>>>(out.data(), n);
    check_launch("iota");
  }
};

void DeviceTopk::check_index_range(std::size_t n, const char* what) {
  // Indices are 32-bit on the device and in the push: 2^32 elements would wrap.
  if (n > kMaxElements) {
    throw InvalidArgument("device top-k " + std::string(what) + ": " + std::to_string(n) +
                          " elements, more than the 2^32 - 1 that 32-bit indices address");
  }
}

DeviceTopk::DeviceTopk() : impl_(std::make_unique<Impl>()) {}
DeviceTopk::~DeviceTopk() = default;

void DeviceTopk::exact(const float* x, std::size_t n, std::size_t k, DeviceArray<std::uint32_t>& out) {
  check_index_range(n, "exact");
  k = std::min(k, n);
  if (k == 0) {
    out.resize(0);
    return;
  }
  if (k == n) return impl_->all(n, out);
  impl_->select(x, thrust::counting_iterator<std::uint32_t>(0), n, k, out);
}

compress::SampledStats DeviceTopk::sampled(const float* x, std::size_t n, std::size_t k, double sample_ratio,
                                           std::uint64_t seed, DeviceArray<std::uint32_t>& out) {
  // The steps of compress::topk_sampled (lib/compress/topk.cpp), on the device.
  check_index_range(n, "sampled");
  compress::SampledStats st;
  k = std::min(k, n);
  if (k == 0) {
    out.resize(0);
    return st;
  }
  constexpr std::size_t kMinSample = 1024;
  if (k >= n || n <= 4 * kMinSample) {
    exact(x, n, k, out);
    st.fell_back = true;
    st.candidates = k;
    return st;
  }
  auto& s = *impl_;
  const std::size_t m =
      std::min(n, std::max(kMinSample, static_cast<std::size_t>(sample_ratio * static_cast<double>(n))));
  constexpr std::size_t kRun = 32;
  const std::size_t runs = (m + kRun - 1) / kRun;
  std::vector<std::uint32_t> offsets(runs);
  std::uint64_t state = compress::splitmix64(seed);
  for (std::size_t r = 0; r < runs; ++r) {
    state = compress::splitmix64(state);
    offsets[r] = static_cast<std::uint32_t>((static_cast<unsigned __int128>(state) * (n - kRun + 1)) >> 64);
  }
  s.offsets.upload(offsets);
  const std::size_t sampled = runs * kRun;
  s.sample.resize(sampled);
  gather_runs<<<blocks_for(sampled), kThreads>>>(x, s.offsets.data(), runs, s.sample.data());
  check_launch("gather_runs");
  double want = static_cast<double>(k) / static_cast<double>(n) * static_cast<double>(sampled) * 1.5 + 1.0;
  for (int round = 1; round <= 4; ++round) {
    st.rounds = round;
    const std::size_t r = std::min(sampled, static_cast<std::size_t>(want));
    // The sample's r-th largest magnitude (the sample holds values: items 0..sampled-1).
    std::uint64_t ties = 0, equal = 0;
    const std::uint32_t thr =
        s.kth_key(s.sample.data(), thrust::counting_iterator<std::uint32_t>(0), sampled, r, ties, equal);
    // Every element at or above it. A NaN threshold (key 0) collects every number but not
    // the NaNs, as topk.cpp's |x| >= -1 does.
    const std::uint32_t at_least = std::max<std::uint32_t>(thr, 1u);
    s.cand.resize(n);
    s.count.resize(1);
    std::size_t bytes = 0;
    const auto items = thrust::counting_iterator<std::uint32_t>(0);
    check(cub::DeviceSelect::If(nullptr, bytes, items, s.cand.data(), s.count.data(), n, AtLeast{x, at_least}),
          "DeviceSelect::If");
    s.temp.reserve(bytes);
    check(cub::DeviceSelect::If(s.temp.get(), bytes, items, s.cand.data(), s.count.data(), n, AtLeast{x, at_least}),
          "DeviceSelect::If");
    const std::size_t c = s.read_count();
    st.candidates = c;
    if (c >= k) {
      // Trimmed to exactly k (ties towards lower indices), from the candidates.
      s.select(x, static_cast<const std::uint32_t*>(s.cand.data()), c, k, out);
      return st;
    }
    if (r == sampled) break;
    want *= 4.0;
  }
  st.fell_back = true;
  exact(x, n, k, out);
  return st;
}

}  // namespace dltrain::gpu
