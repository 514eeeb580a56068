// lib/gpu against lib/compress on the same inputs, on a CUDA device (skipped, saying "no
// CUDA device", where there is none): exact top-k gives the same index set as
// compress::topk_exact, sampled top-k the same as compress::topk_sampled (the bar
// is recall >= 0.99; the sample and thresholds are the CPU's, so the sets are equal), and
// the device compressor's residual and momentum match GradientCompressor's to 1e-6 over
// several steps. Sizes 1 ... 10^7; ties; all-equal inputs; NaN.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compress/compressor.h"
#include "compress/topk.h"
#include "gpu/device.h"
#include "gpu/device_compressor.h"
#include "gpu/device_push_encoder.h"
#include "ps/partition.h"
#include "ps/exchange.h"
#include "gpu/device_topk.h"

using namespace dltrain;

namespace {

bool no_device(std::string& why) { return gpu::device_count(&why) == 0; }

#define SKIP_WITHOUT_CUDA()                                              \
  do {                                                                   \
    std::string why;                                                     \
    if (no_device(why)) GTEST_SKIP() << "no CUDA device (" << why << ")"; \
  } while (0)

enum class Kind { kNormal, kTies, kAllEqual, kWithNan };

std::vector<float> input(std::size_t n, Kind kind, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> few(-4, 4);
  for (auto& v : x) {
    switch (kind) {
      case Kind::kNormal: v = normal(rng); break;
      case Kind::kTies: v = 0.25f * static_cast<float>(few(rng)); break;  // 9 values, many ties
      case Kind::kAllEqual: v = -1.5f; break;
      case Kind::kWithNan: v = normal(rng); break;
    }
  }
  if (kind == Kind::kWithNan) {
    for (std::size_t i = 0; i < n; i += 97) x[i] = std::nanf("");
  }
  return x;
}

double recall(const std::vector<std::uint32_t>& want, const std::vector<std::uint32_t>& got) {
  if (want.empty()) return 1.0;
  std::vector<std::uint32_t> both;
  std::set_intersection(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(want.size());
}

const std::vector<std::size_t> kSizes{1, 2, 31, 1000, 4097, 100000, 1000000, 10000000};

}  // namespace

// 32-bit indices address at most 2^32 - 1 elements: a larger selection is refused before
// the device is touched (so this runs without one; x is never read).
TEST(DeviceTopk, MoreElementsThan32BitIndicesAddressAreRefused) {
  gpu::DeviceTopk topk;
  gpu::DeviceArray<std::uint32_t> out;
  const std::size_t n = std::size_t{1} << 32;
  static_assert(gpu::DeviceTopk::kMaxElements == (std::size_t{1} << 32) - 1);
  try {
    topk.exact(nullptr, n, 10, out);
    ADD_FAILURE() << "exact took 2^32 elements";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "device top-k exact: 4294967296 elements, more than the 2^32 - 1 that 32-bit indices address");
  }
  EXPECT_THROW(topk.sampled(nullptr, n, 10, 0.01, 1, out), InvalidArgument);
}

TEST(DeviceTopk, ExactGivesTheCpuIndexSetForEverySizeAndTies) {
  SKIP_WITHOUT_CUDA();
  gpu::DeviceTopk topk;
  compress::TopkScratch scratch;
  gpu::DeviceArray<float> dx;
  gpu::DeviceArray<std::uint32_t> out;
  for (const auto n : kSizes) {
    for (const auto kind : {Kind::kNormal, Kind::kTies, Kind::kAllEqual, Kind::kWithNan}) {
      const auto x = input(n, kind, static_cast<std::uint32_t>(n));
      dx.upload(x);
      for (const double ratio : {0.001, 0.01, 0.5, 1.0}) {
        const std::size_t k = compress::k_for(n, ratio);
        std::vector<std::uint32_t> want;
        compress::topk_exact(x, k, want, scratch);
        topk.exact(dx.data(), n, k, out);
        EXPECT_EQ(out.download(), want) << "n " << n << " kind " << static_cast<int>(kind) << " ratio " << ratio;
      }
    }
  }
}

