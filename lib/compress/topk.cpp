#include "compress/topk.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace dltrain::compress {

std::size_t k_for(std::size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k >= 1.0)) return 1;
  return std::min(n, static_cast<std::size_t>(k));
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

inline float mag(float v) {
  const float a = std::fabs(v);
  return a == a ? a : -1.0f;  // NaN sorts below everything
}

// Keeps the k largest-magnitude candidates (ties → lower index), ascending indices.
// Works on (magnitude, index) pairs so the selection reads contiguous memory instead of
// gathering x[index] at every comparison.
void trim(std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& cand,
          std::vector<std::pair<float, std::uint32_t>>& pairs, std::vector<std::uint32_t>& out) {
  if (cand.size() > k) {
    pairs.resize(cand.size());
    for (std::size_t j = 0; j < cand.size(); ++j) pairs[j] = {mag(x[cand[j]]), cand[j]};
    auto better = [](const std::pair<float, std::uint32_t>& a, const std::pair<float, std::uint32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::nth_element(pairs.begin(), pairs.begin() + static_cast<std::ptrdiff_t>(k - 1), pairs.end(), better);
    // The k-th magnitude; keep, in the candidates' (ascending) order, everything above it
    // and the lowest-index ties — no sort needed.
    const float thr = pairs[k - 1].first;
    std::size_t ties = 0;
    for (std::size_t j = 0; j < k; ++j) ties += pairs[j].first == thr ? 1 : 0;
    std::size_t w = 0;
    for (std::size_t j = 0; j < cand.size() && w < k; ++j) {
      const float m = mag(x[cand[j]]);
      if (m > thr || (m == thr && ties > 0 && (--ties, true))) cand[w++] = cand[j];
    }
    cand.resize(w);
  }
  out.assign(cand.begin(), cand.end());
}

// Appends every index with |x[i]| >= thr. Blocks of 64 are first reduced to their
// largest magnitude (a loop the compiler vectorises); only blocks that reach the
// threshold are scanned element by element, so the pass runs near memory bandwidth
// when candidates are rare.
void collect_at_least(std::span<const float> x, float thr, std::vector<std::uint32_t>& cand) {
  constexpr std::size_t kBlock = 64;
  const float* p = x.data();
  const std::size_t n = x.size();
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float m = 0.0f;
    for (std::size_t j = 0; j < kBlock; ++j) m = std::max(m, std::fabs(p[i + j]));
    if (m >= thr) {
      for (std::size_t j = 0; j < kBlock; ++j) {
        if (std::fabs(p[i + j]) >= thr) cand.push_back(static_cast<std::uint32_t>(i + j));
      }
    }
  }
  for (; i < n; ++i) {
    if (std::fabs(p[i]) >= thr) cand.push_back(static_cast<std::uint32_t>(i));
  }
}

}  // namespace

void topk_exact(std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out, TopkScratch& s) {
  out.clear();
  const std::size_t n = x.size();
  if (k == 0 || n == 0) return;
  if (k >= n) {
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return;
  }
  s.mags.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.mags[i] = mag(x[i]);
  // The k-th largest magnitude.
  std::nth_element(s.mags.begin(), s.mags.begin() + static_cast<std::ptrdiff_t>(k - 1), s.mags.end(),
                   std::greater<float>());
  const float thr = s.mags[k - 1];
  std::size_t above = 0;
  for (std::size_t i = 0; i < k; ++i) above += s.mags[i] > thr ? 1 : 0;
  // Everything strictly above the threshold, then the lowest-index ties.
  std::size_t ties = k - above;
  out.reserve(k);
  for (std::size_t i = 0; i < n; ++i) {
    const float m = mag(x[i]);
    if (m > thr) {
      out.push_back(static_cast<std::uint32_t>(i));
    } else if (m == thr && ties > 0) {
      out.push_back(static_cast<std::uint32_t>(i));
      --ties;
    }
  }
}

SampledStats topk_sampled(std::span<const float> x, std::size_t k, double sample_ratio, std::uint64_t seed,
                          std::vector<std::uint32_t>& out, TopkScratch& s) {
  SampledStats st;
  out.clear();
  const std::size_t n = x.size();
  if (k == 0 || n == 0) return st;
  constexpr std::size_t kMinSample = 1024;
  if (k >= n || n <= 4 * kMinSample) {
    topk_exact(x, k, out, s);
    st.fell_back = true;
    st.candidates = out.size();
    return st;
  }
  const std::size_t m = std::min(n, std::max(kMinSample, static_cast<std::size_t>(sample_ratio * static_cast<double>(n))));
  // The sample is drawn as runs of 32 consecutive elements at uniformly random offsets:
  // the same expected coverage as single random elements, at a 32nd of the cache misses
  // (single random reads of a 40 MB buffer cost more than the scan itself).
  constexpr std::size_t kRun = 32;
  const std::size_t runs = (m + kRun - 1) / kRun;
  s.sample.resize(runs * kRun);
  std::uint64_t state = splitmix64(seed);
  for (std::size_t r = 0; r < runs; ++r) {
    state = splitmix64(state);
    const auto start = static_cast<std::size_t>((static_cast<unsigned __int128>(state) * (n - kRun + 1)) >> 64);
    for (std::size_t j = 0; j < kRun; ++j) s.sample[r * kRun + j] = mag(x[start + j]);
  }
  const std::size_t sampled = s.sample.size();
  // Sample rank that estimates the k-th largest, with a little slack so the first
  // estimate usually over-collects slightly instead of missing.
  double want = static_cast<double>(k) / static_cast<double>(n) * static_cast<double>(sampled) * 1.5 + 1.0;
  for (int round = 1; round <= 4; ++round) {
    st.rounds = round;
    const std::size_t r = std::min(sampled, static_cast<std::size_t>(want));
    std::nth_element(s.sample.begin(), s.sample.begin() + static_cast<std::ptrdiff_t>(r - 1), s.sample.end(),
                     std::greater<float>());
    const float thr = s.sample[r - 1];
    s.cand.clear();
    s.cand.reserve(2 * k + 16);
    collect_at_least(x, thr, s.cand);
    st.candidates = s.cand.size();
    if (s.cand.size() >= k) {
      trim(x, k, s.cand, s.pairs, out);
      return st;
    }
    if (r == sampled) break;  // the whole sample is already in: the threshold cannot go lower
    want *= 4.0;
  }
  st.fell_back = true;
  topk_exact(x, k, out, s);
  return st;
}

void randomk_indices(std::size_t n, std::size_t k, std::uint64_t seed, std::vector<std::uint32_t>& out) {
  out.clear();
  if (k >= n) {
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return;
  }
  // Floyd's algorithm: for j = n-k .. n-1 pick t in [0, j]; take t unless already taken,
  // else take j. Exactly k distinct indices, uniformly distributed.
  std::unordered_set<std::uint32_t> chosen;
  chosen.reserve(k * 2);
  std::uint64_t state = splitmix64(seed);
  for (std::size_t j = n - k; j < n; ++j) {
    state = splitmix64(state);
    const auto t = static_cast<std::uint32_t>((static_cast<unsigned __int128>(state) * (j + 1)) >> 64);
    if (!chosen.insert(t).second) chosen.insert(static_cast<std::uint32_t>(j));
  }
  out.assign(chosen.begin(), chosen.end());
  std::sort(out.begin(), out.end());
}

}  // namespace dltrain::compress
