// Partitioning, PS shard math, and the PS data plane over real loopback TCP, with its
// authentication handshake.
#include <signal.h>
#include <zlib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/secret.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "support/temp_dir.h"
#include "wire/auth.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace dltrain;
using namespace dltrain::ps;
namespace asio = boost::asio;
using asio::ip::tcp;

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

// The job secret of the tests' job 42 (any 32 bytes do), and another one.
std::vector<std::uint8_t> secret_of(std::uint8_t seed) {
  std::vector<std::uint8_t> s(32);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return s;
}
const std::vector<std::uint8_t> kSecret = secret_of(1);
const std::vector<std::uint8_t> kOtherSecret = secret_of(2);

// The worker's side of the handshake on a raw socket: reads the challenge and returns
// the answer bytes for `secret`, `job` and `generation` (not yet sent).
std::array<std::uint8_t, wire::kAnswerSize> answer_for(tcp::socket& sock, const std::vector<std::uint8_t>& secret,
                                                       std::uint64_t job, std::uint32_t generation) {
  std::array<std::uint8_t, wire::kChallengeSize> c{};
  asio::read(sock, asio::buffer(c));
  wire::AuthAnswer a;
  a.job = job;
  a.generation = generation;
  a.nonce = wire::random_nonce();
  a.mac = wire::auth_mac(secret, wire::decode_challenge(c), job, generation, wire::kWorkerContext);
  std::array<std::uint8_t, wire::kAnswerSize> out{};
  wire::encode_answer(a, out);
  return out;
}

// Authenticates a raw socket as a worker of job 42, generation 1, and reads the proof.
void authenticate(tcp::socket& sock) {
  asio::write(sock, asio::buffer(answer_for(sock, kSecret, 42, 1)));
  std::array<std::uint8_t, wire::kProofSize> proof{};
  asio::read(sock, asio::buffer(proof));
}

// What the PS sends on a socket until it closes it, waiting at most `timeout`; nullopt
// when the socket is still open after that.
std::optional<std::vector<std::uint8_t>> read_until_closed(asio::io_context& io, tcp::socket& sock,
                                                            std::chrono::milliseconds timeout) {
  std::vector<std::uint8_t> got;
  std::array<std::uint8_t, 4096> buf{};
  bool closed = false;
  std::function<void()> next = [&] {
    sock.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      got.insert(got.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
      if (ec) {
        closed = true;  // EOF, or a reset because the PS closed with our bytes unread
        return;
      }
      next();
    });
  };
  io.restart();
  next();
  io.run_for(timeout);
  if (!closed) {
    sock.cancel();
    io.restart();
    io.poll();
    return std::nullopt;
  }
  return got;
}

std::vector<std::byte> header_bytes(const wire::FrameHeader& h) {
  std::vector<std::byte> b(wire::kHeaderSize);
  wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(b.data(), wire::kHeaderSize));
  return b;
}

// A hello from worker 0 of 1 for job 42, generation 1, then `rest`.
std::vector<std::byte> after_hello(const std::vector<std::byte>& rest) {
  wire::FrameHeader h;
  h.type = wire::MessageType::kHello;
  h.job = 42;
  h.generation = 1;
  h.codec = wire::Codec::kBytes;
  h.count = 8;
  h.payload_bytes = 8;
  auto b = header_bytes(h);
  const std::uint32_t hello[2] = {0, 1};
  const auto* p = reinterpret_cast<const std::byte*>(hello);
  b.insert(b.end(), p, p + 8);
  b.insert(b.end(), rest.begin(), rest.end());
  return b;
}

template <typename T>
void append(std::vector<std::byte>& b, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  b.insert(b.end(), p, p + v.size() * sizeof(T));
}

// A hello, then an init of partition `key` with `n` floats of 1.0: frames that would
// change the shard if it read them.
std::vector<std::byte> hello_and_init(std::uint32_t key, std::uint32_t n) {
  wire::FrameHeader h;
  h.type = wire::MessageType::kInit;
  h.job = 42;
  h.generation = 1;
  h.key = key;
  h.codec = wire::Codec::kDenseF32;
  h.count = n;
  h.payload_bytes = 4 * n;
  auto b = header_bytes(h);
  append(b, std::vector<float>(n, 1.0f));
  return after_hello(b);
}

// rejected_connections() of `s` once it reaches `n` or 10 s have passed: a client that
// fails on one shard closes its other connections, which those shards then count.
std::uint64_t rejected_after(const PsServer& s, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.rejected_connections() < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.rejected_connections();
}

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
    o.secret = kSecret;
    o.handshake_timeout = std::chrono::milliseconds(2000);
    s0 = std::make_unique<PsServer>(o, st0);
    s1 = std::make_unique<PsServer>(o, st1);
    s0->start();
    s1->start();
  }
  std::vector<PsEndpoint> endpoints() const {
    return {{"127.0.0.1", s0->port()}, {"127.0.0.1", s1->port()}};
  }
  PsClient client(std::uint32_t rank, std::uint32_t generation = 1, const std::vector<std::uint8_t>& secret = kSecret) {
    PsClientOptions o;
    o.job = 42;
    o.generation = generation;
    o.secret = secret;
    o.rank = rank;
    o.num_workers = 2;
    o.timeout = std::chrono::milliseconds(5000);
    return PsClient(endpoints(), layout, o);
  }
};

