// The connection engine behind PsClient (internal: included by ps/client.cpp and
// ps/connection.cpp only, never by users of PsClient).
//
// It owns the sockets to every PS shard of a job and everything about talking over them:
// connecting with bounded attempts, the authentication handshake of wire/auth.h, the
// hello, one scatter/gather exchange at a time with the silence timeout and the stop flag,
// and reconnecting with back-off. What the frames mean (init, push, pull, done) is
// ps/client.cpp's business.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio.hpp>

#include "ps/client.h"
#include "wire/frame.h"

namespace dltrain::ps::detail {

/// An encoded frame header.
using HeaderBytes = std::array<std::byte, wire::kHeaderSize>;

/// Encodes `h`.
HeaderBytes encode(const wire::FrameHeader& h);

/// What one call writes to one shard: byte ranges sent back to back (scatter/gather).
/// The bytes must stay valid until the exchange returns.
using Request = std::vector<std::span<const std::byte>>;

/// Called for every reply frame, in the order each shard sends them, with the shard's
/// index and the decoded header (an error frame never reaches it). Returns where the
/// frame's payload goes, exactly payload_bytes long (empty for a frame without payload).
/// Throws (e.g. ProtocolError) to fail the call.
using ReplyDest = std::function<std::span<std::byte>(std::size_t shard, const wire::FrameHeader& h)>;
/// Called once a reply's payload is in the span ReplyDest returned. Throws to fail the call.
using ReplyDone = std::function<void(std::size_t shard, const wire::FrameHeader& h)>;

/// The worker's connections to the shards of one job (one socket per shard, all driven by
/// one io_context on the calling thread). Not thread-safe: one call at a time. After any
/// error the connections are closed (closed() is true) until open() or reconnect().
class ShardConnections {
 public:
  /// Validates nothing: PsClient checks the endpoints and the secret first.
  ShardConnections(std::vector<PsEndpoint> endpoints, PsClientOptions options);
  ~ShardConnections();
  ShardConnections(const ShardConnections&) = delete;
  ShardConnections& operator=(const ShardConnections&) = delete;

  /// Number of shards.
  std::size_t size() const { return endpoints_.size(); }
  const PsClientOptions& options() const { return opt_; }

  /// Connects to every shard within options().timeout, authenticates and says hello
  /// (see PsClient::connect for the errors).
  void open();
  /// PsClient::resync's loop: closes everything, then opens again with back-off (0.1 s
  /// doubling to 2 s) and runs `after_open` (init and a dense pull), until both succeed or
  /// options().reconnect_timeout has passed; IoError, TimeoutError and ProtocolError
  /// (PsConnectionLost included) are retried. Throws IoError naming the attempts and the
  /// last failure, or StopRequested.
  void reconnect(const std::function<void()>& after_open);
  /// Closes every connection; later exchanges throw IoError until open(). Idempotent.
  void close();

  /// A header for this job and generation with the next sequence number.
  wire::FrameHeader header(wire::MessageType type, std::uint32_t key, wire::Codec codec, std::uint32_t count,
                           std::uint32_t payload_bytes, float scale = 1.0f);

  /// Sends `requests[s]` to every shard s that has one and reads `replies[s]` frames from
  /// each, all shards in parallel, handing each reply to `dest` (and then `done`). `what`
  /// names the call in a TimeoutError ("PS <what>: no reply for N ms"). Throws
  /// PsConnectionLost, IoError (an error frame: "<shard> refused the request: <text>"),
  /// TimeoutError, StopRequested, ProtocolError, or what `dest`/`done` threw.
  void exchange(const std::vector<Request>& requests, const std::vector<int>& replies, const ReplyDest& dest,
                const char* what, const ReplyDone& done = nullptr);

  /// "PS shard S (HOST:PORT)", for messages.
  std::string where(std::size_t shard) const;

  /// Bytes written to / read from the sockets, handshakes and frame headers included.
  std::uint64_t bytes_pushed() const { return pushed_; }
  std::uint64_t bytes_pulled() const { return pulled_; }

 private:
  using Socket = boost::asio::ip::tcp::socket;

  void open_until(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds bound);
  void connect_all(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds bound);
  boost::system::error_code connect_once(Socket& sock, const boost::asio::ip::tcp::resolver::results_type& results,
                                         std::chrono::steady_clock::time_point deadline);
  void authenticate();
  void hello();
  void run(const int& pending, const char* what);
  void check_stop();
  void sleep_checking(std::chrono::milliseconds d);
  void reset();
  std::exception_ptr lost(std::size_t shard, const boost::system::error_code& ec) const;

  std::vector<PsEndpoint> endpoints_;
  PsClientOptions opt_;
  boost::asio::io_context io_;
  std::vector<std::unique_ptr<Socket>> socks_;
  std::uint64_t pushed_ = 0, pulled_ = 0, seq_ = 0;
  bool broken_ = false;
};

}  // namespace dltrain::ps::detail
