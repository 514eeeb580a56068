// Partitioning, PS shard math, and the PS data plane over real loopback TCP.
#include <array>
#include <cstring>
#include <numeric>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"

using namespace dltrain;
using namespace dltrain::ps;

TEST(Partition, PacksWholeTensorsAndSplitsLargeOnes) {
  // Hand-worked: sizes {3,5,2,10}, P = 6 → [0,3) [3,8) [8,10) [10,15) [15,20).
  auto l = make_layout({3, 5, 2, 10}, 6, 2);
  ASSERT_EQ(l.partitions.size(), 5u);
  const std::int64_t off[] = {0, 3, 8, 10, 15}, len[] = {3, 5, 2, 5, 5};
  for (std::size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(l.partitions[k].key, k);
    EXPECT_EQ(l.partitions[k].offset, off[k]);
    EXPECT_EQ(l.partitions[k].length, len[k]);
  }
  // LPT: keys 1,3,4 (5 each) then 0 (3) then 2 (2) onto the least-loaded shard.
  const int shard[] = {1, 0, 1, 1, 0};
  for (std::size_t k = 0; k < 5; ++k) EXPECT_EQ(l.partitions[k].shard, shard[k]) << "key " << k;
  EXPECT_EQ(l.shard_floats(0), 10);
  EXPECT_EQ(l.shard_floats(1), 10);
  EXPECT_EQ(l.total_floats, 20);
}

TEST(Partition, PacksConsecutiveSmallTensorsTogether) {
  auto l = make_layout({2, 2, 2, 7}, 6, 1);
  ASSERT_EQ(l.partitions.size(), 3u);  // [0,6) [6,10) [10,13) — 7 > 6 splits into 4 + 3
  EXPECT_EQ(l.partitions[0].length, 6);
  EXPECT_EQ(l.partitions[1].length, 4);
  EXPECT_EQ(l.partitions[2].length, 3);
  EXPECT_THROW(make_layout({2, 0}, 6, 1), ConfigError);
  EXPECT_THROW(make_layout({2}, 0, 1), ConfigError);
  EXPECT_THROW(make_layout({2}, 6, 0), ConfigError);
}

TEST(ShardState, AppliesMomentumSgdAsHandComputed) {
  ShardState s(0.5);
  const float x0[] = {1.0f, 2.0f};
  ASSERT_TRUE(s.init(3, x0));
  EXPECT_FALSE(s.init(3, x0));  // first init wins
  const float g1[] = {1.0f, -2.0f};
  s.push(3, g1, 0.1f);  // v = [1, -2]; x = [0.9, 2.2]
  const float g2[] = {1.0f, 0.0f};
  s.push(3, g2, 0.1f);  // v = [1.5, -1]; x = [0.75, 2.3]
  float out[2];
  s.pull(3, out);
  EXPECT_NEAR(out[0], 0.75f, 1e-6);
  EXPECT_NEAR(out[1], 2.3f, 1e-6);
  EXPECT_EQ(s.pushes(), 2u);
  const float wrong[] = {1.0f};
  EXPECT_THROW(s.push(3, wrong, 0.1f), ProtocolError);
  EXPECT_THROW(s.push(4, g1, 0.1f), ProtocolError);
  EXPECT_THROW(s.init(3, wrong), ProtocolError);
}

namespace {

struct TwoShards : ::testing::Test {
  std::shared_ptr<ShardState> st0 = std::make_shared<ShardState>(0.9);
  std::shared_ptr<ShardState> st1 = std::make_shared<ShardState>(0.9);
  std::unique_ptr<PsServer> s0, s1;
  PartitionLayout layout = make_layout({4, 4}, 4, 2);

  void SetUp() override {
    PsServerOptions o;
    o.bind_address = "127.0.0.1";
    o.job = 42;
    o.generation = 1;
    s0 = std::make_unique<PsServer>(o, st0);
    s1 = std::make_unique<PsServer>(o, st1);
    s0->start();
    s1->start();
  }
  std::vector<PsEndpoint> endpoints() const {
    return {{"127.0.0.1", s0->port()}, {"127.0.0.1", s1->port()}};
  }
  PsClient client(std::uint32_t rank, std::uint32_t generation = 1) {
    PsClientOptions o;
    o.job = 42;
    o.generation = generation;
    o.rank = rank;
    o.num_workers = 2;
    o.timeout = std::chrono::milliseconds(5000);
    return PsClient(endpoints(), layout, o);
  }
};

// Sends raw bytes to a port and returns the reply's header (if any) and the text after it.
std::pair<std::optional<wire::FrameHeader>, std::string> raw_exchange(std::uint16_t port, const std::vector<std::byte>& bytes) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(sock, asio::buffer(bytes));
  sock.shutdown(asio::ip::tcp::socket::shutdown_send);
  std::array<std::byte, wire::kHeaderSize> hdr{};
  boost::system::error_code ec;
  asio::read(sock, asio::buffer(hdr), ec);
  if (ec) return {std::nullopt, ""};
  auto h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr));
  std::string text(h.payload_bytes, '\0');
  asio::read(sock, asio::buffer(text), ec);
  return {h, text};
}

