// The low-rank method (compress/lowrank.h): its blocks, its compression against NumPy's
// (tests/fixtures/powersgd_numpy.json, made by make_powersgd_fixture.py), its error
// feedback, the PS's decoding of its frames and the refusal of bad ones.
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "compress/compressor.h"
#include "compress/lowrank.h"
#include "ps/exchange.h"
#include "ps/partition.h"
#include "ps/payload.h"
#include "ps/shard_state.h"
#include "wire/frame.h"

using namespace dltrain;
using namespace dltrain::compress;

namespace {

std::vector<LowRankBlock> blocks_from(const nlohmann::json& j) {
  std::vector<LowRankBlock> out;
  for (const auto& b : j) out.push_back({b[0].get<std::uint32_t>(), b[1].get<std::uint32_t>(), b[2].get<std::uint32_t>()});
  return out;
}

void expect_near(std::span<const float> got, const nlohmann::json& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    ASSERT_NEAR(got[i], w, tol * std::max(1.0, std::fabs(w))) << what << " [" << i << "]";
  }
}

// A push frame's words as the PS reads them: the header words, then the values.
std::vector<float> words_of(const Encoded& e) {
  std::vector<float> w(e.indices.size() + e.values.size());
  std::memcpy(w.data(), e.indices.data(), 4 * e.indices.size());
  std::copy(e.values.begin(), e.values.end(), w.begin() + static_cast<std::ptrdiff_t>(e.indices.size()));
  return w;
}

wire::FrameHeader lowrank_header(std::size_t words) {
  wire::FrameHeader h;
  h.type = wire::MessageType::kPush;
  h.codec = wire::Codec::kLowRankF32;
  h.count = static_cast<std::uint32_t>(words);
  h.payload_bytes = 4 * h.count;
  return h;
}

}  // namespace

TEST(LowRank, MatchesNumPysPowerSgdStepByStepWithWarmStartAndErrorFeedback) {
  std::ifstream in(std::string(DLTRAIN_SOURCE_DIR) + "/tests/fixtures/powersgd_numpy.json");
  ASSERT_TRUE(in) << "tests/fixtures/powersgd_numpy.json";
  const auto fixture = nlohmann::json::parse(in);
  ASSERT_EQ(fixture["cases"].size(), 3u);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<TensorRows> tensors;
    std::int64_t n = 0;
    for (const auto& t : c["tensors"]) {
      tensors.push_back({t[0].get<std::int64_t>(), t[1].get<std::int64_t>()});
      n += t[0].get<std::int64_t>();
    }
    const int rank = c["rank"].get<int>();
    // One partition holding every tensor, as the fixture has it.
    auto blocks = lowrank_blocks(tensors, std::vector<std::int64_t>{n}, rank, 0);
    ASSERT_EQ(blocks.size(), 1u);
    EXPECT_EQ(blocks[0], blocks_from(c["blocks"]));
    CompressionSpec spec;
    spec.method = Method::kPowerSgd;
    spec.rank = rank;
    GradientCompressor comp(spec, {n}, 7);
    comp.set_lowrank_blocks(blocks);
    for (std::size_t b = 0; b < blocks[0].size(); ++b) {
      std::vector<float> q;
      for (const auto& x : c["initial_q"][b]) q.push_back(x.get<float>());
      if (!q.empty()) comp.powersgd()->set_q(0, b, q);
    }
    std::vector<float> decoded(static_cast<std::size_t>(n));
    for (std::size_t s = 0; s < c["grads"].size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      std::vector<float> g;
      for (const auto& x : c["grads"][s]) g.push_back(x.get<float>());
      const auto& e = comp.encode(0, g, 0.5, s);
      ASSERT_EQ(e.encoding, Encoding::kLowRank);
      const auto& want = c["steps"][s];
      expect_near(e.values, want["values"], 2e-4, "factors");
      lowrank_decode(e.indices, e.values, decoded);
      expect_near(decoded, want["decoded"], 2e-4, "P̂·Qᵀ");
      expect_near(comp.residual(0), want["error"], 2e-4, "error feedback");
    }
  }
}

