// PS shards on loopback for the ps_*_test binaries, and the raw-socket side of the data
// plane (handshake answers and hand-built frames) that tests use to play a worker.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "wire/auth.h"
#include "wire/frame.h"

namespace dltrain::testing {

namespace ps_asio = boost::asio;

/// A job secret (any 32 bytes do), different for each seed.
inline std::vector<std::uint8_t> secret_of(std::uint8_t seed) {
  std::vector<std::uint8_t> s(32);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return s;
}
/// The secret of the tests' job 42, and another one.
inline const std::vector<std::uint8_t> kSecret = secret_of(1);
inline const std::vector<std::uint8_t> kOtherSecret = secret_of(2);

/// `n` PS shards of job 42, generation 1 (secret kSecret, momentum `momentum`, 2 s
/// handshake timeout, consistency model `sync`) on 127.0.0.1, port 0, started at
/// construction, and clients for them.
struct PsShards {
  std::vector<std::shared_ptr<ps::ShardState>> states;
  std::vector<std::unique_ptr<ps::PsServer>> servers;
  ps::PartitionLayout layout;

  /// `sync`: the shards' consistency model (async by default).
  PsShards(int n, double momentum, ps::PartitionLayout l, ps::SyncOptions sync = {}) : layout(std::move(l)) {
    ps::PsServerOptions o;
    o.sync = sync;
    o.bind_address = "127.0.0.1";
    o.job = 42;
    o.generation = 1;
    o.secret = kSecret;
    o.handshake_timeout = std::chrono::milliseconds(2000);
    for (int s = 0; s < n; ++s) {
      states.push_back(std::make_shared<ps::ShardState>(momentum));
      servers.push_back(std::make_unique<ps::PsServer>(o, states.back()));
      servers.back()->start();
    }
  }
  std::vector<ps::PsEndpoint> endpoints() const {
    std::vector<ps::PsEndpoint> e;
    for (const auto& s : servers) e.push_back({"127.0.0.1", s->port()});
    return e;
  }
  /// Options of worker `rank` of `num_workers` (job 42, 5 s timeout).
  static ps::PsClientOptions client_options(std::uint32_t rank, std::uint32_t num_workers,
                                            std::uint32_t generation = 1,
                                            const std::vector<std::uint8_t>& secret = kSecret) {
    ps::PsClientOptions o;
    o.job = 42;
    o.generation = generation;
    o.secret = secret;
    o.rank = rank;
    o.num_workers = num_workers;
    o.timeout = std::chrono::milliseconds(5000);
    return o;
  }
  ps::PsClient client(const ps::PsClientOptions& o) const { return ps::PsClient(endpoints(), layout, o); }
  /// Runs workers 0 … n-1 of `n` at once, each on its own thread: its client joined
  /// (join) with `x0`, then `body(rank, client, params)`. Returns once every one has.
  template <typename Body>
  void run_workers(std::uint32_t n, const std::vector<float>& x0, Body body) const {
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        auto w = client(client_options(r, n));
        std::vector<float> params;
        join(w, x0, params);
        body(r, w, params);
      });
    }
    for (auto& t : threads) t.join();
  }
  /// Connects worker `w`, offers `x0` as the initial parameters (init: a shard keeps the
  /// first it gets) and pulls what the shards hold into `params` (resized to x0's size).
  static void join(ps::PsClient& w, const std::vector<float>& x0, std::vector<float>& params) {
    w.connect();
    w.init(x0);
    params.assign(x0.size(), 0.0f);
    w.pull(params);
  }
};

/// Two shards with momentum 0.9 holding the partitions {4, 4} (one each), serving two
/// workers.
struct TwoShards : ::testing::Test {
  PsShards shards{2, 0.9, ps::make_layout({4, 4}, 4, 2)};
  const ps::PartitionLayout& layout = shards.layout;
  ps::ShardState* st0 = shards.states[0].get();
  ps::ShardState* st1 = shards.states[1].get();
  ps::PsServer* s0 = shards.servers[0].get();
  ps::PsServer* s1 = shards.servers[1].get();