// Authenticates as a worker of job 42, generation 1, sends raw bytes and returns the
// first error frame's header (skipping other replies) and its text; nullopt when the PS
// closes without one.
std::pair<std::optional<wire::FrameHeader>, std::string> raw_exchange(std::uint16_t port, const std::vector<std::byte>& bytes) {
  asio::io_context io;
  tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  authenticate(sock);
  asio::write(sock, asio::buffer(bytes));
  sock.shutdown(tcp::socket::shutdown_send);
  for (;;) {
    std::array<std::byte, wire::kHeaderSize> hdr{};
    boost::system::error_code ec;
    asio::read(sock, asio::buffer(hdr), ec);
    if (ec) return {std::nullopt, ""};
    auto h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr));
    std::string text(h.payload_bytes, '\0');
    asio::read(sock, asio::buffer(text), ec);
    if (h.type == wire::MessageType::kError) return {h, text};
  }
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

  // Bytes at the socket, handshakes and headers included (48-byte headers, 4 floats per
  // partition): w0 sent the handshake answer 2·88, hello 2·(48+8), init 2·(48+16),
  // push 2·(48+16) + pull 2·48, pull 2·48.
  EXPECT_EQ(w0.bytes_pushed(), 2u * 88 + 2u * 56 + 2u * 64 + 2u * 64 + 2u * 48 + 2u * 48);
  // and read challenge and proof 2·(40+40), hello-ack 2·48, two rounds of pull-replies
  // 2·(48+16) each.
  EXPECT_EQ(w0.bytes_pulled(), 2u * 80 + 2u * 48 + 4u * 64);
  EXPECT_EQ(s0->rejected_connections(), 0u);

  EXPECT_EQ(w0.done(), 1u);
  EXPECT_EQ(w1.workers_done(), 1u);
  EXPECT_EQ(w1.done(), 2u);
}

TEST_F(TwoShards, StaleGenerationIsRefusedBeforeItsFirstFrame) {
  // A task of generation 0 that knows the job secret: the shards (generation 1) refuse it
  // in the handshake, so its hello is never read.
  auto stale = client(0, 0);
  try {
    stale.connect();
    FAIL() << "connect with a stale generation succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this worker (job 42 generation 0) in the authentication handshake"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(rejected_after(*s0, 1), 1u);
  EXPECT_EQ(rejected_after(*s1, 1), 1u);

  // The same on a raw socket, with frames sent right behind the answer: the shard closes
  // the connection without a proof or any reply, and the init never reaches the state.
  const auto in0 = s0->bytes_in();
  asio::io_context io;
  tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), s0->port()});
  auto answer = answer_for(sock, kSecret, 42, 0);
  auto frames = hello_and_init(0, 4);
  asio::write(sock, std::array{asio::buffer(answer), asio::buffer(frames)});
  auto got = read_until_closed(io, sock, std::chrono::seconds(10));
  ASSERT_TRUE(got.has_value()) << "the shard did not close a stale task's connection";
  EXPECT_TRUE(got->empty()) << got->size() << " bytes sent to a stale task";
  EXPECT_EQ(s0->rejected_connections(), 2u);
  EXPECT_EQ(s0->bytes_in() - in0, wire::kAnswerSize);  // the answer, not one byte of a frame
  EXPECT_EQ(st0->num_partitions(), 0u);

  // An authenticated worker of this generation whose frame claims another one is still
  // refused at the frame.
  wire::FrameHeader h;
  h.type = wire::MessageType::kQuery;
  h.job = 42;
  h.generation = 7;
  auto [eh, text] = raw_exchange(s0->port(), header_bytes(h));
  ASSERT_TRUE(eh.has_value());
  EXPECT_EQ(text, "frame generation: expected 1, got 7 (a stale task?)");

  // A worker of the right generation is served.
  auto w = client(0);
  w.connect();
  std::vector<float> x(8, 3.0f), out(8);
  w.init(x);
  w.pull(out);
  EXPECT_EQ(out, x);
}

TEST_F(TwoShards, WrongSecretIsClosedBeforeItsFirstFrameIsRead) {
  auto stranger = client(0, 1, kOtherSecret);
  EXPECT_THROW(stranger.connect(), IoError);
  EXPECT_EQ(rejected_after(*s0, 1), 1u);
  EXPECT_EQ(rejected_after(*s1, 1), 1u);

  // Raw: an answer made with the wrong secret, a hello and an init right behind it.
  const auto in0 = s0->bytes_in();
  asio::io_context io;
  tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), s0->port()});
  auto answer = answer_for(sock, kOtherSecret, 42, 1);
  auto frames = hello_and_init(0, 4);
  asio::write(sock, std::array{asio::buffer(answer), asio::buffer(frames)});
  auto got = read_until_closed(io, sock, std::chrono::seconds(10));
  ASSERT_TRUE(got.has_value()) << "the shard did not close the connection";
  EXPECT_TRUE(got->empty()) << got->size() << " bytes sent to a peer without the secret";
  EXPECT_EQ(s0->rejected_connections(), 2u);
  EXPECT_EQ(s0->bytes_in() - in0, wire::kAnswerSize);
  EXPECT_EQ(st0->num_partitions(), 0u);

  // A replayed answer: valid for the nonce of an earlier connection, not for this one.
  tcp::socket first(io), second(io);
  first.connect({asio::ip::make_address("127.0.0.1"), s1->port()});
  const auto recorded = answer_for(first, kSecret, 42, 1);
  second.connect({asio::ip::make_address("127.0.0.1"), s1->port()});
  std::array<std::uint8_t, wire::kChallengeSize> challenge{};
  asio::read(second, asio::buffer(challenge));
  asio::write(second, asio::buffer(recorded));
  auto replay = read_until_closed(io, second, std::chrono::seconds(10));
  ASSERT_TRUE(replay.has_value());
  EXPECT_TRUE(replay->empty());
  EXPECT_EQ(s1->rejected_connections(), 2u);
  first.close();

  EXPECT_EQ(st0->num_partitions(), 0u);
  EXPECT_EQ(st1->num_partitions(), 0u);
}

