// The control server's sessions, over any Beast stream: the first HTTP request of a
// connection (HttpSession: /healthz, a dashboard file, or a WebSocket upgrade) and the
// WebSocket control session it becomes (WsSession). Internal to the control server
// (control/server.cpp serves them over TCP and TLS); a template so that its tests drive
// the very same code over beast::test::stream with a fail count
// (tests/unit/control_session_test.cpp), as Beast's own tests do.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/secret.h"
#include "control/dashboard_assets.h"
#include "control/listen.h"
#include "control/server.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace dltrain::control {

/// What every session of one server shares: its options, its owner's callbacks and the
/// open sessions (by id, for stop()). Used on the server's io_context thread only.
struct SessionHost {
  ControlServerOptions opt;
  ControlHandler handler;
  /// Whose client token `token` is (client_token: the admin; else a user's), or nullopt.
  /// Every token is compared, in constant time each, whichever matches.
  std::optional<ClientIdentity> client_identity(std::string_view token) const {
    std::optional<ClientIdentity> who;
    if (token_matches(token, opt.client_token)) who = ClientIdentity{"admin", true};
    for (const auto& u : opt.users) {
      if (token_matches(token, u.token) && !who) who = u.identity;
    }
    return who;
  }
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions{};
  /// The TLS context when serving wss:// (null for ws://): held here, so that it lives
  /// as long as the last session that uses it.
  std::shared_ptr<boost::asio::ssl::context> tls{};
};

namespace session_detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// The transport under a session (beast::get_lowest_layer): a TCP stream with its
// deadline and socket, or a stream without either (beast::test::stream), which closes.
template <class Lowest, class Duration>
void set_deadline(Lowest& l, Duration d) {
  if constexpr (requires { l.expires_after(d); }) l.expires_after(d);
}
template <class Lowest>
void clear_deadline(Lowest& l) {
  if constexpr (requires { l.expires_never(); }) l.expires_never();
}
template <class Lowest>
void close_transport(Lowest& l) {
  if constexpr (requires { l.socket(); }) {
    beast::error_code ig;
    l.socket().close(ig);
  } else {
    l.close();
  }
}
template <class Stream>
void shutdown_send(Stream& s) {
  if constexpr (requires { s.socket(); }) {
    beast::error_code ig;
    s.socket().shutdown(tcp::socket::shutdown_send, ig);
  } else {
    s.close();
  }
}

template <class Stream>
constexpr bool kIsTls = std::is_same_v<Stream, TlsStream>;

// The largest first message of a dashboard session (its auth), bytes.
constexpr std::size_t kMaxAuthMessage = 16 * 1024;

// A WebSocket session over a plain TCP stream or a TLS stream (Stream). With
// `auth_message` (the dashboard's /v1/dashboard, which a browser opens without an
// Authorization header) its first message must be `auth` with the client token, within
// the handshake timeout; only then does the owner learn of the session (on_open).
template <class Stream>
class WsSession : public Session, public std::enable_shared_from_this<WsSession<Stream>> {
 public:
  WsSession(Stream stream, std::shared_ptr<SessionHost> srv, PeerKind kind, std::string peer,
            bool auth_message = false, ClientIdentity identity = {})
      : ws_(std::move(stream)),
        srv_(std::move(srv)),
        kind_(kind),
        identity_(std::move(identity)),
        peer_(std::move(peer)),
        id_(srv_->next_id++),
        authenticated_(!auth_message),
        auth_timer_(ws_.get_executor()) {}

  void run(http::request<http::string_body> req) {
    websocket::stream_base::timeout to{};
    to.handshake_timeout = srv_->opt.handshake_timeout;
    to.idle_timeout = wire::kControlIdleTimeout;  // pings at half of it
    to.keep_alive_pings = true;
    ws_.set_option(to);
    // Before its auth message a dashboard session is nobody's: a small limit (an auth
    // message is a few hundred bytes), the usual one once it is the client's.
    ws_.read_message_max(authenticated_ ? srv_->opt.max_message_bytes : kMaxAuthMessage);
    ws_.async_accept(req, [self = this->shared_from_this()](beast::error_code ec) {
      if (ec) {
        spdlog::warn("control: WebSocket handshake with {} failed: {}", self->peer_, ec.message());
        return;
      }
      self->open_ = true;
      self->srv_->sessions[self->id_] = self->weak_from_this();
      if (self->authenticated_) {
        self->opened();
      } else {
        self->auth_timer_.expires_after(self->srv_->opt.handshake_timeout);
        self->auth_timer_.async_wait([self](beast::error_code tec) {
          if (tec || self->authenticated_ || !self->open_) return;
          spdlog::warn("control: closing dashboard session {}: no auth message within {} s", self->peer_,
                       self->srv_->opt.handshake_timeout.count());
          self->close();
        });
      }
      self->read();
    });
  }