  std::vector<ps::PsEndpoint> endpoints() const { return shards.endpoints(); }
  ps::PsClient client(std::uint32_t rank, std::uint32_t generation = 1,
                      const std::vector<std::uint8_t>& secret = kSecret) {
    return shards.client(PsShards::client_options(rank, 2, generation, secret));
  }
  /// A well-behaved worker (rank 0, this generation) is served: it initialises every
  /// partition to `value` and pulls exactly that back. Call on fresh shards only (a
  /// shard keeps the first init it gets).
  void expect_a_worker_is_served(float value) {
    auto w = client(0);
    w.connect();
    std::vector<float> x(8, value), out(8);
    w.init(x);
    w.pull(out);
    EXPECT_EQ(out, x);
  }
};

/// The worker's side of the handshake on a raw socket: reads the challenge and returns the
/// answer bytes for `secret`, `job` and `generation` (not yet sent).
inline std::array<std::uint8_t, wire::kAnswerSize> answer_for(ps_asio::ip::tcp::socket& sock,
                                                              const std::vector<std::uint8_t>& secret,
                                                              std::uint64_t job, std::uint32_t generation) {
  std::array<std::uint8_t, wire::kChallengeSize> c{};
  ps_asio::read(sock, ps_asio::buffer(c));
  wire::AuthAnswer a;
  a.job = job;
  a.generation = generation;
  a.nonce = wire::random_nonce();
  a.mac = wire::auth_mac(secret, wire::decode_challenge(c), job, generation, wire::kWorkerContext);
  std::array<std::uint8_t, wire::kAnswerSize> out{};
  wire::encode_answer(a, out);
  return out;
}

/// Authenticates a raw socket as a worker of job 42, generation 1, and reads the proof.
inline void authenticate(ps_asio::ip::tcp::socket& sock) {
  ps_asio::write(sock, ps_asio::buffer(answer_for(sock, kSecret, 42, 1)));
  std::array<std::uint8_t, wire::kProofSize> proof{};
  ps_asio::read(sock, ps_asio::buffer(proof));
}

/// The 48 bytes of `h`.
inline std::vector<std::byte> header_bytes(const wire::FrameHeader& h) {
  std::vector<std::byte> b(wire::kHeaderSize);
  wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(b.data(), wire::kHeaderSize));
  return b;
}

/// Appends the bytes of `v`.
template <typename T>
void append(std::vector<std::byte>& b, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  b.insert(b.end(), p, p + v.size() * sizeof(T));
}

/// A frame header of the test shards' job 42, generation 1: `type`, `codec`, `count`
/// values and `payload_bytes` (the rest as wire::FrameHeader defaults them).
inline wire::FrameHeader test_frame(wire::MessageType type, wire::Codec codec = wire::Codec::kBytes,
                                    std::uint32_t count = 0, std::uint32_t payload_bytes = 0) {
  wire::FrameHeader h;
  h.type = type;
  h.job = 42;
  h.generation = 1;
  h.codec = codec;
  h.count = count;
  h.payload_bytes = payload_bytes;
  return h;
}

/// A hello from worker 0 of 1 for job 42, generation 1, then `rest`.
inline std::vector<std::byte> after_hello(const std::vector<std::byte>& rest) {
  auto b = header_bytes(test_frame(wire::MessageType::kHello, wire::Codec::kBytes, 8, 8));
  append(b, std::vector<std::uint32_t>{0, 1});
  b.insert(b.end(), rest.begin(), rest.end());
  return b;
}

/// Authenticates as a worker of job 42, generation 1, sends raw bytes and returns the
/// first error frame's header (skipping other replies) and its text; nullopt when the PS
/// closes without one.
inline std::pair<std::optional<wire::FrameHeader>, std::string> raw_exchange(std::uint16_t port,
                                                                             const std::vector<std::byte>& bytes) {
  ps_asio::io_context io;
  ps_asio::ip::tcp::socket sock(io);
  sock.connect({ps_asio::ip::make_address("127.0.0.1"), port});
  authenticate(sock);
  ps_asio::write(sock, ps_asio::buffer(bytes));
  sock.shutdown(ps_asio::ip::tcp::socket::shutdown_send);
  for (;;) {
    std::array<std::byte, wire::kHeaderSize> hdr{};
    boost::system::error_code ec;
    ps_asio::read(sock, ps_asio::buffer(hdr), ec);
    if (ec) return {std::nullopt, ""};
    auto h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr));
    std::string text(h.payload_bytes, '\0');
    ps_asio::read(sock, ps_asio::buffer(text), ec);
    if (h.type == wire::MessageType::kError) return {h, text};
  }
}

}  // namespace dltrain::testing
