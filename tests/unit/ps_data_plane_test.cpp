// The PS data plane over real loopback TCP: pushes and pulls of every codec against one
// or two shards with dense and sparse downlinks, as hand-computed, and malformed frames.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "compress/fp16.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "support/ps_shards.h"
#include "support/wait.h"
#include "wire/frame.h"

using namespace dltrain;
using namespace dltrain::ps;
using namespace dltrain::testing;

namespace {

// Codec × number of shards × downlink ratio (1 = dense pulls). The layout is always the
// partitions {4, 4}: with one shard it holds both, with two each holds one.
using DataPlaneParam = std::tuple<wire::Codec, int, double>;

const auto kPushCodecs = ::testing::Values(wire::Codec::kDenseF32, wire::Codec::kDenseF16, wire::Codec::kSparseF32,
                                           wire::Codec::kSparseF16);
const auto kShardCounts = ::testing::Values(1, 2);
const auto kDownlinkRatios = ::testing::Values(1.0, 0.25);

std::string codec_name(wire::Codec c) {
  switch (c) {
    case wire::Codec::kDenseF32: return "DenseF32";
    case wire::Codec::kDenseF16: return "DenseF16";
    case wire::Codec::kSparseF32: return "SparseF32";
    case wire::Codec::kSparseF16: return "SparseF16";
    default: return "Codec" + std::to_string(static_cast<int>(c));
  }
}

bool is_sparse(wire::Codec c) { return c == wire::Codec::kSparseF32 || c == wire::Codec::kSparseF16; }

// Bytes one element of a push takes in each codec, by hand (protocol.md): f32 4, f16 2,
// and a u32 index in front of each sparse value.
std::size_t element_bytes(wire::Codec c) {
  switch (c) {
    case wire::Codec::kDenseF32: return 4;
    case wire::Codec::kDenseF16: return 2;
    case wire::Codec::kSparseF32: return 8;
    case wire::Codec::kSparseF16: return 6;
    default: ADD_FAILURE() << "no push codec"; return 0;
  }
}

// IEEE binary16 of the few values the tests push, by hand (not through compress/fp16).
std::uint16_t half_of(float v) {
  if (v == 0.0f) return 0x0000;
  if (v == 1.0f) return 0x3C00;
  if (v == 2.0f) return 0x4000;
  if (v == -1.0f) return 0xBC00;
  ADD_FAILURE() << "no hand-made binary16 for " << v;
  return 0;
}

// The pushes of a flat gradient `g` (layout.total_floats) in codec `c`: dense codecs send
// every value of a partition, sparse ones its non-zero values (ascending indices). The
// returned pushes point into `*this`, which must outlive them.
struct EncodedPushes {
  std::vector<std::vector<std::uint32_t>> idx;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<std::uint16_t>> f16;
  std::vector<PartitionPush> pushes;

  EncodedPushes(wire::Codec c, const PartitionLayout& layout, const std::vector<float>& g) {
    const auto n = layout.partitions.size();
    idx.resize(n);
    f32.resize(n);
    f16.resize(n);
    pushes.resize(n);
    for (const auto& p : layout.partitions) {
      for (std::int64_t j = 0; j < p.length; ++j) {
        const float v = g[static_cast<std::size_t>(p.offset + j)];
        if (is_sparse(c) && v == 0.0f) continue;
        idx[p.key].push_back(static_cast<std::uint32_t>(j));
        f32[p.key].push_back(v);
        f16[p.key].push_back(half_of(v));
      }
      PartitionPush& pp = pushes[p.key];
      pp.codec = c;
      pp.count = static_cast<std::uint32_t>(idx[p.key].size());
      const bool half = c == wire::Codec::kDenseF16 || c == wire::Codec::kSparseF16;
      const auto values = half ? std::as_bytes(std::span(f16[p.key])) : std::as_bytes(std::span(f32[p.key]));
      if (is_sparse(c)) {
        pp.first = std::as_bytes(std::span(idx[p.key]));
        pp.second = values;
      } else {
        pp.first = values;
      }
    }
  }
};

std::string param_name(const ::testing::TestParamInfo<DataPlaneParam>& info) {
  const auto [codec, shards, ratio] = info.param;
  return codec_name(codec) + "_" + std::to_string(shards) + "shards_downlink" +
         std::to_string(static_cast<int>(ratio * 100)) + "pct";
}

std::string codec_shards_name(const ::testing::TestParamInfo<std::tuple<wire::Codec, int>>& info) {
  return codec_name(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param)) + "shards";
}

}  // namespace

