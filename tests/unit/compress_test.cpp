// Sparsifiers, fp16, error feedback, DGC momentum correction, and the PS downlink.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "compress/compressor.h"
#include "compress/fp16.h"
#include "compress/topk.h"
#include "ps/partition.h"
#include "ps/shard_state.h"
#include "ps/exchange.h"

using namespace dltrain;
using namespace dltrain::compress;

namespace {

// Sort-based reference: indices by (|x| descending, index ascending), first k, ascending.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// n draws of distribution `d` from a generator seeded with `seed`.
template <typename Distribution>
std::vector<float> draws(std::size_t n, std::uint32_t seed, Distribution d) {
  std::mt19937 g(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = d(g);
  return x;
}

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  return draws(n, seed, std::normal_distribution<float>());
}

std::vector<float> heavy_tailed(std::size_t n, std::uint32_t seed) {
  return draws(n, seed, std::cauchy_distribution<float>());
}

std::vector<float> mostly_zero(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::uniform_real_distribution<float> u;
  std::vector<float> x(n, 0.0f);
  for (auto& v : x) {
    if (u(g) < 0.02f) v = d(g);
  }
  return x;
}

double recall(const std::vector<std::uint32_t>& got, const std::vector<std::uint32_t>& want) {
  std::vector<std::uint32_t> both;
  std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
  return want.empty() ? 1.0 : static_cast<double>(both.size()) / static_cast<double>(want.size());
}

}  // namespace

TEST(Topk, KForRatio) {
  EXPECT_EQ(k_for(1000, 0.001), 1u);
  EXPECT_EQ(k_for(1000, 0.0001), 1u);  // at least one
  EXPECT_EQ(k_for(1001, 0.001), 2u);   // ceil
  EXPECT_EQ(k_for(10, 1.0), 10u);
  EXPECT_EQ(k_for(0, 0.5), 0u);
}

TEST(Topk, ExactMatchesSortReferenceOnRandomInputs) {
  TopkScratch s;
  std::vector<std::uint32_t> out;
  std::uint32_t seed = 1;
  for (std::size_t n : {1ul, 2ul, 7ul, 100ul, 1000ul, 100000ul, 1000000ul, 10000000ul}) {
    auto x = normal(n, seed++);
    for (std::size_t k : {std::size_t{1}, k_for(n, 0.001), k_for(n, 0.01), k_for(n, 0.5), n}) {
      if (n >= 1000000 && k > k_for(n, 0.01)) continue;  // keep the reference sort affordable
      topk_exact(x, k, out, s);
      EXPECT_EQ(out, reference_topk(x, k)) << "n=" << n << " k=" << k;
    }
  }
}

TEST(Topk, ExactHandlesTiesAndAllEqual) {
  TopkScratch s;
  std::vector<std::uint32_t> out;
  std::vector<float> ties{1, -3, 2, 3, -2, 3, 0, -3};
  topk_exact(ties, 2, out, s);  // |3| at indices 1, 3, 5, 7: the two lowest indices win
  EXPECT_EQ(out, (std::vector<std::uint32_t>{1, 3}));
  topk_exact(ties, 5, out, s);  // all four 3s, then the first |2| (index 2)
  EXPECT_EQ(out, (std::vector<std::uint32_t>{1, 2, 3, 5, 7}));
  EXPECT_EQ(out, reference_topk(ties, 5));
  std::vector<float> same(1000, 0.5f);
  for (std::size_t k : {1ul, 10ul, 999ul, 1000ul}) {
    topk_exact(same, k, out, s);
    EXPECT_EQ(out, reference_topk(same, k)) << k;
  }
  // Many ties on a quantised grid.
  std::vector<float> q(50000);
  std::mt19937 g(3);
  for (auto& v : q) v = static_cast<float>(static_cast<int>(g() % 7) - 3);
  topk_exact(q, 20000, out, s);
  EXPECT_EQ(out, reference_topk(q, 20000));
}