TEST_F(TwoShards, GarbageOrAbsentAnswersAreClosedWithinTheTimeout) {
  asio::io_context io;
  const auto addr = asio::ip::make_address("127.0.0.1");
  // 1. Reads the challenge, then says nothing: closed after the 2 s handshake timeout.
  {
    tcp::socket sock(io);
    sock.connect({addr, s0->port()});
    std::array<std::uint8_t, wire::kChallengeSize> c{};
    asio::read(sock, asio::buffer(c));
    EXPECT_NO_THROW(wire::decode_challenge(c));
    auto got = read_until_closed(io, sock, std::chrono::seconds(15));
    ASSERT_TRUE(got.has_value()) << "a silent peer was not closed";
    EXPECT_TRUE(got->empty());
    EXPECT_EQ(s0->rejected_connections(), 1u);
  }
  // 2. A worker that skips the handshake and sends its hello (56 bytes, less than an
  // answer): no hello-ack, closed at the timeout.
  {
    const auto in0 = s0->bytes_in();
    tcp::socket sock(io);
    sock.connect({addr, s0->port()});
    auto hello = after_hello({});
    asio::write(sock, asio::buffer(hello));
    auto got = read_until_closed(io, sock, std::chrono::seconds(15));
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->size(), wire::kChallengeSize) << "the shard sent more than its challenge";
    EXPECT_EQ(s0->rejected_connections(), 2u);
    // The shard counts the hello's bytes when its cancelled read completes, which may be
    // just after the close: wait for it (bounded), so that case 3 starts from settled counters.
    for (int i = 0; i < 200 && s0->bytes_in() - in0 < hello.size(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(s0->bytes_in() - in0, hello.size());
  }
  // 3. 88 bytes of garbage, then a well-formed hello and init: refused at once; the
  // shard read the 88 bytes and nothing of the frames.
  {
    const auto in0 = s0->bytes_in();
    tcp::socket sock(io);
    sock.connect({addr, s0->port()});
    std::vector<std::byte> bytes(wire::kAnswerSize, std::byte{0x5a});
    auto frames = hello_and_init(0, 4);
    bytes.insert(bytes.end(), frames.begin(), frames.end());
    asio::write(sock, asio::buffer(bytes));
    auto got = read_until_closed(io, sock, std::chrono::seconds(15));
    ASSERT_TRUE(got.has_value());
    EXPECT_LE(got->size(), wire::kChallengeSize);  // the challenge, if it was not reset first
    EXPECT_EQ(s0->rejected_connections(), 3u);
    EXPECT_EQ(s0->bytes_in() - in0, wire::kAnswerSize);
  }
  // 4. Connects and leaves at once.
  {
    tcp::socket sock(io);
    sock.connect({addr, s0->port()});
    sock.close();
    EXPECT_EQ(rejected_after(*s0, 4), 4u);
  }
  EXPECT_EQ(st0->num_partitions(), 0u);
  // The shard carries on.
  auto w = client(0);
  w.connect();
  std::vector<float> x(8, 2.0f), out(8);
  w.init(x);
  w.pull(out);
  EXPECT_EQ(out, x);
}

TEST(DataPlaneAuth, SecretsShorterThan32BytesAreRefused) {
  PsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.secret.assign(31, 7);
  PsServer srv(o, std::make_shared<ShardState>(0.0));
  try {
    srv.start();
    FAIL() << "a shard started with a 31-byte secret";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "secret: the job secret must have at least 32 bytes, got 31");
  }
  PsClientOptions co;
  EXPECT_THROW(PsClient({{"127.0.0.1", 1}}, make_layout({4}, 4, 1), co), ConfigError);  // no secret at all
}

TEST(DataPlaneAuth, AShardWithoutTheSecretIsNotTrusted) {
  // A listener that speaks the handshake but does not know the secret: it signs its
  // proof with another key. The worker refuses it before sending any frame.
  asio::io_context srv_io;
  tcp::acceptor acc(srv_io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acc.local_endpoint().port();
  std::size_t frame_bytes_seen = 0;
  std::thread impostor([&] {
    tcp::socket sock(srv_io);
    acc.async_accept(sock, [&](boost::system::error_code ec) {
      if (ec) return;
      auto buf = std::make_shared<std::array<std::uint8_t, wire::kAnswerSize>>();
      auto c = std::make_shared<std::array<std::uint8_t, wire::kChallengeSize>>();
      auto nonce = wire::random_nonce();
      wire::encode_challenge(nonce, *c);
      asio::write(sock, asio::buffer(*c));
      asio::async_read(sock, asio::buffer(*buf), [&, buf](boost::system::error_code ec2, std::size_t) {
        if (ec2) return;
        const auto a = wire::decode_answer(*buf);
        std::array<std::uint8_t, wire::kProofSize> p{};
        wire::encode_proof(wire::auth_mac(kOtherSecret, a.nonce, a.job, a.generation, wire::kShardContext), p);
        asio::write(sock, asio::buffer(p));
        auto rest = std::make_shared<std::array<std::uint8_t, 256>>();
        sock.async_read_some(asio::buffer(*rest), [&, rest](boost::system::error_code, std::size_t n) {
          frame_bytes_seen = n;
        });
      });
    });
    srv_io.run_for(std::chrono::seconds(10));
  });
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  o.timeout = std::chrono::milliseconds(5000);
  {
    PsClient w({{"127.0.0.1", port}}, make_layout({4}, 4, 1), o);
    try {
      w.connect();
      FAIL() << "trusted a shard without the secret";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("failed to prove that it knows the job secret: it is not a PS shard of "
                                           "job 42 generation 1"),
                std::string::npos)
          << e.what();
    }
  }  // the client's socket is closed, so the impostor's read ends
  impostor.join();
  EXPECT_EQ(frame_bytes_seen, 0u) << "the worker sent frames to an unproven shard";
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
  EXPECT_EQ(text4, "push frame before hello");
  auto [h5, text5] = raw_exchange(s0->port(), after_hello(bytes));
  ASSERT_TRUE(h5.has_value());
  EXPECT_NE(text5.find("partition 99"), std::string::npos) << text5;
  EXPECT_EQ(s0->rejected_connections(), 4u);

  // The shard still serves a well-behaved worker.
  auto w = client(0);
  w.connect();
  std::vector<float> x(8, 3.0f), out(8);
  w.init(x);
  w.pull(out);
  EXPECT_EQ(out, x);
}