  void send(std::string text) override {
    if (!open_ || closing_) return;  // closing: nothing more goes out
    if (queue_.size() >= srv_->opt.max_send_queue ||
        (!queue_.empty() && queued_bytes_ + text.size() > srv_->opt.max_send_queue_bytes)) {
      spdlog::warn("control: dropping {} session {}: {} messages ({} bytes) queued (peer too slow)",
                   kind_ == PeerKind::kAgent ? "agent" : "client", peer_, queue_.size(), queued_bytes_);
      // Nothing queued will be sent now: free it at once, but for the message being
      // written (its buffer belongs to the write in flight).
      while (queue_.size() > 1) {
        queued_bytes_ -= queue_.back().size();
        queue_.pop_back();
      }
      return close();
    }
    queued_bytes_ += text.size();
    queue_.push_back(std::move(text));
    if (queue_.size() == 1) write();
  }

  void close() override {
    if (!open_ || closing_) return;
    closing_ = true;
    ws_.async_close(websocket::close_code::normal, [self = this->shared_from_this()](beast::error_code) {
      self->finish();
    });
  }

  PeerKind kind() const override { return kind_; }
  const std::string& peer() const override { return peer_; }
  std::uint64_t id() const override { return id_; }
  const ClientIdentity& identity() const override { return identity_; }

 private:
  void read() {
    ws_.async_read(buf_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        if (ec != websocket::error::closed && ec != asio::error::operation_aborted && ec != asio::error::eof) {
          spdlog::info("control: session {} ended: {}", self->peer_, ec.message());
        }
        return self->finish();
      }
      if (!self->ws_.got_text()) {
        spdlog::warn("control: closing session {}: binary frame on the control channel", self->peer_);
        self->buf_.consume(self->buf_.size());
        return self->close();
      }
      std::string text = beast::buffers_to_string(self->buf_.data());
      self->buf_.consume(self->buf_.size());
      if (!self->authenticated_) {
        self->authenticate(text);
      } else if (self->srv_->handler.on_message) {
        self->srv_->handler.on_message(self, text);
      }
      if (!self->closing_) self->read();
    });
  }

  void opened() {
    handed_ = true;
    if (srv_->handler.on_open) srv_->handler.on_open(this->shared_from_this());
  }

  // The first message of a dashboard session: `auth {token}` with the client token, or
  // the session is refused (an error reply, then closed).
  void authenticate(const std::string& text) {
    std::string id;
    std::string why;
    try {
      const auto env = wire::parse_envelope(text);
      id = env.id;
      if (env.type != "auth") {
        why = "the first message must be auth {token}, got \"" + env.type + "\"";
      } else if (auto who = srv_->client_identity(wire::parse_body<wire::AuthBody>(env).token)) {
        identity_ = std::move(*who);
      } else {
        why = "wrong client token";
      }
    } catch (const ProtocolError& e) {
      why = std::string("the first message must be auth {token}: ") + e.what();
    }
    if (!why.empty()) {
      spdlog::warn("control: refused dashboard session {}: {}", peer_, why);
      send(wire::make_error(id, wire::error_code::kUnauthorized, why));
      return close();
    }
    authenticated_ = true;
    auth_timer_.cancel();
    ws_.read_message_max(srv_->opt.max_message_bytes);
    send(wire::make_reply(id, {{"peer", "client"}}));
    opened();
  }

  void write() {
    ws_.text(true);
    ws_.async_write(asio::buffer(queue_.front()), [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        spdlog::info("control: write to {} failed: {}", self->peer_, ec.message());
        return self->finish();
      }
      self->queued_bytes_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (!self->queue_.empty()) self->write();
    });
  }

  void finish() {
    if (!open_) return;
    open_ = false;
    auth_timer_.cancel();
    srv_->sessions.erase(id_);
    close_transport(beast::get_lowest_layer(ws_));
    if (handed_ && srv_->handler.on_close) srv_->handler.on_close(this->shared_from_this());
  }

  websocket::stream<Stream> ws_;
  std::shared_ptr<SessionHost> srv_;
  PeerKind kind_;
  ClientIdentity identity_;
  std::string peer_;
  std::uint64_t id_;
  beast::flat_buffer buf_;
  std::deque<std::string> queue_;
  std::size_t queued_bytes_ = 0;  // of queue_
  bool open_ = false;
  bool closing_ = false;
  bool authenticated_;     // false until a dashboard session's auth message
  bool handed_ = false;    // on_open was called (so on_close is due)
  asio::steady_timer auth_timer_;
};

