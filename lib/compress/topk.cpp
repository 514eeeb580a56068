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
void trim(std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& cand,
          std::vector<std::uint32_t>& out) {
  if (cand.size() > k) {
    auto better = [&](std::uint32_t a, std::uint32_t b) {
      const float ma = mag(x[a]), mb = mag(x[b]);
      return ma > mb || (ma == mb && a < b);
    };
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k - 1), cand.end(), better);
    cand.resize(k);
    std::sort(cand.begin(), cand.end());
  }
  out.assign(cand.begin(), cand.end());
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
  s.sample.resize(m);
  std::uint64_t state = splitmix64(seed);
  for (std::size_t i = 0; i < m; ++i) {
    state = splitmix64(state);
    s.sample[i] = mag(x[static_cast<std::size_t>((static_cast<unsigned __int128>(state) * n) >> 64)]);
  }
  // Sample rank that estimates the k-th largest, with a little slack so the first
  // estimate usually over-collects slightly instead of missing.
  double want = static_cast<double>(k) / static_cast<double>(n) * static_cast<double>(m) * 1.5 + 1.0;
  for (int round = 1; round <= 4; ++round) {
    st.rounds = round;
    const std::size_t r = std::min(m, static_cast<std::size_t>(want));
    std::nth_element(s.sample.begin(), s.sample.begin() + static_cast<std::ptrdiff_t>(r - 1), s.sample.end(),
                     std::greater<float>());
    const float thr = s.sample[r - 1];
    s.cand.clear();
    s.cand.reserve(2 * k + 16);
    const float* p = x.data();
    for (std::size_t i = 0; i < n; ++i) {
      if (std::fabs(p[i]) >= thr) s.cand.push_back(static_cast<std::uint32_t>(i));
    }
    st.candidates = s.cand.size();
    if (s.cand.size() >= k) {
      trim(x, k, s.cand, out);
      return st;
    }
    if (r == m) break;  // the whole sample is already in: the threshold cannot go lower
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