TEST(DeviceTopk, SampledGivesTheCpuIndexSet) {
  SKIP_WITHOUT_CUDA();
  gpu::DeviceTopk topk;
  compress::TopkScratch scratch;
  gpu::DeviceArray<float> dx;
  gpu::DeviceArray<std::uint32_t> out;
  for (const auto n : kSizes) {
    for (const auto kind : {Kind::kNormal, Kind::kTies, Kind::kAllEqual, Kind::kWithNan}) {
      const auto x = input(n, kind, static_cast<std::uint32_t>(n) + 1);
      dx.upload(x);
      for (const double ratio : {0.001, 0.01}) {
        const std::size_t k = compress::k_for(n, ratio);
        std::vector<std::uint32_t> want;
        const auto cpu = compress::topk_sampled(x, k, 0.01, 42, want, scratch);
        const auto dev = topk.sampled(dx.data(), n, k, 0.01, 42, out);
        const auto got = out.download();
        EXPECT_GE(recall(want, got), 0.99) << "n " << n << " kind " << static_cast<int>(kind) << " ratio " << ratio;
        EXPECT_EQ(got, want) << "n " << n << " kind " << static_cast<int>(kind) << " ratio " << ratio;
        EXPECT_EQ(dev.rounds, cpu.rounds);
        EXPECT_EQ(dev.fell_back, cpu.fell_back);
      }
    }
  }
}

TEST(DeviceCompressor, DgcAndTopkMatchTheCpuCompressorOverSteps) {
  SKIP_WITHOUT_CUDA();
  for (const auto method : {compress::Method::kDgc, compress::Method::kTopk}) {
    for (const std::size_t n : {std::size_t{1000}, std::size_t{300000}}) {
      compress::CompressionSpec spec;
      spec.method = method;
      spec.momentum = 0.9;
      spec.sample_ratio = 0.01;
      compress::GradientCompressor cpu(spec, {static_cast<std::int64_t>(n)}, 99);
      gpu::DeviceCompressor dev(spec, n, 99, 0);
      gpu::DeviceArray<float> dg;
      std::vector<std::uint32_t> idx;
      std::vector<float> val;
      for (std::uint64_t step = 0; step < 5; ++step) {
        const auto g = input(n, Kind::kNormal, static_cast<std::uint32_t>(step) + 7);
        dg.upload(g);
        const auto& e = cpu.encode(0, g, 0.01, step);
        dev.encode(dg.data(), 0.01, step, idx, val);
        EXPECT_EQ(idx, e.indices) << "step " << step;
        ASSERT_EQ(val.size(), e.values.size());
        for (std::size_t j = 0; j < val.size(); ++j) ASSERT_NEAR(val[j], e.values[j], 1e-6) << j;
        EXPECT_EQ(dev.bytes_to_host(), idx.size() * 8);
        const auto v = dev.residual();
        const auto r = cpu.residual(0);
        for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(v[i], r[i], 1e-6) << "residual " << i << " step " << step;
        if (method == compress::Method::kDgc) {
          const auto u = dev.velocity();
          const auto w = cpu.velocity(0);
          for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(u[i], w[i], 1e-6) << "velocity " << i << " step " << step;
        }
      }
    }
  }
}

TEST(DevicePushEncoder, GivesThePushFramesOfTheCpuEncoderFromADeviceGradient) {
  SKIP_WITHOUT_CUDA();
  compress::CompressionSpec spec;
  spec.method = compress::Method::kDgc;
  // A 700,000-float model in two tensors, cut into partitions of at most 262,144 floats.
  const auto layout = ps::make_layout({300000, 400000}, 262144, 1);
  ps::PushEncoder cpu(spec, layout, 5);
  gpu::DevicePushEncoder dev(spec, layout, 5);
  gpu::DeviceArray<float> dg;
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto g = input(static_cast<std::size_t>(layout.total_floats), Kind::kNormal, static_cast<std::uint32_t>(step));
    dg.upload(g);
    const auto want = cpu.encode(g, 1, 0.001, step);
    const auto got = dev.encode(dg.data(), 0.001, step);
    ASSERT_EQ(got.size(), want.size());
    std::size_t k = 0;
    for (std::size_t p = 0; p < want.size(); ++p) {
      EXPECT_EQ(got[p].codec, want[p].codec) << p;
      ASSERT_EQ(got[p].count, want[p].count) << p;
      EXPECT_TRUE(std::equal(got[p].first.begin(), got[p].first.end(), want[p].first.begin(), want[p].first.end()))
          << "indices of partition " << p << ", step " << step;
      ASSERT_EQ(got[p].second.size(), want[p].second.size());
      const auto* gv = reinterpret_cast<const float*>(got[p].codec == wire::Codec::kSparseF32 ? got[p].second.data()
                                                                                           : got[p].first.data());
      const auto* wv = reinterpret_cast<const float*>(want[p].codec == wire::Codec::kSparseF32 ? want[p].second.data()
                                                                                            : want[p].first.data());
      for (std::uint32_t j = 0; j < got[p].count; ++j) ASSERT_NEAR(gv[j], wv[j], 1e-6) << "value " << j;
      k += got[p].count;
    }
    EXPECT_EQ(dev.bytes_to_host(), 8 * k);  // the selected pairs, nothing dense
  }
}