// The first request of a connection (after the TLS handshake, when serving wss://):
// /healthz, a dashboard file, or a WebSocket upgrade handed to a WsSession<Stream>.
template <class Stream>
class HttpSession : public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  HttpSession(Stream stream, std::shared_ptr<SessionHost> srv, std::string peer)
      : stream_(std::move(stream)), srv_(std::move(srv)), peer_(std::move(peer)) {}

  void run() {
    if constexpr (kIsTls<Stream>) {
      set_deadline(beast::get_lowest_layer(stream_), srv_->opt.handshake_timeout);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) {
          spdlog::warn("control: TLS handshake with {} failed: {}", self->peer_, ec.message());
          return;
        }
        self->read_request();
      });
    } else {
      read_request();
    }
  }

 private:
  void read_request() {
    parser_.emplace();
    // Beast checks a Content-Length against the limit as it reads the header: the link
    // probe's is the largest; every other route is held to max_http_body_bytes below.
    parser_->body_limit(kMaxLinkProbeBody);
    parser_->header_limit(16 * 1024);
    set_deadline(beast::get_lowest_layer(stream_), srv_->opt.handshake_timeout);
    // The header first: a link probe's body is larger than any other request's, and only
    // an agent (its bearer token checked on the header) may send one that large.
    http::async_read_header(stream_, buf_, *parser_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        if (ec != http::error::end_of_stream) spdlog::debug("control: HTTP read from {}: {}", self->peer_, ec.message());
        return;
      }
      const bool probe = self->parser_->get().target() == "/v1/link-probe";
      if (probe) {
        const auto& req = self->parser_->get();
        const auto auth = req[http::field::authorization];
        if (req.method() != http::verb::post) {
          return self->respond(http::status::method_not_allowed, R"({"error":"use POST"})");
        }
        if (!bearer_matches(std::string_view(auth.data(), auth.size()), self->srv_->opt.agent_token)) {
          spdlog::warn("control: refused /v1/link-probe from {}: missing or wrong bearer token", self->peer_);
          return self->respond(http::status::unauthorized, R"({"error":"missing or wrong bearer token"})", true);
        }
        // Beast reads a body into the free room of this buffer, which its parser empties
        // after every piece: left at its first few KiB, 3 MiB took ~2,000 reads (~2 Gbit/s
        // on loopback) and the probe measured them instead of the link.
        self->buf_.reserve(256 * 1024);
      } else if (const auto length = self->parser_->content_length();
                 self->parser_->chunked() || length.value_or(0) > self->srv_->opt.max_http_body_bytes) {
        return self->respond(http::status::payload_too_large, R"({"error":"request body too large"})");
      }
      http::async_read(self->stream_, self->buf_, *self->parser_, [self, probe](beast::error_code ec2, std::size_t) {
        if (ec2) {
          if (ec2 != http::error::end_of_stream) spdlog::debug("control: HTTP read from {}: {}", self->peer_, ec2.message());
          return;
        }
        if (probe) {
          // Timed by the agent from its request to this answer (docs/protocol.md, "link_report").
          return self->respond(http::status::ok, "{\"bytes\":" + std::to_string(self->parser_->get().body().size()) + "}");
        }
        self->route(self->parser_->release());
      });
    });
  }

  /// The largest body of POST /v1/link-probe, bytes.
  static constexpr std::uint64_t kMaxLinkProbeBody = 3u << 20;

  void respond(http::status status, std::string body, bool bearer_challenge = false) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::content_type, "application/json");
    if (bearer_challenge) res->set(http::field::www_authenticate, "Bearer realm=\"dltrain\"");
    res->body() = std::move(body);
    res->prepare_payload();
    send_response(std::move(res));
  }

  // A dashboard file; for HEAD only its headers.
  void respond_asset(const StaticAsset& a, bool head) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, 11);
    res->set(http::field::content_type, std::string(a.content_type));
    for (const auto& [name, value] : dashboard_headers()) res->set(name, value);
    if (head) {
      res->content_length(a.body.size());
    } else {
      res->body().assign(a.body.data(), a.body.size());
      res->prepare_payload();
    }
    send_response(std::move(res));
  }

  void send_response(std::shared_ptr<http::response<http::string_body>> res) {
    res->set(http::field::server, "dltrain");
    res->keep_alive(false);
    http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code, std::size_t) {
      if constexpr (kIsTls<Stream>) {
        self->stream_.async_shutdown(
            [self](beast::error_code) { close_transport(beast::get_lowest_layer(self->stream_)); });
      } else {
        shutdown_send(self->stream_);
      }
    });
  }

  void route(http::request<http::string_body> req) {
    const std::string target(req.target());
    if (target == "/healthz") {
      if (req.method() != http::verb::get) return respond(http::status::method_not_allowed, R"({"error":"use GET"})");
      return respond(http::status::ok, R"({"status":"ok"})");
    }
    if (target == "/v1/dashboard") {
      // The token comes in the first message (WsSession::authenticate).
      if (!websocket::is_upgrade(req)) {
        return respond(http::status::upgrade_required, R"({"error":"WebSocket upgrade required"})");
      }
      clear_deadline(beast::get_lowest_layer(stream_));
      std::make_shared<WsSession<Stream>>(std::move(stream_), srv_, PeerKind::kClient, peer_, true)
          ->run(std::move(req));
      return;
    }
    if (const StaticAsset* a = find_dashboard_asset(target)) {
      if (req.method() != http::verb::get && req.method() != http::verb::head) {
        return respond(http::status::method_not_allowed, R"({"error":"use GET"})");
      }
      return respond_asset(*a, req.method() == http::verb::head);
    }
    PeerKind kind;
    ClientIdentity who;
    bool authorized = false;
    const auto auth = req[http::field::authorization];
    const std::string_view header(auth.data(), auth.size());
    if (target == "/v1/agent") {
      kind = PeerKind::kAgent;
      authorized = bearer_matches(header, srv_->opt.agent_token);
    } else if (target == "/v1/client") {
      kind = PeerKind::kClient;
      if (auto id = srv_->client_identity(bearer_token(header))) {
        who = std::move(*id);
        authorized = true;
      }
    } else {
      return respond(http::status::not_found, R"({"error":"not found"})");
    }
    if (!authorized) {
      spdlog::warn("control: refused {} from {}: missing or wrong bearer token", target, peer_);
      return respond(http::status::unauthorized, R"({"error":"missing or wrong bearer token"})", true);
    }
    if (!websocket::is_upgrade(req)) {
      return respond(http::status::upgrade_required, R"({"error":"WebSocket upgrade required"})");
    }
    clear_deadline(beast::get_lowest_layer(stream_));
    std::make_shared<WsSession<Stream>>(std::move(stream_), srv_, kind, peer_, false, std::move(who))->run(std::move(req));
  }

  Stream stream_;
  std::shared_ptr<SessionHost> srv_;
  std::string peer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

}  // namespace session_detail

/// Serves one accepted connection as `peer` ("ip:port", for messages): the TLS handshake
/// when Stream is a TLS stream, then its first HTTP request (control/server.h, Routes).
/// Runs on `stream`'s executor; returns at once. Thread-safety: the host's thread only.
template <class Stream>
void serve_connection(Stream stream, std::string peer, std::shared_ptr<SessionHost> host) {
  std::make_shared<session_detail::HttpSession<Stream>>(std::move(stream), std::move(host), std::move(peer))->run();
}

}  // namespace dltrain::control