TEST(LowRank, SentPlusResidualEqualsAccumulatedGradient) {
  // 3 steps of a 40 × 30 matrix at rank 3 through the compressor: Σ decoded + residual =
  // Σ gradients (to fp32 rounding), the invariant of error feedback.
  const std::int64_t rows = 40, cols = 30, n = rows * cols;
  CompressionSpec spec;
  spec.method = Method::kPowerSgd;
  spec.rank = 3;
  GradientCompressor comp(spec, {n}, 3);
  comp.set_lowrank_blocks(lowrank_blocks(std::vector<TensorRows>{{n, rows}}, std::vector<std::int64_t>{n}, 3, 0));
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  std::vector<double> grads(n, 0.0), sent(n, 0.0);
  std::vector<float> g(n), out(n);
  for (int s = 0; s < 3; ++s) {
    for (std::int64_t i = 0; i < n; ++i) grads[i] += g[i] = d(rng);
    const auto& e = comp.encode(0, g, 0.5, s);
    ASSERT_EQ(e.encoding, Encoding::kLowRank);
    EXPECT_EQ(e.values.size(), static_cast<std::size_t>((rows + cols) * 3));
    lowrank_decode(e.indices, e.values, out);
    for (std::int64_t i = 0; i < n; ++i) sent[i] += out[i];
  }
  for (std::int64_t i = 0; i < n; ++i) ASSERT_NEAR(sent[i] + comp.residual(0)[i], grads[i], 1e-4) << i;
  // At density 1 (the warm-up) the accumulator goes out in full and nothing stays.
  const auto& e = comp.encode(0, g, 1.0, 3);
  EXPECT_EQ(e.encoding, Encoding::kDense);
  for (float v : comp.residual(0)) ASSERT_EQ(v, 0.0f);
}

TEST(LowRank, AZeroGradientSendsZerosAndKeepsTheWarmStart) {
  const std::int64_t n = 8 * 6;
  CompressionSpec spec;
  spec.method = Method::kPowerSgd;
  spec.rank = 2;
  GradientCompressor comp(spec, {n}, 5);
  comp.set_lowrank_blocks(lowrank_blocks(std::vector<TensorRows>{{n, 8}}, std::vector<std::int64_t>{n}, 2, 0));
  const std::vector<float> q0(comp.powersgd()->q(0, 0).begin(), comp.powersgd()->q(0, 0).end());
  const auto& e = comp.encode(0, std::vector<float>(n, 0.0f), 0.5, 0);
  for (float v : e.values) EXPECT_EQ(v, 0.0f);
  const auto q1 = comp.powersgd()->q(0, 0);
  EXPECT_TRUE(std::equal(q1.begin(), q1.end(), q0.begin()));
  // A gradient after it is compressed as usual (the warm start was not lost).
  std::vector<float> g(n);
  std::iota(g.begin(), g.end(), 1.0f);
  const auto& e2 = comp.encode(0, g, 0.5, 1);
  std::vector<float> out(n);
  lowrank_decode(e2.indices, e2.values, out);
  double err = 0;
  for (std::int64_t i = 0; i < n; ++i) err += std::fabs(out[i] - g[i]);
  EXPECT_LT(err / n, 1e-3);  // g is rank 2 (i·6 + j + 1): rank 2 reproduces it
}

TEST(LowRank, BlocksFollowTensorsPartitionsAndTheSizeRule) {
  // mlp-large's first weight (768 × 784) cut by ps::make_layout into three partitions of
  // 256 rows each, then its bias (768), the 128 × 768 weight, its bias, 10 × 128, bias 10.
  const std::vector<std::int64_t> sizes{768 * 784, 768, 128 * 768, 128, 10 * 128, 10};
  const std::vector<std::int64_t> rows{768, 1, 128, 1, 10, 1};
  const auto layout = ps::make_layout(sizes, 262144, 1);
  std::vector<std::int64_t> lengths;
  for (const auto& p : layout.partitions) lengths.push_back(p.length);
  ASSERT_EQ(lengths, (std::vector<std::int64_t>{200704, 200704, 200704, 768 + 98304 + 128 + 1280 + 10}));
  std::vector<TensorRows> t;
  for (std::size_t i = 0; i < sizes.size(); ++i) t.push_back({sizes[i], rows[i]});
  const auto b = lowrank_blocks(t, lengths, 4, 0);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(b[p], (std::vector<LowRankBlock>{{256, 784, 4}}));
  EXPECT_EQ(b[3], (std::vector<LowRankBlock>{{1, 768, 0}, {128, 768, 4}, {1, 128, 0}, {10, 128, 4}, {1, 10, 0}}));
  // min_compress_bytes sends the small 10 × 128 weight (5,120 bytes) in full, merged with
  // the biases around it.
  const auto small = lowrank_blocks(t, lengths, 4, 8192);
  EXPECT_EQ(small[3], (std::vector<LowRankBlock>{{1, 768, 0}, {128, 768, 4}, {1, 128 + 1280 + 10, 0}}));
  // A piece that does not start on a row boundary is sent in full: a 3 × 4 matrix over
  // partitions of 6 and 6 floats (1.5 rows each).
  const auto odd = lowrank_blocks(std::vector<TensorRows>{{12, 3}}, std::vector<std::int64_t>{6, 6}, 1, 0);
  EXPECT_EQ(odd[0], (std::vector<LowRankBlock>{{1, 6, 0}}));
  EXPECT_EQ(odd[1], (std::vector<LowRankBlock>{{1, 6, 0}}));
  // Bad inputs.
  EXPECT_THROW(lowrank_blocks(t, std::vector<std::int64_t>{5}, 4, 0), InvalidArgument);
  EXPECT_THROW(lowrank_blocks(std::vector<TensorRows>{{10, 3}}, std::vector<std::int64_t>{10}, 1, 0), InvalidArgument);
  EXPECT_THROW(lowrank_blocks(t, lengths, 0, 0), InvalidArgument);
}