// Replaces TwoShards.PushAndPullMatchHandComputedValues, which is the instance
// DenseF32_2shards (same pushes through PsClient::push_pull(grad, lr, params), same
// values, same byte counts); the other instances push the same gradients in the other
// codecs and put both partitions on one shard. Dense pulls only: the sparse downlink is
// DataPlaneDownlink's subject.
class DataPlaneTwoWorkers : public ::testing::TestWithParam<std::tuple<wire::Codec, int>> {};

TEST_P(DataPlaneTwoWorkers, PushAndPullMatchHandComputedValues) {
  const auto [codec, num_shards] = GetParam();
  PsShards shards(num_shards, 0.9, make_layout({4, 4}, 4, num_shards));
  const auto& layout = shards.layout;
  ASSERT_EQ(layout.partitions[0].shard, 0);
  ASSERT_EQ(layout.partitions[1].shard, num_shards == 2 ? 1 : 0);
  auto w0 = shards.client(PsShards::client_options(0, 2));
  auto w1 = shards.client(PsShards::client_options(1, 2));
  w0.connect();
  w1.connect();
  std::vector<float> x0(8);
  std::iota(x0.begin(), x0.end(), 1.0f);  // 1..8
  w0.init(x0);
  // Init has no reply, and w0 and w1 reach the shards on different connections: wait
  // until the shards hold both partitions, so that w0's init is the first one they take.
  const auto held = [&] {
    std::size_t n = 0;
    for (const auto& st : shards.states) n += st->num_partitions();
    return n;
  };
  wait_until([&] { return held() >= layout.partitions.size(); }, std::chrono::seconds(10), std::chrono::milliseconds(1));
  ASSERT_EQ(held(), layout.partitions.size()) << "w0's init did not reach the shards in 10 s";
  std::vector<float> other(8, 100.0f);
  w1.init(other);  // ignored: the shards keep the first values
  std::vector<float> params(8);
  w1.pull(params);
  EXPECT_EQ(params, x0);

  auto push_pull = [&](PsClient& w, const std::vector<float>& g, float lr) {
    if (codec == wire::Codec::kDenseF32) return w.push_pull(g, lr, params);  // the dense overload
    EncodedPushes e(codec, layout, g);
    w.push_pull(e.pushes, lr, 1.0, params);
  };
  // Worker 0 pushes g = 1 with lr 0.5: v = 1, x = x0 - 0.5.
  std::vector<float> g(8, 1.0f);
  push_pull(w0, g, 0.5f);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 0.5f, 1e-6) << i;
  // Worker 1 pushes g = 2 with lr 0.25: v = 0.9·1 + 2 = 2.9, x = x0 - 0.5 - 0.725.
  std::vector<float> g2(8, 2.0f);
  push_pull(w1, g2, 0.25f);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 1.225f, 1e-6) << i;
  w0.pull(params);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 1.225f, 1e-6) << i;
  // Two pushes per partition: 2 per shard with two shards, 4 on the one shard.
  const std::uint64_t pushes_per_shard = num_shards == 2 ? 2u : 4u;
  for (const auto& st : shards.states) EXPECT_EQ(st->pushes(), pushes_per_shard);

  // Bytes at the socket, handshakes and headers included (48-byte headers, 4 floats per
  // partition): w0 sent the handshake answer S·88, hello S·(48+8), init 2·(48+16),
  // push 2·(48 + 4 elements in the codec) + pull 2·48, pull 2·48. With S = 2 and dense
  // f32: 2·88 + 2·56 + 2·64 + 2·64 + 2·48 + 2·48.
  const std::uint64_t s = static_cast<std::uint64_t>(num_shards);
  const std::uint64_t push_payload = 4 * element_bytes(codec);
  EXPECT_EQ(w0.bytes_pushed(), s * 88 + s * 56 + 2u * 64 + 2u * (48 + push_payload) + 2u * 48 + 2u * 48);
  // and read challenge and proof S·(40+40), hello-ack S·48, two rounds of pull-replies
  // 2·(48+16) each.
  EXPECT_EQ(w0.bytes_pulled(), s * 80 + s * 48 + 4u * 64);
  EXPECT_EQ(shards.servers[0]->rejected_connections(), 0u);

  EXPECT_EQ(w0.done(), 1u);
  EXPECT_EQ(w1.workers_done(), 1u);
  EXPECT_EQ(w1.done(), 2u);
}