TEST(SparseDataPlane, SparsePushAndDownlinkOverTcpAsHandComputed) {
  // Momentum 0 (DGC: momentum lives at the workers). Two shards, partitions {4, 4}.
  PsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  auto st0 = std::make_shared<ShardState>(0.0), st1 = std::make_shared<ShardState>(0.0);
  PsServer s0(o, st0), s1(o, st1);
  s0.start();
  s1.start();
  auto layout = make_layout({4, 4}, 4, 2);
  PsClientOptions co;
  co.job = 42;
  co.generation = 1;
  co.secret = kSecret;
  co.num_workers = 1;
  co.timeout = std::chrono::milliseconds(5000);
  co.sparse_downlink = true;
  PsClient w({{"127.0.0.1", s0.port()}, {"127.0.0.1", s1.port()}}, layout, co);
  w.connect();
  std::vector<float> x0{1, 2, 3, 4, 5, 6, 7, 8}, replica(8);
  w.init(x0);
  w.pull(replica);  // dense: the shards now know this worker holds x0
  ASSERT_EQ(replica, x0);
  // Partition 0: +2 at local 1; partition 1: +1 at local 0 and -1 at local 3; lr 0.5.
  std::vector<std::uint32_t> i0{1}, i1{0, 3};
  std::vector<float> v0{2}, v1{1, -1};
  std::vector<PartitionPush> pushes(2);
  pushes[0] = {wire::Codec::kSparseF32, 1, std::as_bytes(std::span(i0)), std::as_bytes(std::span(v0)), 0};
  pushes[1] = {wire::Codec::kSparseF32, 2, std::as_bytes(std::span(i1)), std::as_bytes(std::span(v1)), 0};
  // x = [1, 1, 3, 4 | 4.5, 6, 7, 8.5]; downlink 25% → the top-1 difference per partition:
  // -1 at index 1 and, of the tied ±0.5, the lower index 4.
  w.push_pull(pushes, 0.5f, 0.25, replica);
  EXPECT_EQ(replica, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8}));
  // Nothing new pushed: the next pull delivers the remaining +0.5 at index 7.
  pushes[0] = {wire::Codec::kSparseF32, 0, {}, {}, 0};
  pushes[1] = {wire::Codec::kSparseF32, 0, {}, {}, 0};
  w.push_pull(pushes, 0.5f, 0.25, replica);
  EXPECT_EQ(replica, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8.5f}));
  std::vector<float> x(8);
  w.pull(x);
  EXPECT_EQ(x, (std::vector<float>{1, 1, 3, 4, 4.5f, 6, 7, 8.5f}));
  // Bytes of a sparse exchange: push headers + 8 bytes per element, pull headers up;
  // headers + 8 bytes per element down.
  const auto up0 = w.bytes_pushed(), down0 = w.bytes_pulled();
  w.push_pull(pushes, 0.5f, 0.25, replica);
  EXPECT_EQ(w.bytes_pushed() - up0, 4u * 48);
  EXPECT_EQ(w.bytes_pulled() - down0, 2u * (48 + 8));
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
    wire::FrameHeader h;
    h.type = wire::MessageType::kPush;
    h.job = 42;
    h.generation = 1;
    h.codec = wire::Codec::kSparseF32;
    h.count = static_cast<std::uint32_t>(idx.size());
    h.payload_bytes = h.count * 8;
    auto b = header_bytes(h);
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
  std::vector<float> out(10);
  st->pull(0, out);
  EXPECT_EQ(out, x);
  EXPECT_EQ(srv.rejected_connections(), 3u);
}

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// A PS shard played by the test: it answers exactly when the test says so. Accepting and
// reading are bounded by `timeout` and report whether they completed.
struct ScriptedShard {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  tcp::socket sock{io};

  std::uint16_t port() const { return acceptor.local_endpoint().port(); }