TEST(Topk, SampledReturnsExactlyKWithHighRecall) {
  TopkScratch s;
  std::vector<std::uint32_t> got, want;
  const std::size_t n = 1000000;
  std::uint32_t seed = 11;
  for (const auto& gen : {normal, heavy_tailed, mostly_zero}) {
    auto x = gen(n, seed++);
    for (double ratio : {0.01, 0.001}) {
      const std::size_t k = k_for(n, ratio);
      auto st = topk_sampled(x, k, 0.01, seed, got, s);
      topk_exact(x, k, want, s);
      ASSERT_EQ(got.size(), k);
      EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
      EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end()) << "duplicate index";
      EXPECT_GE(recall(got, want), 0.99) << "ratio " << ratio << " rounds " << st.rounds;
    }
  }
  // Small inputs and k = n fall back to the exact kernel.
  auto x = normal(100, 5);
  topk_sampled(x, 100, 0.01, 1, got, s);
  EXPECT_EQ(got.size(), 100u);
  topk_sampled(x, 3, 0.01, 1, got, s);
  EXPECT_EQ(got, reference_topk(x, 3));
}

TEST(RandomK, DistinctAscendingAndReproducibleFromTheSeed) {
  std::vector<std::uint32_t> a, b, c;
  randomk_indices(100000, 1000, 42, a);
  randomk_indices(100000, 1000, 42, b);
  randomk_indices(100000, 1000, 43, c);
  ASSERT_EQ(a.size(), 1000u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_LT(a.back(), 100000u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  randomk_indices(5, 5, 1, a);
  EXPECT_EQ(a, (std::vector<std::uint32_t>{0, 1, 2, 3, 4}));
}

TEST(Fp16, KnownValuesAndExhaustiveRoundTrip) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);         // largest finite half
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);         // rounds up to +Inf
  EXPECT_EQ(float_to_half(0.1f), 0x2E66);             // 0.0999755859375
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);  // flushes to zero
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie → even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie → even (up)
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

TEST(Warmup, DgcSparsitySchedule) {
  CompressionSpec s;
  s.ratio = 0.001;
  s.warmup_epochs = 4;
  EXPECT_DOUBLE_EQ(density_at(s, 0.0), 0.25);     // 75% sparsity
  EXPECT_DOUBLE_EQ(density_at(s, 1.5), 0.0625);   // 93.75%
  EXPECT_DOUBLE_EQ(density_at(s, 2.0), 0.015625); // 98.4375%
  EXPECT_DOUBLE_EQ(density_at(s, 3.9), 0.00390625);
  EXPECT_DOUBLE_EQ(density_at(s, 4.0), 0.001);
  s.warmup_epochs = 0;
  EXPECT_DOUBLE_EQ(density_at(s, 0.0), 0.001);
}

TEST(Warmup, StagesSpreadDgcsFourStepsOverAShortWarmup) {
  CompressionSpec s;
  s.ratio = 0.001;
  s.warmup_epochs = 0.25;  // four stages of 1/16 epoch
  s.warmup_schedule = compress::WarmupSchedule::kStages;
  EXPECT_DOUBLE_EQ(density_at(s, 0.0), 0.25);
  EXPECT_DOUBLE_EQ(density_at(s, 0.0624), 0.25);
  EXPECT_DOUBLE_EQ(density_at(s, 0.0625), 0.0625);
  EXPECT_DOUBLE_EQ(density_at(s, 0.13), 0.015625);
  EXPECT_DOUBLE_EQ(density_at(s, 0.2499), 0.00390625);
  EXPECT_DOUBLE_EQ(density_at(s, 0.25), 0.001);
  // Four epochs of stages are the per-epoch schedule: the paper's.
  s.warmup_epochs = 4;
  CompressionSpec per_epoch = s;
  per_epoch.warmup_schedule = compress::WarmupSchedule::kPerEpoch;
  for (double e : {0.0, 0.5, 1.0, 2.7, 3.99, 4.0, 5.0}) EXPECT_DOUBLE_EQ(density_at(s, e), density_at(per_epoch, e)) << e;
  // The same quarter epoch per epoch is one stage at 25 %, the figure that made the warm-up
  // cost as much as dense training.
  per_epoch.warmup_epochs = 0.25;
  EXPECT_DOUBLE_EQ(density_at(per_epoch, 0.2), 0.25);
  // A target denser than a stage's density floors it.
  s.ratio = 0.05;
  EXPECT_DOUBLE_EQ(density_at(s, 2.5), 0.05);
}