INSTANTIATE_TEST_SUITE_P(CodecsShards, DataPlaneTwoWorkers, ::testing::Combine(kPushCodecs, kShardCounts),
                         codec_shards_name);

// Replaces SparseDataPlane.SparsePushAndDownlinkOverTcpAsHandComputed, which is the
// instance SparseF32_2shards_downlink25pct (same pushes, values and byte counts). The
// other instances push the same gradient densely or in f16, put both partitions on one
// shard, or pull densely (the replica then takes every change at once).
class DataPlaneDownlink : public ::testing::TestWithParam<DataPlaneParam> {};

TEST_P(DataPlaneDownlink, PushAndDownlinkOverTcpAsHandComputed) {
  const auto [codec, num_shards, downlink] = GetParam();
  const bool sparse_pull = downlink < 1.0;
  // Momentum 0 (DGC: momentum lives at the workers). Partitions {4, 4}.
  PsShards shards(num_shards, 0.0, make_layout({4, 4}, 4, num_shards));
  auto co = PsShards::client_options(0, 1);
  co.sparse_downlink = true;
  auto w = shards.client(co);
  w.connect();
  std::vector<float> x0{1, 2, 3, 4, 5, 6, 7, 8}, replica(8);
  w.init(x0);
  w.pull(replica);  // dense: the shards now know this worker holds x0
  ASSERT_EQ(replica, x0);
  // Partition 0: +2 at local 1; partition 1: +1 at local 0 and -1 at local 3; lr 0.5.
  // Sparse codecs send exactly these (indices {1} and {0, 3}), dense ones the zeros too.
  EncodedPushes pushes(codec, shards.layout, {0, 2, 0, 0, 1, 0, 0, -1});
  if (is_sparse(codec)) {
    ASSERT_EQ(pushes.idx[0], (std::vector<std::uint32_t>{1}));
    ASSERT_EQ(pushes.idx[1], (std::vector<std::uint32_t>{0, 3}));
  }
  // x = [1, 1, 3, 4 | 4.5, 6, 7, 8.5]; downlink 25% → the top-1 difference per partition:
  // -1 at index 1 and, of the tied ±0.5, the lower index 4.
  w.push_pull(pushes.pushes, 0.5f, downlink, replica);
  if (sparse_pull) {
    EXPECT_EQ(replica, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8}));
  } else {
    EXPECT_EQ(replica, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8.5f}));
  }
  // Nothing new pushed: the next pull delivers the remaining +0.5 at index 7 (a dense
  // pull delivered it already).
  EncodedPushes nothing(codec, shards.layout, std::vector<float>(8, 0.0f));
  w.push_pull(nothing.pushes, 0.5f, downlink, replica);
  EXPECT_EQ(replica, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8.5f}));
  std::vector<float> x(8);
  w.pull(x);
  EXPECT_EQ(x, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8.5f}));
  // Bytes of an exchange that pushes nothing: push headers (+ 4 zeros per partition for a
  // dense codec, nothing for a sparse one) + pull headers up; headers + 8 bytes per
  // element down (k = 1 per partition; 16 bytes of dense values without a sparse pull).
  const auto up0 = w.bytes_pushed(), down0 = w.bytes_pulled();
  w.push_pull(nothing.pushes, 0.5f, downlink, replica);
  const std::uint64_t empty_push = is_sparse(codec) ? 0 : 4 * element_bytes(codec);
  EXPECT_EQ(w.bytes_pushed() - up0, 2u * (48 + empty_push) + 2u * 48);  // sparse: 4·48
  EXPECT_EQ(w.bytes_pulled() - down0, sparse_pull ? 2u * (48 + 8) : 2u * (48 + 16));
}

INSTANTIATE_TEST_SUITE_P(CodecsShardsDownlink, DataPlaneDownlink,
                         ::testing::Combine(kPushCodecs, kShardCounts, kDownlinkRatios), param_name);