  bool run(std::chrono::seconds timeout, const bool& done) {
    io.restart();
    io.run_for(timeout);
    return done;
  }
  bool accept(std::chrono::seconds timeout) {
    bool done = false;
    acceptor.async_accept(sock, [&](boost::system::error_code ec) { done = !ec; });
    return run(timeout, done);
  }
  // The shard's side of the authentication handshake for job 42, generation 1: sends a
  // challenge, reads the worker's answer and proves knowledge of kSecret.
  bool handshake(std::chrono::seconds timeout) {
    const auto nonce = wire::random_nonce();
    std::array<std::uint8_t, wire::kChallengeSize> c{};
    wire::encode_challenge(nonce, c);
    asio::write(sock, asio::buffer(c));
    std::array<std::uint8_t, wire::kAnswerSize> a{};
    bool done = false;
    asio::async_read(sock, asio::buffer(a), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
    if (!run(timeout, done)) return false;
    const auto answer = wire::decode_answer(a);
    if (!wire::macs_equal(answer.mac, wire::auth_mac(kSecret, nonce, 42, 1, wire::kWorkerContext))) return false;
    std::array<std::uint8_t, wire::kProofSize> proof{};
    wire::encode_proof(wire::auth_mac(kSecret, answer.nonce, 42, 1, wire::kShardContext), proof);
    asio::write(sock, asio::buffer(proof));
    return true;
  }
  // Reads one frame; its payload goes to `payload`.
  std::optional<wire::FrameHeader> read_frame(std::chrono::seconds timeout, std::vector<std::byte>* payload = nullptr) {
    std::array<std::byte, wire::kHeaderSize> hdr{};
    bool done = false;
    asio::async_read(sock, asio::buffer(hdr), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
    if (!run(timeout, done)) return std::nullopt;
    auto h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr));
    std::vector<std::byte> body(h.payload_bytes);
    done = body.empty();
    if (!done) {
      asio::async_read(sock, asio::buffer(body), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
      if (!run(timeout, done)) return std::nullopt;
    }
    if (payload != nullptr) *payload = std::move(body);
    return h;
  }
  void write_frame(wire::FrameHeader h, const std::vector<float>& values = {}) {
    h.job = 42;
    h.generation = 1;
    auto b = header_bytes(h);
    append(b, values);
    asio::write(sock, asio::buffer(b));
  }
};

}  // namespace

// The client's timeout bounds the shards' silence: a PS that never answers fails the
// call with TimeoutError naming it.
TEST(PsClientTimeout, AShardThatNeverAnswersFailsTheCall) {
  ScriptedShard shard;  // listens (the kernel completes the connection) but never replies
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.timeout = std::chrono::milliseconds(300);
  o.secret = kSecret;
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  try {
    client.connect();
    FAIL() << "connect succeeded against a silent shard";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), "PS authentication handshake: no reply for 300 ms");
  }
}

// A worker asked to stop (its SIGTERM handler sets the flag) gives up a call on a silent
// shard at once, with StopRequested, not after its PS timeout: it must save its replica
// within its agent's stop grace.
TEST(PsClientStop, AStopRequestEndsACallOnASilentShardWellBeforeTheTimeout) {
  using namespace std::chrono_literals;
  ScriptedShard shard;  // accepts (the kernel does) but never answers
  std::atomic<bool> stop{false};
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.timeout = std::chrono::milliseconds(60000);
  o.secret = kSecret;
  o.stop_requested = &stop;
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(client.connect(), StopRequested);
  const auto waited = std::chrono::steady_clock::now() - t0;
  stopper.join();
  // 300 ms until the flag, then one 100 ms slice at most; far below the 60 s timeout.
  EXPECT_LT(waited, 5s);
  EXPECT_GE(waited, 300ms);
}

