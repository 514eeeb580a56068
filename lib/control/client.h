// WebSocket control-channel client (Boost.Beast): used by agents (asynchronously, inside
// their event loop) and by the `dltrain` CLI (through BlockingControlClient).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "control/server.h"
#include "wire/control.h"

namespace dltrain::control {

/// The leader refused the bearer token (HTTP 401): reached, but not allowed in.
class AuthError : public IoError {
 public:
  using IoError::IoError;
};

/// Keep-alive of control sessions (both ends): wire::kControlIdleTimeout.
using wire::kControlIdleTimeout;

/// A parsed `ws://HOST:PORT[/]` or `wss://HOST:PORT[/]` (TLS) leader URL.
struct LeaderUrl {
  std::string host;
  std::string port;
  bool tls = false;
};
/// Throws ConfigError(field, ...) for anything but ws://HOST:PORT or wss://HOST:PORT.
LeaderUrl parse_leader_url(const std::string& url, const std::string& field = "leader");

/// How a client checks the leader's certificate on a wss:// URL (ignored for ws://).
struct TlsClientOptions {
  /// CA certificates (PEM) to verify the leader's certificate chain with; empty = the
  /// system's trust store. The certificate must also name the URL's host (DNS name or IP
  /// address in its subjectAltName).
  std::string ca_file;
  /// Instead: trust exactly this certificate (PEM; the leader's own, for the agent inside
  /// the leader's process, which reaches it on 127.0.0.1). No host name check.
  std::string pinned_cert_file;
  /// How error messages name the CA setting ("tls_ca_file", "--ca-file").
  std::string ca_field = "tls_ca_file";
};

/// One measurement of an agent's link to the leader (measure_link).
struct LinkMeasurement {
  /// bytes / max(seconds − rtt_seconds, seconds / 2): the link's rate one way, bytes/s, > 0
  /// (at most twice bytes / seconds, whatever jitter did to the empty probe).
  double bytes_per_sec = 0;
  double rtt_seconds = 0;    ///< an empty probe: connection set-up, request and answer, s
  std::int64_t bytes = 0;    ///< the last probe's filler
  double seconds = 0;        ///< the last probe, s
};
/// The first probe's filler and the time a probe should take, per measure_link.
inline constexpr std::int64_t kLinkProbeStartBytes = 64 * 1024;
inline constexpr double kLinkProbeSeconds = 0.2;

/// Times this machine's link to the leader at `url` (docs/planner.md, "The link"):
/// `POST /v1/link-probe` with the agent token, each on a fresh TCP (and, for wss://, TLS)
/// connection: once empty (its time, the round trip with the set-up, comes off the
/// others), then with kLinkProbeStartBytes of filler growing ×4 until a probe's extra
/// time reaches kLinkProbeSeconds or its filler `max_bytes` (at most 3 MiB, what the
/// leader reads). Raw bytes on a socket, not WebSocket messages, whose handling (masking,
/// UTF-8 checks, JSON) bounded a probe to ~1–2 Gbit/s on loopback here. Runs on `io`,
/// returns at once; `done` runs on `io`'s thread once, with the measurement, or with
/// nullptr and an error naming the leader and the cause (unreachable, HTTP 401 for a
/// refused token, a timeout: `timeout` per probe). Throws ConfigError for a bad URL or
/// TLS file. Not thread-safe: call it on `io`'s thread.
void measure_link(boost::asio::io_context& io, const std::string& url, const std::string& agent_token,
                  const TlsClientOptions& tls, std::int64_t max_bytes, std::chrono::milliseconds timeout,
                  std::function<void(const LinkMeasurement*, const std::string& error)> done);

/// Asynchronous client session. Create with make_shared; every call and callback runs on
/// the io_context's thread.
class ControlClient : public std::enable_shared_from_this<ControlClient> {
 public:
  /// Throws ConfigError when a TLS file in `tls` cannot be loaded (wss:// URLs only).
  ControlClient(boost::asio::io_context& io, std::string url, std::string token, PeerKind kind,
                TlsClientOptions tls = {});
  ~ControlClient();