TEST_F(TwoShards, MalformedFramesCloseOnlyThatConnection) {
  // Wrong magic.
  auto bad = header_bytes(wire::FrameHeader{});
  bad[0] = std::byte{0x00};
  auto [h1, text1] = raw_exchange(s0->port(), bad);
  ASSERT_TRUE(h1.has_value());
  EXPECT_EQ(h1->type, wire::MessageType::kError);
  EXPECT_NE(text1.find("frame magic"), std::string::npos) << text1;

  // A header claiming 2^27 + 1 floats (over the 2^27 limit): refused before allocating.
  wire::FrameHeader huge;
  huge.type = wire::MessageType::kPush;
  huge.job = 42;
  huge.generation = 1;
  huge.codec = wire::Codec::kDenseF32;
  huge.count = (1u << 27) + 1;
  huge.payload_bytes = (1u << 29) + 4;
  auto [h2, text2] = raw_exchange(s0->port(), header_bytes(huge));
  ASSERT_TRUE(h2.has_value());
  EXPECT_NE(text2.find("exceeds the limit"), std::string::npos) << text2;

  // Truncated: half a header, then the peer goes away. No reply, no crash.
  auto half = header_bytes(wire::FrameHeader{});
  half.resize(20);
  auto [h3, text3] = raw_exchange(s0->port(), half);
  EXPECT_FALSE(h3.has_value());

  // Push to a partition this shard does not hold.
  wire::FrameHeader stray;
  stray.type = wire::MessageType::kPush;
  stray.job = 42;
  stray.generation = 1;
  stray.key = 99;
  stray.codec = wire::Codec::kDenseF32;
  stray.count = 1;
  stray.payload_bytes = 4;
  auto bytes = header_bytes(stray);
  bytes.resize(bytes.size() + 4);
  auto [h4, text4] = raw_exchange(s0->port(), bytes);
  ASSERT_TRUE(h4.has_value());
  EXPECT_EQ(text4, "push frame before hello");
  auto [h5, text5] = raw_exchange(s0->port(), after_hello(bytes));
  ASSERT_TRUE(h5.has_value());
  EXPECT_NE(text5.find("partition 99"), std::string::npos) << text5;
  EXPECT_EQ(s0->rejected_connections(), 4u);

  // The shard still serves a well-behaved worker.
  expect_a_worker_is_served(3.0f);
}

TEST(SparseDataPlane, MalformedSparseFramesAreRefusedOverTcp) {
  PsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  auto st = std::make_shared<ShardState>(0.0);
  std::vector<float> x(10, 1.0f);
  st->init(0, x);
  PsServer srv(o, st);
  srv.start();
  auto sparse = [](std::vector<std::uint32_t> idx, std::vector<float> val) {
    const auto n = static_cast<std::uint32_t>(idx.size());
    auto b = header_bytes(test_frame(wire::MessageType::kPush, wire::Codec::kSparseF32, n, n * 8));
    append(b, idx);
    append(b, val);
    return after_hello(b);
  };
  EXPECT_EQ(raw_exchange(srv.port(), sparse({2, 12}, {1, 1})).second,
            "sparse push to partition 0: index 12 out of range [0, 10)");
  EXPECT_EQ(raw_exchange(srv.port(), sparse({3, 3}, {1, 1})).second,
            "sparse push to partition 0: indices must be strictly ascending (3 then 3)");
  EXPECT_EQ(raw_exchange(srv.port(), sparse(std::vector<std::uint32_t>(11, 0), std::vector<float>(11, 0))).second,
            "sparse push to partition 0: count 11 exceeds the partition's 10 values");
  // A push whose scale (learning rate) is NaN would poison every coordinate it touches
  // (found while writing tests/fuzz/fuzz_frame.cpp).
  auto dense_nan = [] {
    auto h = test_frame(wire::MessageType::kPush, wire::Codec::kDenseF32, 10, 40);
    h.scale = std::numeric_limits<float>::quiet_NaN();
    auto b = header_bytes(h);
    append(b, std::vector<float>(10, 1.0f));
    return after_hello(b);
  };
  EXPECT_EQ(raw_exchange(srv.port(), dense_nan()).second, "push to partition 0: scale (learning rate) nan is not finite");
  // An fp16 pull before the dense pull that records what the worker holds, and one with
  // a count, are refused naming the problem.
  const auto pull_half = [](std::uint32_t count) {
    return after_hello(header_bytes(test_frame(wire::MessageType::kPullHalf, wire::Codec::kNone, count, 0)));
  };
  EXPECT_EQ(raw_exchange(srv.port(), pull_half(0)).second, "fp16 pull of partition 0 by worker 0 before any dense pull");
  EXPECT_EQ(raw_exchange(srv.port(), pull_half(3)).second, "pull-fp16 frame count: expected 0, got 3");
  std::vector<float> out(10);
  st->pull(0, out);
  EXPECT_EQ(out, x);
  EXPECT_EQ(srv.rejected_connections(), 6u);
}