// The same while resync() backs off against a shard that is gone (its port refuses).
TEST(PsClientStop, AStopRequestEndsResyncWhileTheShardIsGone) {
  using namespace std::chrono_literals;
  auto srv = std::make_unique<ScriptedShard>();
  const auto port = srv->port();
  srv.reset();  // nothing listens there any more
  std::atomic<bool> stop{true};
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.timeout = 1000ms;
  o.reconnect_timeout = 60000ms;
  o.secret = kSecret;
  o.stop_requested = &stop;
  PsClient client({{"127.0.0.1", port}}, make_layout({4}, 4, 1), o);
  std::vector<float> params(4, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(client.resync(params), StopRequested);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// A worker suspended (SIGSTOP, as a straggler or a paused VM is) while it waits for a
// pull reply, and kept stopped past its PS timeout while the reply sits in its socket,
// takes that reply when it resumes: the time it did not run is not the PS's silence.
TEST(PsClientTimeout, AWorkerSuspendedPastItsTimeoutTakesTheReplyWaitingForIt) {
  using namespace std::chrono_literals;
  dltrain::testing::TempDir dir("dltrain-ps");
  ScriptedShard shard;
  const std::string out = (dir.path / "child.out").string();
  const std::string exe = std::string(DLTRAIN_BIN_DIR) + "/ps_client_child";
  const std::string secret_file = (dir.path / "job.secret").string();
  write_private_file(secret_file, to_hex(kSecret) + "\n");
  dltrain::testing::Background child(exe + " " + std::to_string(shard.port()) + " 500 " + secret_file, out);
  auto child_output = [&] {
    std::string s;
    for (const auto& l : child.lines()) s += l + "\n";
    return s;
  };

  ASSERT_TRUE(shard.accept(30s)) << "the child never connected: " << child_output();
  ASSERT_TRUE(shard.handshake(30s)) << "the child did not prove the secret: " << child_output();
  std::vector<std::byte> hello;
  auto h = shard.read_frame(30s, &hello);
  ASSERT_TRUE(h && h->type == wire::MessageType::kHello && hello.size() == 8) << child_output();
  std::uint32_t rank_of[2];
  std::memcpy(rank_of, hello.data(), 8);
  EXPECT_EQ(rank_of[0], 0u);  // worker 0
  EXPECT_EQ(rank_of[1], 1u);  // of 1
  wire::FrameHeader ack;
  ack.type = wire::MessageType::kHelloAck;
  ack.seq = h->seq;
  ack.count = 1;
  shard.write_frame(ack);
  auto pull = shard.read_frame(30s);
  ASSERT_TRUE(pull && pull->type == wire::MessageType::kPull && pull->key == 0) << child_output();

  // The child now waits in its pull. Stop it, answer, and keep it stopped for three
  // times its 500 ms timeout.
  const int pid = child.pid();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  for (int i = 0; i < 100 && dltrain::testing::process_state(pid) != 'T'; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_EQ(dltrain::testing::process_state(pid), 'T') << "the child did not stop";
  wire::FrameHeader reply;
  reply.type = wire::MessageType::kPullReply;
  reply.seq = pull->seq;
  reply.key = 0;
  reply.codec = wire::Codec::kDenseF32;
  reply.count = 4;
  reply.payload_bytes = 16;
  shard.write_frame(reply, {1.5f, -2.0f, 3.25f, 4.0f});
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(kill(pid, SIGCONT), 0);

  EXPECT_EQ(child.wait(30), 0) << child_output();
  const auto lines = child.lines();
  ASSERT_EQ(lines.size(), 1u) << child_output();
  EXPECT_EQ(lines[0], "1.5 -2 3.25 4");
}

// ---- Checkpoints of a shard's state (ps/checkpoint.h) and recovery after a restart.

namespace {

std::vector<std::byte> slurp_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// The reason a checkpoint file is refused ("" when it is accepted).
std::string refusal(const std::filesystem::path& p, std::uint64_t job = 42, std::uint32_t shard = 3) {
  try {
    read_checkpoint_file(p.string(), job, shard);
    return "";
  } catch (const ProtocolError& e) {
    return e.what();
  }
}

// A shard state with momentum 0.5: partition 7 = {1, 2} after one push of g = {1, -2}
// at lr 0.1 (v = {1, -2}, x = {0.9, 2.2}); partition 9 = {5, 6, 7} untouched; worker 1
// finished.
std::shared_ptr<ShardState> sample_state() {
  auto s = std::make_shared<ShardState>(0.5);
  const float a[] = {1.0f, 2.0f}, b[] = {5.0f, 6.0f, 7.0f}, g[] = {1.0f, -2.0f};
  s->init(7, a);
  s->init(9, b);
  s->push(7, g, 0.1f);
  s->mark_done(1);
  return s;
}

}  // namespace

TEST(Checkpoint, RoundTripRestoresParametersMomentumAndFinishedWorkers) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  ShardCheckpointer cp(path.string(), 42, 3, sample_state());
  ASSERT_TRUE(cp.save());
  EXPECT_EQ(cp.saves(), 1u);
  // Size by hand: 40-byte header, one finished rank (4), partition 7: 16 + 4·(2 + 2),
  // partition 9: 16 + 4·(3 + 3), CRC 4.
  const auto bytes = slurp_bytes(path);
  EXPECT_EQ(bytes.size(), 40u + 4 + (16 + 16) + (16 + 24) + 4);
  EXPECT_EQ(cp.last_bytes(), bytes.size());
  EXPECT_EQ(std::memcmp(bytes.data(), "DLCK", 4), 0);
  // The trailer is zlib's CRC-32 of everything before it.
  std::uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(crc, crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  // No temporary file is left behind.
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));

  auto snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  ShardState restored(0.5);
  restored.restore(std::move(*snap));
  EXPECT_EQ(restored.num_partitions(), 2u);
  EXPECT_EQ(restored.pushes(), 1u);
  EXPECT_EQ(restored.done_count(), 1u);
  EXPECT_EQ(restored.mark_done(1), 1u);  // the same worker again: still one
  float x7[2], x9[3];
  restored.pull(7, x7);
  restored.pull(9, x9);
  EXPECT_FLOAT_EQ(x7[0], 0.9f);
  EXPECT_FLOAT_EQ(x7[1], 2.2f);
  EXPECT_FLOAT_EQ(x9[0], 5.0f);
  EXPECT_FLOAT_EQ(x9[1], 6.0f);
  EXPECT_FLOAT_EQ(x9[2], 7.0f);
  // The momentum buffer came back too: g = {1, 0} at lr 0.1 gives v = 0.5·{1, -2} + {1, 0}
  // = {1.5, -1} and x = {0.9 − 0.15, 2.2 + 0.1} = {0.75, 2.3}.
  const float g2[] = {1.0f, 0.0f};
  restored.push(7, g2, 0.1f);
  restored.pull(7, x7);
  EXPECT_NEAR(x7[0], 0.75f, 1e-6);
  EXPECT_NEAR(x7[1], 2.3f, 1e-6);
  // A shard with another momentum setting refuses the state rather than misapply it.
  auto again = read_checkpoint_file(path.string(), 42, 3);
  ShardState no_momentum(0.0);
  EXPECT_THROW(no_momentum.restore(std::move(*again)), ProtocolError);
}

TEST(Checkpoint, NoFileMeansNoCheckpointAndAnEmptyStateIsNotWritten) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  EXPECT_FALSE(read_checkpoint_file(path.string(), 42, 3).has_value());
  ShardCheckpointer cp(path.string(), 42, 3, std::make_shared<ShardState>(0.9));
  EXPECT_FALSE(cp.save());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Checkpoint, TruncatedAndCorruptedFilesAreRefusedWithTheReason) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  ShardCheckpointer cp(path.string(), 42, 3, sample_state());
  ASSERT_TRUE(cp.save());
  const auto good = slurp_bytes(path);
  EXPECT_EQ(refusal(path), "");

  auto cut = good;
  cut.resize(good.size() - 1);  // the last byte of the CRC missing
  write_bytes(path, cut);
  EXPECT_NE(refusal(path).find("checksum mismatch"), std::string::npos) << refusal(path);
  cut.resize(20);  // not even a header
  write_bytes(path, cut);
  EXPECT_NE(refusal(path).find("(truncated)"), std::string::npos) << refusal(path);
  write_bytes(path, {});
  EXPECT_NE(refusal(path).find("(truncated)"), std::string::npos) << refusal(path);

  auto flipped = good;
  flipped[40 + 4 + 16 + 1] ^= std::byte{0x01};  // one bit of partition 7's first value
  write_bytes(path, flipped);
  EXPECT_NE(refusal(path).find("checksum mismatch"), std::string::npos) << refusal(path);
  flipped = good;
  flipped[0] ^= std::byte{0xFF};
  write_bytes(path, flipped);
  EXPECT_NE(refusal(path).find("not a dltrain PS checkpoint"), std::string::npos) << refusal(path);

  write_bytes(path, good);
  EXPECT_NE(refusal(path, 43, 3).find("written by shard 3 of job 42, this is shard 3 of job 43"), std::string::npos)
      << refusal(path, 43, 3);
  EXPECT_NE(refusal(path, 42, 0).find("this is shard 0 of job 42"), std::string::npos);
}