TEST(Clip, ScalesByInverseSqrtOfWorkers) {
  CompressionSpec s;
  s.method = Method::kDgc;
  s.clip_norm = 1.0;
  GradientCompressor c(s, {2}, 1);
  std::vector<float> g{3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(c.clip(g, 4), 5.0);  // limit 1 / sqrt(4) = 0.5
  EXPECT_NEAR(g[0], 0.3f, 1e-7);
  EXPECT_NEAR(g[1], 0.4f, 1e-7);
}

namespace {

// Scatters an encoded update into a dense double vector.
void add_sent(const Encoded& e, std::size_t n, std::vector<double>& acc) {
  switch (e.encoding) {
    case Encoding::kDense:
      for (std::size_t i = 0; i < n; ++i) acc[i] += e.values[i];
      break;
    case Encoding::kDenseF16:
      for (std::size_t i = 0; i < n; ++i) acc[i] += half_to_float(e.half[i]);
      break;
    case Encoding::kSparse:
      for (std::size_t j = 0; j < e.indices.size(); ++j) acc[e.indices[j]] += e.values[j];
      break;
    case Encoding::kSeeded: {
      std::vector<std::uint32_t> idx;
      randomk_indices(n, e.values.size(), e.seed, idx);
      for (std::size_t j = 0; j < idx.size(); ++j) acc[idx[j]] += e.values[j];
      break;
    }
    case Encoding::kLowRank: {
      std::vector<float> out(n);
      lowrank_decode(e.indices, e.values, out);
      for (std::size_t i = 0; i < n; ++i) acc[i] += out[i];
      break;
    }
  }
}

}  // namespace

TEST(ErrorFeedback, SentPlusResidualEqualsInput) {
  const std::size_t n = 5000;
  for (Method m : {Method::kTopk, Method::kRandomk, Method::kFp16, Method::kDgc}) {
    CompressionSpec s;
    s.method = m;
    s.momentum = 0.9;
    GradientCompressor c(s, {static_cast<std::int64_t>(n)}, 9);
    std::vector<double> in(n, 0.0), sent(n, 0.0);
    for (int step = 0; step < 40; ++step) {
      auto g = normal(n, 100 + step);
      if (m == Method::kDgc) {
        // What enters DGC's accumulator is the corrected momentum u, tracked here in double
        // (masking is replayed from the compressor's own velocity afterwards).
        std::vector<float> before(c.velocity(0).begin(), c.velocity(0).end());
        for (std::size_t i = 0; i < n; ++i) in[i] += static_cast<float>(0.9f * before[i] + g[i]);
      } else {
        for (std::size_t i = 0; i < n; ++i) in[i] += g[i];
      }
      add_sent(c.encode(0, g, 0.01, static_cast<std::uint64_t>(step)), n, sent);
    }
    auto r = c.residual(0);
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(sent[i] + r[i] - in[i]));
    EXPECT_LT(worst, 1e-4) << enum_name(m);
  }
}