TEST(Fp16DataPlane, StepPullsCarryBinary16DifferencesAndDensePullsStayFp32) {
  // Method fp16's downlink over TCP, two shards (partitions of 24 and 5 floats): a step's
  // pull at density 1 is 2 bytes a float, added to the replica; pull(params) is dense.
  const auto layout = make_layout({24, 5}, 24, 2);
  PsShards shards(2, 0.0, layout);
  auto co = PsShards::client_options(0, 1);
  co.half_downlink = true;
  EXPECT_THROW(shards.client(co), ConfigError);  // needs x_seen on the shards
  co.sparse_downlink = true;
  auto w = shards.client(co);
  w.connect();
  std::vector<float> x0(29), replica(29);
  for (int i = 0; i < 29; ++i) x0[i] = 0.1f * static_cast<float>(i);
  w.init(x0);
  w.pull(replica);
  EXPECT_EQ(replica, x0);
  std::vector<float> g(29);
  for (int i = 0; i < 29; ++i) g[i] = 1.0f / static_cast<float>(i + 3);
  const auto down0 = w.bytes_pulled();
  w.push_pull(g, 0.5f, replica);  // the dense push_pull: a step pull, so fp16
  // Two replies: a header and 2 bytes a float each.
  EXPECT_EQ(w.bytes_pulled() - down0, (48u + 2 * 24) + (48u + 2 * 5));
  for (int i = 0; i < 29; ++i) {
    // The shard's x − x_seen is −0.5·g exactly as floats compute it; the replica adds its
    // binary16 rounding.
    const float d = (x0[i] - 0.5f * g[i]) - x0[i];
    EXPECT_EQ(replica[i], x0[i] + compress::half_to_float(compress::float_to_half(d))) << i;
  }
  // A step that pushes zeros (no momentum here: x stays) sends what the rounding left:
  // the replica closes in.
  std::vector<float> x(29);
  const std::vector<float> zeros(29, 0.0f);
  std::vector<float> before = replica;
  w.push_pull(zeros, 0.5f, replica);
  w.pull(x);  // dense fp32: the shard's values
  for (int i = 0; i < 29; ++i) {
    EXPECT_LE(std::fabs(replica[i] - x[i]), std::fabs(before[i] - x[i])) << i;
    EXPECT_NEAR(replica[i], x[i], 1e-6) << i;
  }
}

TEST(LowRankDataPlane, PushAndLowRankPullOverTcp) {
  // A 6 × 4 matrix on one shard, a 5-float bias on the other (partition_size 24). The
  // worker pushes a rank-1 gradient densely and pulls the matrix's difference at rank 1,
  // the bias's (no matrix) by top-k: a rank-1 difference arrives whole at once.
  const auto layout = make_layout({24, 5}, 24, 2);
  PsShards shards(2, 0.0, layout);
  auto co = PsShards::client_options(0, 1);
  co.sparse_downlink = true;
  co.lowrank_downlink = {{1, 6, 4, 1}, {}};
  auto w = shards.client(co);
  w.connect();
  std::vector<float> x0(29, 1.0f), replica(29);
  w.init(x0);
  w.pull(replica);
  std::vector<float> g(29, 0.0f);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 4; ++j) g[i * 4 + j] = static_cast<float>((i + 1) * (j + 1));  // u·vᵀ
  }
  g[26] = 2.0f;
  std::vector<ps::PartitionPush> pushes(2);
  for (const auto& p : layout.partitions) {
    pushes[p.key].codec = wire::Codec::kDenseF32;
    pushes[p.key].count = static_cast<std::uint32_t>(p.length);
    pushes[p.key].first = std::as_bytes(std::span<const float>(g).subspan(p.offset, p.length));
  }
  const auto down0 = w.bytes_pulled();
  w.push_pull(pushes, 0.5f, 0.2, replica);  // 20 %: top-1 of the bias
  for (int i = 0; i < 24; ++i) EXPECT_NEAR(replica[i], 1.0f - 0.5f * g[i], 1e-4) << i;
  EXPECT_EQ(replica[26], 0.0f);
  EXPECT_EQ(replica[25], 1.0f);
  // Down: a low-rank reply (header of 4 words, P 6 + Q 4 floats) and a sparse one (1 pair).
  EXPECT_EQ(w.bytes_pulled() - down0, (48u + 4 * (4 + 10)) + (48u + 8));
  // The shard holds what the replica holds.
  std::vector<float> x(29);
  w.pull(x);
  for (int i = 0; i < 29; ++i) EXPECT_NEAR(replica[i], x[i], 1e-4) << i;
}