TEST(Checkpoint, LengthsAreCheckedAgainstTheFileBeforeAnyAllocation) {
  // A file whose checksum is right but whose lengths lie: a partition of 2^26 values in
  // a 100-byte file, and 2^31 partitions. Each is refused with the reason, nothing huge
  // is allocated.
  auto with_crc = [](std::vector<std::byte> b) {
    const auto crc = static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data()),
                                                      static_cast<uInt>(b.size())));
    b.resize(b.size() + 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  auto bytes = encode_checkpoint(ShardSnapshot{{{5, {1.0f, 2.0f}, {}}}, {}, 0}, 42, 3);
  bytes.resize(bytes.size() - 4);  // without its CRC
  auto huge = bytes;
  const std::uint32_t n = 1u << 26;
  std::memcpy(huge.data() + 40 + 4, &n, 4);  // partition length
  try {
    decode_checkpoint(with_crc(huge), 42, 3);
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("partition 5: 268435456 bytes of values, only 8 left"), std::string::npos)
        << e.what();
  }
  auto many = bytes;
  const std::uint32_t parts = 1u << 31;
  std::memcpy(many.data() + 20, &parts, 4);
  try {
    decode_checkpoint(with_crc(many), 42, 3);
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("2147483648 partitions do not fit in the 24 bytes left"), std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, AStaleTemporaryFileDoesNotBreakLoadingOrTheNextSave) {
  // A crash between writing the temporary file and renaming it leaves "<path>.tmp"
  // behind, possibly half written; the checkpoint at <path> is the previous one.
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  auto state = sample_state();
  ShardCheckpointer cp(path.string(), 42, 3, state);
  ASSERT_TRUE(cp.save());
  write_bytes(path.string() + ".tmp", std::vector<std::byte>(1000, std::byte{0xAB}));
  auto snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->partitions.size(), 2u);
  // The next save overwrites the stale file and renames it into place.
  state->mark_done(0);
  ASSERT_TRUE(cp.save());
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->done, (std::vector<std::uint32_t>{0, 1}));
}

TEST(Checkpoint, AFinishedWorkerIsCheckpointedBeforeItsDoneIsAcknowledged) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  auto state = std::make_shared<ShardState>(0.9);
  auto cp = std::make_shared<ShardCheckpointer>(path.string(), 42, 0, state);
  PsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  o.on_done = [cp] { cp->save(); };
  PsServer server(o, state);
  server.start();
  PsClientOptions co;
  co.job = 42;
  co.generation = 1;
  co.secret = kSecret;
  co.rank = 1;
  co.num_workers = 2;
  co.timeout = std::chrono::milliseconds(5000);
  PsClient c(std::vector<PsEndpoint>{{"127.0.0.1", server.port()}}, make_layout({4}, 4, 1), co);
  c.connect();
  c.init(std::vector<float>{1, 2, 3, 4});
  EXPECT_EQ(c.done(), 1u);
  // By the time the acknowledgement arrived, the file said so.
  auto snap = read_checkpoint_file(path.string(), 42, 0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->done, std::vector<std::uint32_t>{1});
}

// A worker's replica: every partition of the layout in the checkpoint format (shard
// kWorkerReplicaShard, no momentum), read back into the same places of the flat vector.
TEST(WorkerReplica, RoundTripPutsEveryPartitionBackAtItsOffset) {
  dltrain::testing::TempDir dir;
  const auto path = (dir.path / "replica.ckpt").string();
  // Tensors of 3, 2 and 5 floats, partitions of at most 4 floats over 2 shards:
  // {3}, {2}, and the 5 cut into 3 + 2.
  const auto layout = make_layout({3, 2, 5}, 4, 2);
  ASSERT_EQ(layout.total_floats, 10);
  ASSERT_EQ(layout.partitions.size(), 4u);
  std::vector<float> params(10);
  for (int i = 0; i < 10; ++i) params[i] = 0.5f * static_cast<float>(i) - 1.0f;
  write_replica_file(path, params, layout, 42, 1234);
  // Size by hand: 40-byte header, 4 partitions of 16 + 4·length, CRC 4.
  EXPECT_EQ(std::filesystem::file_size(path), 40u + 4 * 16 + 4 * 10 + 4);
  std::vector<float> back(10, -7.0f);
  EXPECT_EQ(read_replica_file(path, back, layout, 42), 1234u);
  EXPECT_EQ(back, params);
}