TEST(LowRank, PushEncoderSendsLowRankFramesThePsDecodes) {
  // Through the worker's encoder and the PS's payload decoder: the PS applies exactly
  // what the worker took out of its accumulator.
  const std::vector<std::int64_t> sizes{20 * 16, 16, 4 * 16};
  const std::vector<std::int64_t> rows{20, 1, 4};
  const auto layout = ps::make_layout(sizes, 1 << 20, 1);
  CompressionSpec spec;
  spec.method = Method::kPowerSgd;
  spec.rank = 2;
  ps::PushEncoder enc(spec, layout, 9, sizes, rows);
  EXPECT_EQ(enc.always_sent_floats(), 16);  // the bias; 4 × 16 at rank 2 (40 floats) is smaller
  std::vector<float> g(400);
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  for (auto& x : g) x = d(rng);
  const auto pushes = enc.encode(g, 1, 0.5, 0);
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].codec, wire::Codec::kLowRankF32);
  // 1 + 3 × 3 header words, (20 + 16)·2 + 16 + (4 + 16)·2 values.
  EXPECT_EQ(pushes[0].count, 10u + 72u + 16u + 40u);
  std::vector<float> words((pushes[0].first.size() + pushes[0].second.size()) / 4);
  std::memcpy(words.data(), pushes[0].first.data(), pushes[0].first.size());
  std::memcpy(reinterpret_cast<std::byte*>(words.data()) + pushes[0].first.size(), pushes[0].second.data(),
              pushes[0].second.size());
  ps::PayloadScratch scratch;
  const auto view = ps::decode_push(lowrank_header(words.size()), words, 400, scratch);
  EXPECT_FALSE(view.sparse);
  ASSERT_EQ(view.values.size(), 400u);
  // The bias went in full.
  for (int i = 320; i < 336; ++i) EXPECT_EQ(view.values[i], g[i]) << i;
  // Without the tensors' rows powersgd cannot see its matrices.
  EXPECT_THROW(ps::PushEncoder(spec, layout, 9, sizes), InvalidArgument);
}

