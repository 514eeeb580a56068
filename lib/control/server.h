// The leader's control endpoint: one TCP port serving HTTP (GET /healthz) and WebSocket
// control sessions (Boost.Beast), with bearer-token authentication, optionally over TLS.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace dltrain::control {

/// Which side of the control protocol a session belongs to (decided by its URL path and
/// checked against the matching token).
enum class PeerKind { kAgent, kClient };

/// Who a client session is: the user its token belongs to. Agent sessions have none.
struct ClientIdentity {
  std::string user;    ///< "admin" for the client token, a [users.NAME] name, "" for an agent
  bool admin = false;  ///< may act on every user's jobs
};

/// A client token besides client_token, and whose it is.
struct ClientUser {
  std::string token;   ///< bearer token; non-empty, unique
  ClientIdentity identity;
};

/// Options of the control server.
struct ControlServerOptions {
  std::string bind_address = "127.0.0.1";  ///< IP literal
  std::uint16_t port = 0;                  ///< 0 = ephemeral; read back with port()
  std::string agent_token;   ///< bearer token for /v1/agent; must not be empty
  std::string client_token;  ///< bearer token for /v1/client (the user "admin"); must not be empty
  /// More client tokens, each a user's (config::UserOptions): /v1/client and the
  /// dashboard accept any of them, and the session carries its identity.
  std::vector<ClientUser> users;
  std::size_t max_message_bytes = 4u << 20;  ///< WebSocket message limit
  std::size_t max_http_body_bytes = 64u << 10;
  std::size_t max_send_queue = 4096;  ///< messages queued for one slow peer before it is dropped
  /// Bytes queued for one slow peer before it is dropped (a message is always queued when
  /// nothing else is): the count alone let a client that pipelines `list` requests
  /// without reading hold 4096 whole job lists, gigabytes, in the leader.
  std::size_t max_send_queue_bytes = 64u << 20;
  std::chrono::seconds handshake_timeout{10};  ///< TLS + HTTP upgrade, per connection
  /// TLS (wss://): both or neither. The certificate chain (PEM, the server's certificate
  /// first) and its private key (PEM; the file must not be readable by group or others).
  /// Empty: plain ws://. TLS 1.2 or newer only.
  std::string tls_cert_file;
  std::string tls_key_file;
};

/// One authenticated WebSocket session. All methods must be called on the server's
/// io_context thread (the server is single-threaded by design: the io_context is the
/// leader's only event loop, so session state needs no locks).
class Session {
 public:
  virtual ~Session() = default;
  /// Queues a text message. Drops the session when more than max_send_queue messages,
  /// or more than max_send_queue_bytes bytes, are pending (a stuck peer must not grow the
  /// leader's memory).
  virtual void send(std::string text) = 0;
  /// Closes the session (normal closure).
  virtual void close() = 0;
  virtual PeerKind kind() const = 0;
  /// "ip:port" of the peer.
  virtual const std::string& peer() const = 0;
  /// Unique per server, > 0.
  virtual std::uint64_t id() const = 0;
  /// Whose token opened it (a client session); an agent session's is empty.
  virtual const ClientIdentity& identity() const = 0;
};

/// Callbacks from the server into its owner (the leader). Invoked on the io thread.
struct ControlHandler {
  std::function<void(const std::shared_ptr<Session>&)> on_open;
  std::function<void(const std::shared_ptr<Session>&, const std::string&)> on_message;
  std::function<void(const std::shared_ptr<Session>&)> on_close;
};

/// HTTP + WebSocket listener.
///
/// Routes: `GET /healthz` → 200 `{"status":"ok"}` without authentication and without any
/// detail; `/v1/agent` and `/v1/client` → WebSocket upgrade after checking
/// `Authorization: Bearer <token>` against the agent or client token (constant-time
/// compare), 401 when missing or wrong; `/v1/dashboard` → WebSocket upgrade whose first
/// message must be `auth {token}` with the client token (a browser's WebSocket cannot
/// send a header), then a client session; `GET`/`HEAD` of `/` and the dashboard's other
/// embedded files (control/dashboard_assets.h) → the file, with its security headers;
/// `POST /v1/link-probe` with the agent token → its body (at most 3 MiB, read only once
/// the header's token matched) read and answered `{"bytes": N}`, which an agent times
/// to measure its link (control::measure_link, control/client.h); anything else → 404.
class ControlServer {
 public:
  ControlServer(boost::asio::io_context& io, ControlServerOptions options, ControlHandler handler);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  /// Binds and listens; throws IoError when the address cannot be bound, ConfigError when
  /// a token is empty or the TLS certificate or key cannot be loaded (naming the file).
  void start();
  /// Stops accepting and closes every session.
  void stop();
  std::uint16_t port() const;

  /// Opaque implementation; public only so helpers in server.cpp can name it.
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::control