std::vector<std::byte> header_bytes(const wire::FrameHeader& h) {
  std::vector<std::byte> b(wire::kHeaderSize);
  wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(b.data(), wire::kHeaderSize));
  return b;
}

}  // namespace

TEST_F(TwoShards, PushAndPullMatchHandComputedValues) {
  ASSERT_EQ(layout.partitions[0].shard, 0);
  ASSERT_EQ(layout.partitions[1].shard, 1);
  auto w0 = client(0);
  auto w1 = client(1);
  w0.connect();
  w1.connect();
  std::vector<float> x0(8);
  std::iota(x0.begin(), x0.end(), 1.0f);  // 1..8
  w0.init(x0);
  std::vector<float> other(8, 100.0f);
  w1.init(other);  // ignored: the shards keep the first values
  std::vector<float> params(8);
  w1.pull(params);
  EXPECT_EQ(params, x0);

  // Worker 0 pushes g = 1 with lr 0.5: v = 1, x = x0 - 0.5.
  std::vector<float> g(8, 1.0f);
  w0.push_pull(g, 0.5f, params);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 0.5f, 1e-6) << i;
  // Worker 1 pushes g = 2 with lr 0.25: v = 0.9·1 + 2 = 2.9, x = x0 - 0.5 - 0.725.
  std::vector<float> g2(8, 2.0f);
  w1.push_pull(g2, 0.25f, params);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 1.225f, 1e-6) << i;
  w0.pull(params);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(params[i], x0[i] - 1.225f, 1e-6) << i;
  EXPECT_EQ(st0->pushes(), 2u);
  EXPECT_EQ(st1->pushes(), 2u);

  // Bytes at the socket, headers included (48-byte headers, 4 floats per partition):
  // w0 sent hello 2·(48+8), init 2·(48+16), push 2·(48+16) + pull 2·48, pull 2·48.
  EXPECT_EQ(w0.bytes_pushed(), 2u * 56 + 2u * 64 + 2u * 64 + 2u * 48 + 2u * 48);
  // and read hello-ack 2·48, two rounds of pull-replies 2·(48+16) each.
  EXPECT_EQ(w0.bytes_pulled(), 2u * 48 + 4u * 64);

  EXPECT_EQ(w0.done(), 1u);
  EXPECT_EQ(w1.workers_done(), 1u);
  EXPECT_EQ(w1.done(), 2u);
}

TEST_F(TwoShards, StaleGenerationIsRefusedWithTheReason) {
  auto stale = client(0, 7);
  try {
    stale.connect();
    FAIL() << "connect with a stale generation succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("frame generation: expected 1, got 7"), std::string::npos) << e.what();
  }
}

TEST_F(TwoShards, MalformedFramesCloseOnlyThatConnection) {
  // Wrong magic.
  auto bad = header_bytes(wire::FrameHeader{});
  bad[0] = std::byte{0x00};
  auto [h1, text1] = raw_exchange(s0->port(), bad);
  ASSERT_TRUE(h1.has_value());
  EXPECT_EQ(h1->type, wire::MessageType::kError);
  EXPECT_NE(text1.find("frame magic"), std::string::npos) << text1;

  // A header claiming 2^27 floats (over the 2^26 limit): refused before allocating.
  wire::FrameHeader huge;
  huge.type = wire::MessageType::kPush;
  huge.job = 42;
  huge.generation = 1;
  huge.codec = wire::Codec::kDenseF32;
  huge.count = 1u << 27;
  huge.payload_bytes = 1u << 29;
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
  EXPECT_NE(text4.find("partition 99"), std::string::npos) << text4;
  EXPECT_EQ(s0->rejected_connections(), 3u);

  // The shard still serves a well-behaved worker.
  auto w = client(0);
  w.connect();
  std::vector<float> x(8, 3.0f), out(8);
  w.init(x);
  w.pull(out);
  EXPECT_EQ(out, x);
}