TEST(LowRank, MalformedFramesAreRefusedNamingTheFieldAndWriteNothing) {
  CompressionSpec spec;
  spec.method = Method::kPowerSgd;
  spec.rank = 2;
  GradientCompressor comp(spec, {60}, 1);
  comp.set_lowrank_blocks(lowrank_blocks(std::vector<TensorRows>{{60, 6}}, std::vector<std::int64_t>{60}, 2, 0));
  std::vector<float> g(60, 1.0f);
  g[7] = 3.0f;
  const Encoded good = comp.encode(0, g, 0.5, 0);
  ps::PayloadScratch scratch;
  auto refuse = [&](Encoded e, std::size_t length) {
    const auto w = words_of(e);
    try {
      ps::decode_push(lowrank_header(w.size()), w, length, scratch);
    } catch (const ProtocolError& err) {
      return std::string(err.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(refuse(good, 60), "(accepted)");
  EXPECT_EQ(refuse(good, 61), "low-rank push to partition 0: the blocks cover 60 floats, the partition has 61");
  Encoded e = good;
  e.indices[3] = 7;  // rank 7 of a 6 × 10 matrix
  EXPECT_EQ(refuse(e, 60), "low-rank push to partition 0: low-rank block 0: rank 7 exceeds min(rows 6, cols 10, 64)");
  e = good;
  e.indices[1] = 0;
  EXPECT_EQ(refuse(e, 60), "low-rank push to partition 0: low-rank block 0: rows 0 and cols 10 must be at least 1");
  e = good;
  e.indices[0] = 1000000;  // more blocks than the frame has words
  EXPECT_EQ(refuse(e, 60).rfind("low-rank push to partition 0: a header of 1000000 blocks needs 3000001 words", 0), 0u);
  e = good;
  e.values.pop_back();
  EXPECT_EQ(refuse(e, 60), "low-rank push to partition 0: the blocks need 32 values, the frame has 31");
  e = good;
  e.indices[2] = 0xFFFFFFFFu;  // rows × cols far beyond the partition
  EXPECT_EQ(refuse(e, 60).rfind("low-rank push to partition 0: low-rank block 0: the blocks cover more", 0), 0u);
  // An empty payload.
  EXPECT_THROW(ps::decode_push(lowrank_header(0), std::span<const float>(), 60, scratch), ProtocolError);
}

TEST(LowRank, SpecParsesTheMethodAndItsWarmupIsDense) {
  EXPECT_EQ(parse_enum<Method>("powersgd", "compression.method"), Method::kPowerSgd);
  EXPECT_EQ(enum_name(Method::kPowerSgd), "powersgd");
  CompressionSpec s;
  s.method = Method::kPowerSgd;
  s.warmup_epochs = 0.5;
  s.ratio = 0.001;
  EXPECT_EQ(density_at(s, 0.2), 1.0);  // dense pushes in the warm-up
  EXPECT_LT(density_at(s, 0.6), 1.0);  // low rank after it
}

TEST(LowRankDownlink, ReplicaPlusUnsentDifferenceEqualsPsParameters) {
  // A 12 × 10 matrix and a bias of 10 in one partition; three workers' dense pushes and
  // one worker's low-rank pulls in turn: the replica stays x_seen, and what was not sent
  // stays in x − x_seen (nothing is lost, as with the top-k downlink).
  const std::size_t n = 130;
  ps::ShardState st(0.9);  // PS momentum, as powersgd runs
  std::vector<float> x0(n);
  std::iota(x0.begin(), x0.end(), 0.0f);
  st.init(0, x0);
  std::vector<float> replica(n);
  st.pull(0, replica, 1);
  const std::vector<std::uint32_t> tiling = lowrank_header(std::vector<LowRankBlock>{{12, 10, 2}, {1, 10, 0}});
  ASSERT_EQ(tiling, (std::vector<std::uint32_t>{2, 12, 10, 2, 1, 10, 0}));
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<std::uint32_t> header;
  std::vector<float> values, decoded(n);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> g(n);
    for (auto& v : g) v = d(rng);
    st.push(0, g, 0.1f);
    st.pull_lowrank(0, 1, tiling, header, values);
    EXPECT_EQ(header, tiling);
    ASSERT_EQ(values.size(), (12u + 10u) * 2u + 10u);  // P, Q, then the bias in full
    lowrank_decode(header, values, decoded);
    for (std::size_t i = 0; i < n; ++i) replica[i] += decoded[i];
  }
  std::vector<float> x(n);
  st.pull(0, x);  // rank -1: nobody's x_seen moves
  std::vector<std::uint32_t> idx;
  std::vector<float> rest;
  st.pull_diff(0, 1, n, idx, rest);  // everything still unsent
  ASSERT_EQ(idx.size(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(replica[i] + rest[i], x[i], 1e-4) << i;
  // The bias went in full every time: nothing of it is left.
  for (std::size_t i = 120; i < n; ++i) EXPECT_NEAR(rest[i], 0.0f, 1e-6) << i;
  // A pull before the worker's dense pull, and a tiling that does not cover the
  // partition, are refused.
  EXPECT_THROW(st.pull_lowrank(0, 2, tiling, header, values), ProtocolError);
  try {
    st.pull_lowrank(0, 1, std::vector<std::uint32_t>{1, 12, 10, 2}, header, values);
    ADD_FAILURE() << "a tiling of 120 floats was taken for a partition of 130";
  } catch (const ProtocolError& e) {
    EXPECT_STREQ(e.what(), "low-rank pull of partition 0: the blocks cover 120 floats, the partition has 130");
  }
}