  /// Resolves, connects, (wss://) runs the TLS handshake and checks the leader's
  /// certificate, and upgrades, within `timeout`; calls `done(nullptr)` on success or
  /// `done(error)` with an IoError/TimeoutError saying what failed (e.g. "leader ... refused
  /// the token (HTTP 401)", "TLS handshake with leader ... failed: certificate verify failed").
  void connect(std::chrono::milliseconds timeout, std::function<void(std::exception_ptr)> done);
  /// Queues a text message (after a successful connect).
  void send(std::string text);
  /// Closes the session; on_close is not called for a close asked for here.
  void close();
  bool is_open() const;

  /// Called for every text message received.
  std::function<void(const std::string&)> on_message;
  /// Called once when an open session ends for another reason than close().
  std::function<void(const std::string& reason)> on_close;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A blocking request/reply view over ControlClient for command-line tools. Owns its own
/// io_context. Not thread-safe.
class BlockingControlClient {
 public:
  /// Connects (throws IoError / TimeoutError on failure).
  BlockingControlClient(const std::string& url, const std::string& token, std::chrono::milliseconds timeout,
                        TlsClientOptions tls = {});
  ~BlockingControlClient();

  /// Sends a request and waits for its reply; returns the reply body. Throws
  /// RemoteError for an error reply, TimeoutError after `timeout`, IoError when the
  /// connection drops. Events arriving meanwhile are kept for next_event().
  nlohmann::json request(const std::string& type, const nlohmann::json& body,
                         std::chrono::milliseconds timeout);
  /// Next event body, waiting up to `timeout`; nullopt on timeout. Throws IoError when
  /// the connection is gone.
  std::optional<nlohmann::json> next_event(std::chrono::milliseconds timeout);

 private:
  boost::asio::io_context io_;
  std::shared_ptr<ControlClient> client_;
  std::deque<wire::Envelope> inbox_;
  std::optional<std::string> closed_;
  std::uint64_t next_id_ = 1;
};

/// An error reply from the leader: code and message as sent, plus the field if any.
class RemoteError : public std::runtime_error {
 public:
  RemoteError(std::string code, const std::string& message, std::string field)
      : std::runtime_error(message), code_(std::move(code)), field_(std::move(field)) {}
  const std::string& code() const noexcept { return code_; }
  const std::string& field() const noexcept { return field_; }

 private:
  std::string code_;
  std::string field_;
};

}  // namespace dltrain::control

namespace dltrain::control {

/// The URLs of a leader setting: one URL, or the HA candidates' URLs separated by commas
/// ("ws://a:7070,ws://b:7070"; blanks around each are dropped). Throws ConfigError(field)
/// for an empty one.
std::vector<std::string> split_leader_urls(const std::string& value, const std::string& field);

/// A connection to the first of `urls` (the HA candidates: only the serving one listens)
/// that answers: tries each in turn within `per_try`, round after round (0.5 s apart) for
/// up to `total`. When no URL answered in the first round, `say` (may be empty) is told
/// about each failed try, e.g. "leader at ws://a:7070: Connection refused; trying
/// ws://b:7070", and then once a round every 5 s; nothing when one answered at once. Returns the client and the
/// index of its URL. A single URL is tried once, within `total` (BlockingControlClient's
/// errors as they are). Throws AuthError at once (a wrong token is wrong everywhere);
/// after `total`, IoError naming each URL and why it failed (TimeoutError when every
/// try timed out).
std::pair<std::unique_ptr<BlockingControlClient>, std::size_t> connect_first(
    const std::vector<std::string>& urls, const std::string& token, std::chrono::milliseconds total,
    std::chrono::milliseconds per_try, const TlsClientOptions& tls, const std::function<void(const std::string&)>& say);

/// Where a standalone cluster writes, and the client finally looks for, the leader's URL
/// and client token: $XDG_STATE_HOME/dltrain/standalone.json, with XDG_STATE_HOME
/// defaulting to $HOME/.local/state (and HOME to /root when unset).
std::string default_standalone_client_file();

}  // namespace dltrain::control
