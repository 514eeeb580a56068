// PS shard server: the data-plane TCP endpoint of one PS shard (Asio).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/dispatch.h"
#include "ps/shard_state.h"
#include "ps/sync.h"
#include "wire/frame.h"

namespace dltrain::ps {

namespace detail {
/// The server's Asio state (listener, I/O threads, sessions); defined in server.cpp only.
struct ShardServer;
}  // namespace detail

/// Options of a PS shard server. Defaults bind an ephemeral port on every interface.
struct PsServerOptions {
  std::string bind_address = "0.0.0.0";  ///< IPv4/IPv6 literal
  std::uint16_t port = 0;                ///< 0 = ephemeral; read it back with port()
  std::uint64_t job = 0;                 ///< frames for another job are refused
  std::uint32_t generation = 0;          ///< connections and frames of another generation are refused
  /// The job secret (raw bytes, at least kMinJobSecretBytes): every connection must prove
  /// it knows it (wire/auth.h) before any frame is read.
  std::vector<std::uint8_t> secret;
  /// A connection that has not answered the challenge within this time is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  int threads = 1;                       ///< I/O threads, >= 1
  wire::FrameLimits limits;              ///< checked before any payload allocation
  /// Called on an I/O thread after a worker's `done` was recorded and before it is
  /// acknowledged, so that the shard can make it durable (a checkpoint): a worker exits
  /// only after the acknowledgement, and a restarted shard must still count it. An
  /// exception it throws is logged and the `done` acknowledged anyway. May be empty.
  std::function<void()> on_done;
  /// The consistency model (ps/sync.h): async by default. In ssp and sync a pull that
  /// may not be answered yet is deferred (the connection reads nothing else meanwhile)
  /// and a timer drops the workers it waits for after sync.barrier_timeout.
  SyncOptions sync;
};

/// Serves pushes and pulls for one ShardState over TCP.
///
/// Every connection starts with the challenge–response handshake of wire/auth.h: the
/// shard sends a nonce and reads exactly one answer of kAnswerSize bytes; a connection
/// whose answer is malformed, carries a wrong HMAC, names another job or generation, or
/// does not arrive within `handshake_timeout` is closed without a reply and without a
/// frame header ever being read, logged with the peer and the reason, and counted in
/// rejected_connections(). An authenticated connection is then served strictly in order
/// (one frame at a time), so a pull that follows a push on the same connection sees that
/// push applied. A frame that fails validation (bad magic, version, type, codec, length,
/// job, generation, unknown partition) is logged with its reason, answered with a kError
/// frame when possible, and closes only that connection. Thread-safety: start/stop from one thread; the
/// counters may be read from any thread.
class PsServer {
 public:
  PsServer(PsServerOptions options, std::shared_ptr<ShardState> state);
  ~PsServer();
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  /// Binds and listens; throws ConfigError when the secret is shorter than
  /// kMinJobSecretBytes or the address is not an IP literal, IoError when it cannot be
  /// bound. Then serves on `options.threads` background threads until stop().
  void start();
  /// Closes the listener and every connection and joins the threads. Idempotent.
  void stop();
  /// The bound port (valid after start()).
  std::uint16_t port() const;
  /// Bytes read from / written to sockets, handshakes and frame headers included.
  std::uint64_t bytes_in() const;
  std::uint64_t bytes_out() const;
  /// Connections closed because their handshake failed (see above) or because of a
  /// malformed or refused frame.
  std::uint64_t rejected_connections() const;
  /// Of those, connections refused in the authentication handshake.
  std::uint64_t refused_handshakes() const;
  /// Pull frames answered (dense and sparse).
  std::uint64_t pulls() const;
  /// Wall time spent applying push frames to the shard's state, s.
  double apply_seconds() const;
  /// Connections open now (handshaking or authenticated).
  std::int64_t connections() const;
  /// What the step barrier did (all zero in async mode, but an elastic job's joins and leaves).
  SyncStats sync_stats() const;
  /// What an elastic job's data dispatch did (all zero otherwise).
  DispatchStats dispatch_stats() const;

 private:
  std::unique_ptr<detail::ShardServer> impl_;
};

}  // namespace dltrain::ps