TEST(Dgc, AtDensityOneEqualsMomentumSgd) {
  const std::size_t n = 1000;
  CompressionSpec s;
  s.method = Method::kDgc;
  s.momentum = 0.9;
  GradientCompressor c(s, {static_cast<std::int64_t>(n)}, 3);
  std::vector<float> x_dgc(n, 0.5f), x_ref(n, 0.5f), buf(n, 0.0f);
  const float lr = 0.05f;
  for (int step = 0; step < 50; ++step) {
    auto g = normal(n, 500 + step);
    const auto& e = c.encode(0, g, 1.0, static_cast<std::uint64_t>(step));
    ASSERT_EQ(e.encoding, Encoding::kDense);
    for (std::size_t i = 0; i < n; ++i) x_dgc[i] -= lr * e.values[i];  // the PS, momentum 0
    for (std::size_t i = 0; i < n; ++i) {  // torch.optim.SGD(momentum=0.9)
      buf[i] = 0.9f * buf[i] + g[i];
      x_ref[i] -= lr * buf[i];
    }
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(x_dgc[i], x_ref[i], 1e-6) << i;
}

TEST(Dgc, MomentumFactorMaskingAsHandWorked) {
  CompressionSpec s;
  s.method = Method::kDgc;
  s.momentum = 0.5;
  GradientCompressor c(s, {4}, 1);
  std::vector<float> g1{1.0f, 0.5f, 0.0f, 0.0f}, g0(4, 0.0f);
  // Step 1: u = v = [1, .5, 0, 0]; k = 1 sends index 0 (accumulated this step only: keeps u).
  const auto& e1 = c.encode(0, g1, 0.25, 0);
  ASSERT_EQ(e1.indices, (std::vector<std::uint32_t>{0}));
  EXPECT_FLOAT_EQ(e1.values[0], 1.0f);
  EXPECT_EQ(std::vector<float>(c.velocity(0).begin(), c.velocity(0).end()), (std::vector<float>{1, 0.5f, 0, 0}));
  EXPECT_EQ(std::vector<float>(c.residual(0).begin(), c.residual(0).end()), (std::vector<float>{0, 0.5f, 0, 0}));
  // Step 2: u = [.5, .25, 0, 0], v = [.5, .75, 0, 0]; sends index 1, held back since step 1:
  // its momentum is masked.
  const auto& e2 = c.encode(0, g0, 0.25, 1);
  ASSERT_EQ(e2.indices, (std::vector<std::uint32_t>{1}));
  EXPECT_FLOAT_EQ(e2.values[0], 0.75f);
  EXPECT_EQ(std::vector<float>(c.velocity(0).begin(), c.velocity(0).end()), (std::vector<float>{0.5f, 0, 0, 0}));
  EXPECT_EQ(std::vector<float>(c.residual(0).begin(), c.residual(0).end()), (std::vector<float>{0.5f, 0, 0, 0}));
}

TEST(MinCompressBytes, AlwaysSentFloatsGoBesidesTheTopkAndTheRestKeepsErrorFeedback) {
  CompressionSpec s;
  s.method = Method::kTopk;
  GradientCompressor c(s, {6}, 1);
  c.send_always(0, {4, 5});
  // Step 1: v = g; the top-1 is index 1 (3.0); indices 4 and 5 go too.
  const std::vector<float> g1{0.1f, 3.0f, 0.2f, -0.5f, 0.05f, -0.02f};
  const auto& e1 = c.encode(0, g1, 1.0 / 6, 0);
  ASSERT_EQ(e1.encoding, Encoding::kSparse);
  EXPECT_EQ(e1.indices, (std::vector<std::uint32_t>{1, 4, 5}));
  EXPECT_EQ(e1.values, (std::vector<float>{3.0f, 0.05f, -0.02f}));
  EXPECT_EQ(std::vector<float>(c.residual(0).begin(), c.residual(0).end()),
            (std::vector<float>{0.1f, 0, 0.2f, -0.5f, 0, 0}));
  // Step 2: v = [.1, 0, .2, -.5, 0, 0] + g2 = [.1, 0, .2, -2, 1, 1]: the top-1 is index 3;
  // 4 and 5 again.
  const std::vector<float> g2{0.0f, 0.0f, 0.0f, -1.5f, 1.0f, 1.0f};
  const auto& e2 = c.encode(0, g2, 1.0 / 6, 1);
  EXPECT_EQ(e2.indices, (std::vector<std::uint32_t>{3, 4, 5}));
  EXPECT_EQ(e2.values, (std::vector<float>{-2.0f, 1.0f, 1.0f}));
  // When the top-k already holds an always-sent index it is sent once.
  const std::vector<float> g3{0.0f, 0.0f, 0.0f, 0.0f, 9.0f, 0.0f};
  const auto& e3 = c.encode(0, g3, 1.0 / 6, 2);
  EXPECT_EQ(e3.indices, (std::vector<std::uint32_t>{4, 5}));
  EXPECT_EQ(e3.values, (std::vector<float>{9.0f, 0.0f}));
}

TEST(MinCompressBytes, WithDgcTheAlwaysSentFloatsFollowMomentumSgd) {
  CompressionSpec s;
  s.method = Method::kDgc;
  s.momentum = 0.5;
  GradientCompressor c(s, {5}, 1);
  c.send_always(0, {0});
  // Index 0 gets g = 1, 2, 4: momentum SGD's buffer is 1, 0.5·1 + 2 = 2.5, 0.5·2.5 + 4 = 5.25,
  // and it is what DGC sends, every step, whatever the top-1 of the others.
  const std::vector<std::vector<float>> gs{{1, 8, 0, 0, 0}, {2, 0, 7, 0, 0}, {4, 0, 0, 0, 6}};
  const std::vector<float> want{1.0f, 2.5f, 5.25f};
  for (std::size_t t = 0; t < gs.size(); ++t) {
    const auto& e = c.encode(0, gs[t], 0.2, t);
    ASSERT_GE(e.indices.size(), 1u);
    ASSERT_EQ(e.indices[0], 0u) << t;
    EXPECT_FLOAT_EQ(e.values[0], want[t]) << t;
    EXPECT_FLOAT_EQ(c.velocity(0)[0], want[t]) << t;  // never masked: sent the step it accumulated
    EXPECT_EQ(c.residual(0)[0], 0.0f) << t;
  }
}

TEST(MinCompressBytes, BadListsAreRefusedAndOtherMethodsIgnoreTheList) {
  CompressionSpec s;
  s.method = Method::kTopk;
  GradientCompressor c(s, {4}, 1);
  EXPECT_THROW(c.send_always(1, {0}), InvalidArgument);
  EXPECT_THROW(c.send_always(0, {2, 1}), InvalidArgument);
  EXPECT_THROW(c.send_always(0, {1, 1}), InvalidArgument);
  EXPECT_THROW(c.send_always(0, {4}), InvalidArgument);
  s.method = Method::kRandomk;
  GradientCompressor r(s, {4}, 1);
  r.send_always(0, {3});
  EXPECT_EQ(r.encode(0, std::vector<float>{1, 2, 3, 4}, 0.25, 0).values.size(), 1u);
}

TEST(MinCompressBytes, PushEncoderFindsTheSmallTensorsInThePartitionsThatHoldThem) {
  // Tensors of 10, 3, 20 and 2 floats, partitions of at most 12 floats (ps::make_layout):
  // [0, 10), [10, 13), [13, 23), [23, 33), [33, 35). min_compress_bytes = 16: the tensors of
  // 3 and 2 floats (12 and 8 bytes) are sent in full; the others keep their top-1.
  const std::vector<std::int64_t> sizes{10, 3, 20, 2};
  const auto layout = ps::make_layout(sizes, 12, 1);
  ASSERT_EQ(layout.partitions.size(), 5u);
  CompressionSpec s;
  s.method = Method::kTopk;
  s.min_compress_bytes = 16;
  ps::PushEncoder enc(s, layout, 1, sizes);
  EXPECT_EQ(enc.always_sent_floats(), 5);
  std::vector<float> g(35);
  std::iota(g.begin(), g.end(), 1.0f);
  const auto pushes = enc.encode(g, 1, 0.01, 0);
  std::vector<std::uint32_t> counts;
  for (const auto& p : pushes) counts.push_back(p.count);
  EXPECT_EQ(counts, (std::vector<std::uint32_t>{1, 3, 1, 1, 2}));
  EXPECT_EQ(pushes[1].codec, wire::Codec::kDenseF32);  // every float of the partition: dense
  EXPECT_EQ(pushes[4].codec, wire::Codec::kDenseF32);
  EXPECT_EQ(pushes[0].codec, wire::Codec::kSparseF32);
  // Sizes that do not add up to the layout are refused.
  EXPECT_THROW(ps::PushEncoder(s, layout, 1, std::vector<std::int64_t>{10, 3}), InvalidArgument);
  // Without tensor sizes, or at 0, nothing is always sent.
  EXPECT_EQ(ps::PushEncoder(s, layout, 1).always_sent_floats(), 0);
}

TEST(Downlink, ReplicaPlusUnsentDifferenceEqualsPsParameters) {
  const std::size_t n = 2000;
  ps::ShardState st(0.0);
  auto x0 = normal(n, 77);
  st.init(0, x0);
  const int workers = 3;
  std::vector<std::vector<float>> replica(workers, std::vector<float>(n));
  for (int w = 0; w < workers; ++w) st.pull(0, replica[w], w);
  std::mt19937 rng(5);
  TopkScratch scratch;
  std::vector<std::uint32_t> idx;
  std::vector<float> vals;
  for (int op = 0; op < 300; ++op) {
    const int w = static_cast<int>(rng() % workers);
    if (rng() % 2 == 0) {  // a sparse push
      auto g = normal(n, 1000 + op);
      topk_exact(g, 20, idx, scratch);
      std::vector<float> gv;
      for (auto i : idx) gv.push_back(g[i]);
      st.push_sparse(0, idx, gv, 0.1f);
    } else {  // a sparse pull of 1% into the worker's replica
      st.pull_diff(0, w, k_for(n, 0.01), idx, vals);
      for (std::size_t j = 0; j < idx.size(); ++j) replica[w][idx[j]] += vals[j];
    }
  }
  std::vector<float> x(n);
  st.pull(0, x);  // rank -1: does not move anyone's x_seen
  for (int w = 0; w < workers; ++w) {
    st.pull_diff(0, w, n, idx, vals);  // everything still unsent
    ASSERT_EQ(idx.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(static_cast<double>(replica[w][i]) + vals[i], x[i], 1e-6) << "worker " << w << " index " << i;
    }
  }
}

TEST(Downlink, Fp16PullsSendEveryDifferenceRoundedAndKeepTheRestForLater) {
  // Method fp16's downlink: each pull sends binary16(x − x_seen) in full, x_seen takes
  // exactly the decoding the worker adds, and the rounding error stays for later pulls.
  const std::size_t n = 1000;
  ps::ShardState st(0.9);  // dense pushes with the PS's momentum, as method fp16 trains
  st.init(0, normal(n, 21));
  const int workers = 3;
  std::vector<std::vector<float>> replica(workers, std::vector<float>(n));
  for (int w = 0; w < workers; ++w) st.pull(0, replica[w], w);
  std::mt19937 rng(9);
  std::vector<std::uint16_t> half;
  std::vector<float> x(n);
  for (int op = 0; op < 200; ++op) {
    const int w = static_cast<int>(rng() % workers);
    if (rng() % 2 == 0) {
      st.push(0, normal(n, 3000 + op), 0.05f);
      continue;
    }
    st.pull(0, x);  // rank -1: moves no one's x_seen
    st.pull_half(0, w, half);
    ASSERT_EQ(half.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      // The difference from what the worker holds (its replica is x_seen), rounded.
      const float d = x[i] - replica[w][i];
      ASSERT_EQ(half[i], float_to_half(d)) << "op " << op << " index " << i;
      replica[w][i] += half_to_float(half[i]);
      // Round to nearest: what is left is at most half a binary16 ulp of d (2^-11 |d|),
      // or under the smallest subnormal (2^-24) where d flushes to zero.
      ASSERT_LE(std::fabs(x[i] - replica[w][i]), std::max(std::ldexp(std::fabs(d), -11), std::ldexp(1.0f, -24)) * 1.0001f);
    }
  }
  // Nothing was lost: a last fp32 difference (a sparse pull of everything) closes each
  // replica onto x exactly up to float rounding.
  st.pull(0, x);
  std::vector<std::uint32_t> idx;
  std::vector<float> vals;
  for (int w = 0; w < workers; ++w) {
    st.pull_diff(0, w, n, idx, vals);
    for (std::size_t j = 0; j < idx.size(); ++j) {
      ASSERT_NEAR(static_cast<double>(replica[w][idx[j]]) + vals[j], x[idx[j]], 1e-6) << "worker " << w;
    }
  }
}

TEST(Downlink, Fp16PullsSendBeyondTheLargestBinary16InInstalments) {
  // A difference past 65,504 (the largest finite binary16) goes as ±65,504, not ±Inf; the
  // rest arrives with the next pulls.
  ps::ShardState st(0.0);
  st.init(0, std::vector<float>{0.0f, 1.0f});
  std::vector<float> replica(2);
  st.pull(0, replica, 0);
  const std::vector<float> g{-1.0f, 0.0f};
  st.push(0, g, 100000.0f);  // x[0] = 100,000
  std::vector<std::uint16_t> half;
  st.pull_half(0, 0, half);
  EXPECT_EQ(half_to_float(half[0]), 65504.0f);
  EXPECT_EQ(half_to_float(half[1]), 0.0f);
  replica[0] += half_to_float(half[0]);
  st.pull_half(0, 0, half);
  // 34,496 is a binary16 value (a multiple of its ulp there, 32).
  EXPECT_EQ(half_to_float(half[0]), 34496.0f);
  replica[0] += half_to_float(half[0]);
  EXPECT_EQ(replica[0], 100000.0f);
  // A pull before any dense pull of that worker is refused, naming the partition.
  EXPECT_THROW(st.pull_half(0, 7, half), ProtocolError);
  EXPECT_THROW(st.pull_half(3, 0, half), ProtocolError);
}

TEST(SparsePush, MalformedSparseUpdatesAreRejectedAndApplyNothing) {
  ps::ShardState st(0.0);
  std::vector<float> x(10, 1.0f), out(10);
  st.init(0, x);
  auto err = [&](std::vector<std::uint32_t> idx, std::vector<float> v) {
    try {
      st.push_sparse(0, idx, v, 1.0f);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(err({3, 10}, {1, 1}), "sparse push to partition 0: index 10 out of range [0, 10)");
  EXPECT_EQ(err({5, 2}, {1, 1}), "sparse push to partition 0: indices must be strictly ascending (5 then 2)");
  EXPECT_EQ(err({2, 2}, {1, 1}), "sparse push to partition 0: indices must be strictly ascending (2 then 2)");
  EXPECT_EQ(err(std::vector<std::uint32_t>(11, 0), std::vector<float>(11, 0)),
            "sparse push to partition 0: count 11 exceeds the partition's 10 values");
  EXPECT_EQ(err({1}, {std::nanf("")}).rfind("push to partition 0: value 0 is", 0), 0u);
  EXPECT_THROW(st.push(0, std::vector<float>(10, INFINITY), 1.0f), ProtocolError);
  st.pull(0, out);
  EXPECT_EQ(out, x);  // nothing was applied
  st.push_sparse(0, std::vector<std::uint32_t>{1, 4}, std::vector<float>{2.0f, -1.0f}, 0.5f);
  st.pull(0, out);
  EXPECT_FLOAT_EQ(out[1], 0.0f);
  EXPECT_FLOAT_EQ(out[4], 1.5f);
  EXPECT_FLOAT_EQ(out[0], 1.0f);
}

TEST(Downlink, AutoAsksForWhatTheWorkersCanHavePushedSinceThePull) {
  CompressionSpec s;
  s.method = Method::kDgc;
  s.ratio = 0.001;
  s.warmup_epochs = 1;
  s.warmup_schedule = compress::WarmupSchedule::kStages;
  s.downlink_ratio = 0;  // "auto"
  // After the warm-up: 4 workers × (0.1 % + 1 % of the floats sent in full) = 4.4 %.
  EXPECT_NEAR(downlink_density(s, 2.0, 4, 0.01), 0.044, 1e-12);
  // In the warm-up's first stage (25 %) four workers can have touched everything.
  EXPECT_EQ(downlink_density(s, 0.1, 4, 0.0), 1.0);
  // Third stage (1/64): 2 workers → 2/64.
  EXPECT_NEAR(downlink_density(s, 0.6, 2, 0.0), 2.0 / 64, 1e-12);
  // A fixed downlink_ratio warms up with the uplink's schedule, then stays.
  s.downlink_ratio = 0.01;
  EXPECT_EQ(downlink_density(s, 2.0, 4, 0.5), 0.01);
  EXPECT_EQ(downlink_density(s, 0.1, 4, 0.0), 0.25);
}
