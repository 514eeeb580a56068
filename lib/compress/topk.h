// Top-k selection by magnitude on flat float buffers (plain C++, no LibTorch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dltrain::compress {

/// k = max(1, ⌈ratio·n⌉), clipped to n; 0 when n == 0. `ratio` in (0, 1].
std::size_t k_for(std::size_t n, double ratio);

/// Reusable scratch space for the selection kernels (one per thread).
struct TopkScratch {
  std::vector<float> mags;
  std::vector<std::uint32_t> cand;
  std::vector<float> sample;
  std::vector<std::pair<float, std::uint32_t>> pairs;
};

/// Exact top-k of |x|: writes the k indices of the largest magnitudes to `out`, in
/// ascending index order. Ties at the k-th magnitude are broken towards lower indices,
/// so the result is deterministic. Selection, not a sort: one nth_element over the
/// magnitudes (expected O(n)) and one scan. NaN magnitudes are treated as smaller than
/// every number. Requires k <= x.size() and x.size() < 2^32. Thread-safe for distinct
/// scratch objects.
void topk_exact(std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out,
                TopkScratch& scratch);

/// Statistics of one sampled selection, for tests and benchmarks.
struct SampledStats {
  int rounds = 0;            ///< threshold estimates tried (1 = the first estimate held)
  bool fell_back = false;    ///< the bounded loop gave up and the exact kernel ran
  std::size_t candidates = 0;  ///< elements at or above the final threshold before trimming
};

/// DGC's sampled-threshold top-k (Lin et al., ICLR 2018, §3, "we sample only 0.1% to 1%
/// of the gradients"): estimate the k-th magnitude from a sample of
/// max(sample_ratio·n, 1024) elements, taken as runs of 32 consecutive elements at
/// uniformly random offsets (the sample's 1.5·k/n·s-th largest), collect
/// every element at or above it in one scan, and, when fewer than k qualify, lower the
/// estimate (next sample quantile ×4, at most 4 rounds) before falling back to
/// topk_exact. The candidates are then trimmed to exactly k by magnitude (ties towards
/// lower indices). Because every element above the threshold is a candidate, the result
/// equals the exact top-k set whenever it is unique. Output in ascending index order.
/// `seed` picks the sample (deterministic for a given seed).
SampledStats topk_sampled(std::span<const float> x, std::size_t k, double sample_ratio, std::uint64_t seed,
                          std::vector<std::uint32_t>& out, TopkScratch& scratch);

/// k distinct indices in [0, n), ascending, drawn from `seed` alone (Floyd's algorithm
/// with splitmix64), so a receiver that knows (seed, n, k) regenerates the same set and
/// the indices need not be sent. Requires k <= n.
void randomk_indices(std::size_t n, std::size_t k, std::uint64_t seed, std::vector<std::uint32_t>& out);

/// splitmix64 (Steele, Lea & Flood 2014): the mixing step used to derive seeds.
std::uint64_t splitmix64(std::uint64_t x);

}  // namespace dltrain::compress