TEST(WorkerReplica, AnotherJobOrModelOrAMissingFileIsRefusedWithTheReason) {
  dltrain::testing::TempDir dir;
  const auto path = (dir.path / "replica.ckpt").string();
  const auto layout = make_layout({3, 2, 5}, 4, 2);
  std::vector<float> params(10, 1.0f);
  write_replica_file(path, params, layout, 42, 7);
  try {
    read_replica_file(path, params, layout, 43);
    FAIL() << "another job's replica was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("of job 42, this is shard 4294967295 of job 43"), std::string::npos)
        << e.what();
  }
  const auto other = make_layout({3, 2, 5}, 8, 1);  // the same floats, other partitions
  std::vector<float> into(10);
  try {
    read_replica_file(path, into, other, 42);
    FAIL() << "a replica of another partitioning was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("partitions, the job's model has"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_replica_file((dir.path / "none").string(), into, layout, 42), IoError);
  std::vector<float> wrong(9);
  EXPECT_THROW(write_replica_file(path, wrong, layout, 42, 0), ConfigError);
}

namespace {

// One shard whose process can "die" (the server is destroyed, closing every
// connection) and "restart" on the same port with a given state.
struct RestartableShard {
  PsServerOptions opt;
  std::unique_ptr<PsServer> server;
  std::uint16_t port = 0;
  RestartableShard() {
    opt.bind_address = "127.0.0.1";
    opt.job = 42;
    opt.generation = 1;
    opt.secret = kSecret;
  }
  void start(std::shared_ptr<ShardState> st) {
    opt.port = port;
    server = std::make_unique<PsServer>(opt, std::move(st));
    server->start();
    port = server->port();
  }
  void kill() { server.reset(); }
};

PsClientOptions resync_options(std::uint32_t rank) {
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  o.rank = rank;
  o.num_workers = 2;
  o.timeout = std::chrono::milliseconds(5000);
  o.reconnect_timeout = std::chrono::milliseconds(5000);
  return o;
}

}  // namespace

TEST(Resync, AfterARestartFromACheckpointTheWorkerTakesTheRestoredParameters) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  RestartableShard shard;
  auto st = std::make_shared<ShardState>(0.0);
  shard.start(st);
  const auto layout = make_layout({4}, 4, 1);
  PsClient w(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, layout, resync_options(0));
  w.connect();
  std::vector<float> params{1, 2, 3, 4};
  w.init(params);
  std::vector<float> g(4, 1.0f);
  w.push_pull(g, 0.5f, params);  // x = {0.5, 1.5, 2.5, 3.5}
  ShardCheckpointer(path.string(), 42, 0, st).save();
  w.push_pull(g, 0.5f, params);  // x = {0, 1, 2, 3}, after the checkpoint: lost
  shard.kill();

  // The restarted shard loads the checkpoint before it listens, on the same port.
  auto restored = std::make_shared<ShardState>(0.0);
  restored->restore(std::move(*read_checkpoint_file(path.string(), 42, 0)));
  shard.start(restored);
  EXPECT_THROW(w.push_pull(g, 0.5f, params), PsConnectionLost);
  w.resync(params);
  // The worker's replica {0, 1, 2, 3} was offered as init, but the restored partition
  // wins: the worker now holds the checkpoint's values.
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  w.push_pull(g, 0.5f, params);
  EXPECT_EQ(params, (std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f}));
}

TEST(Resync, AShardRestartedWithoutACheckpointIsRebuiltFromTheFirstReplicaOffered) {
  RestartableShard shard;
  shard.start(std::make_shared<ShardState>(0.0));
  const auto layout = make_layout({4}, 4, 1);
  PsClient w0(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, layout, resync_options(0));
  PsClient w1(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, layout, resync_options(1));
  w0.connect();
  w1.connect();
  std::vector<float> p0{1, 2, 3, 4}, p1(4);
  w0.init(p0);
  w0.pull(p0);  // init has no reply: the pull on the same connection orders it
  w1.pull(p1);
  EXPECT_EQ(p1, p0);
  w0.done();
  shard.kill();
  auto fresh = std::make_shared<ShardState>(0.0);
  shard.start(fresh);
  EXPECT_THROW(w0.workers_done(), PsConnectionLost);
  p0 = {9, 8, 7, 6};  // this worker's replica moved on
  w0.resync(p0);
  EXPECT_EQ(p0, (std::vector<float>{9, 8, 7, 6}));
  // The second worker finds its connection gone too and gets the first replica.
  p1 = {0, 0, 0, 0};
  EXPECT_THROW(w1.pull(p1), PsConnectionLost);
  w1.resync(p1);
  EXPECT_EQ(p1, (std::vector<float>{9, 8, 7, 6}));
  EXPECT_EQ(fresh->num_partitions(), 1u);
}

TEST(Resync, GivesUpWithAClearErrorWhenTheShardDoesNotComeBack) {
  RestartableShard shard;
  shard.start(std::make_shared<ShardState>(0.0));
  auto o = resync_options(0);
  o.reconnect_timeout = std::chrono::milliseconds(700);
  PsClient w(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, make_layout({4}, 4, 1), o);
  w.connect();
  std::vector<float> p{1, 2, 3, 4};
  w.init(p);
  shard.kill();
  try {
    w.pull(p);
    ADD_FAILURE() << "the pull succeeded without a shard";
  } catch (const PsConnectionLost& e) {
    EXPECT_EQ(e.shard(), 0u);
    EXPECT_NE(std::string(e.what()).find("connection lost"), std::string::npos) << e.what();
  }
  try {
    w.resync(p);
    ADD_FAILURE() << "resynced without a shard";
  } catch (const PsConnectionLost&) {
    ADD_FAILURE() << "resync must end with a plain IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reconnect to the PS shards within 700 ms"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
  }
}
