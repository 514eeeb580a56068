#include "control/server.h"

#include <deque>
#include <map>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include "common/errors.h"

namespace dltrain::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

struct ControlServer::Impl : std::enable_shared_from_this<ControlServer::Impl> {
  asio::io_context& io;
  ControlServerOptions opt;
  ControlHandler handler;
  tcp::acceptor acceptor;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions;
  std::uint16_t port = 0;
  bool stopped = false;

  Impl(asio::io_context& i, ControlServerOptions o, ControlHandler h)
      : io(i), opt(std::move(o)), handler(std::move(h)), acceptor(i) {}
  void accept();
};

namespace {

bool token_matches(std::string_view header, const std::string& token) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || header.substr(0, prefix.size()) != prefix) {
    return false;
  }
  return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
}

std::string endpoint_string(const tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  return ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

class WsSession : public Session, public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(tcp::socket sock, std::shared_ptr<ControlServer::Impl> srv, PeerKind kind, std::string peer)
      : ws_(std::move(sock)), srv_(std::move(srv)), kind_(kind), peer_(std::move(peer)), id_(srv_->next_id++) {}

  void run(http::request<http::string_body> req) {
    websocket::stream_base::timeout to{};
    to.handshake_timeout = srv_->opt.handshake_timeout;
    to.idle_timeout = std::chrono::seconds(30);  // control::kControlIdleTimeout: pings at 15 s
    to.keep_alive_pings = true;
    ws_.set_option(to);
    ws_.read_message_max(srv_->opt.max_message_bytes);
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
      if (ec) {
        spdlog::warn("control: WebSocket handshake with {} failed: {}", self->peer_, ec.message());
        return;
      }
      self->open_ = true;
      self->srv_->sessions[self->id_] = self->weak_from_this();
      if (self->srv_->handler.on_open) self->srv_->handler.on_open(self);
      self->read();
    });
  }

  void send(std::string text) override {
    if (!open_) return;
    if (queue_.size() >= srv_->opt.max_send_queue) {
      spdlog::warn("control: dropping {} session {}: {} messages queued (peer too slow)",
                   kind_ == PeerKind::kAgent ? "agent" : "client", peer_, queue_.size());
      return close();
    }
    queue_.push_back(std::move(text));
    if (queue_.size() == 1) write();
  }

  void close() override {
    if (!open_ || closing_) return;
    closing_ = true;
    ws_.async_close(websocket::close_code::normal, [self = shared_from_this()](beast::error_code) {
      self->finish();
    });
  }

  PeerKind kind() const override { return kind_; }
  const std::string& peer() const override { return peer_; }
  std::uint64_t id() const override { return id_; }

 private:
  void read() {
    ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
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
      if (self->srv_->handler.on_message) self->srv_->handler.on_message(self, text);
      if (!self->closing_) self->read();
    });
  }

  void write() {
    ws_.text(true);
    ws_.async_write(asio::buffer(queue_.front()), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        spdlog::info("control: write to {} failed: {}", self->peer_, ec.message());
        return self->finish();
      }
      self->queue_.pop_front();
      if (!self->queue_.empty()) self->write();
    });
  }

  void finish() {
    if (!open_) return;
    open_ = false;
    srv_->sessions.erase(id_);
    beast::error_code ig;
    beast::get_lowest_layer(ws_).socket().close(ig);
    if (srv_->handler.on_close) srv_->handler.on_close(shared_from_this());
  }

  websocket::stream<beast::tcp_stream> ws_;
  std::shared_ptr<ControlServer::Impl> srv_;
  PeerKind kind_;
  std::string peer_;
  std::uint64_t id_;
  beast::flat_buffer buf_;
  std::deque<std::string> queue_;
  bool open_ = false;
  bool closing_ = false;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket sock, std::shared_ptr<ControlServer::Impl> srv)
      : stream_(std::move(sock)), srv_(std::move(srv)), peer_(endpoint_string(stream_.socket())) {}

  void run() {
    parser_.emplace();
    parser_->body_limit(srv_->opt.max_http_body_bytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(srv_->opt.handshake_timeout);
    http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        if (ec != http::error::end_of_stream) spdlog::debug("control: HTTP read from {}: {}", self->peer_, ec.message());
        return;
      }
      self->route(self->parser_->release());
    });
  }

 private:
  void respond(http::status status, std::string body, bool bearer_challenge = false) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "dltrain");
    res->set(http::field::content_type, "application/json");
    if (bearer_challenge) res->set(http::field::www_authenticate, "Bearer realm=\"dltrain\"");
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, std::size_t) {
      beast::error_code ig;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ig);
    });
  }

  void route(http::request<http::string_body> req) {
    const std::string target(req.target());
    if (target == "/healthz") {
      if (req.method() != http::verb::get) return respond(http::status::method_not_allowed, R"({"error":"use GET"})");
      return respond(http::status::ok, R"({"status":"ok"})");
    }
    PeerKind kind;
    const std::string* token;
    if (target == "/v1/agent") {
      kind = PeerKind::kAgent;
      token = &srv_->opt.agent_token;
    } else if (target == "/v1/client") {
      kind = PeerKind::kClient;
      token = &srv_->opt.client_token;
    } else {
      return respond(http::status::not_found, R"({"error":"not found"})");
    }
    const auto auth = req[http::field::authorization];
    if (!token_matches(std::string_view(auth.data(), auth.size()), *token)) {
      spdlog::warn("control: refused {} from {}: missing or wrong bearer token", target, peer_);
      return respond(http::status::unauthorized, R"({"error":"missing or wrong bearer token"})", true);
    }
    if (!websocket::is_upgrade(req)) {
      return respond(http::status::upgrade_required, R"({"error":"WebSocket upgrade required"})");
    }
    stream_.expires_never();
    std::make_shared<WsSession>(stream_.release_socket(), srv_, kind, peer_)->run(std::move(req));
  }

  beast::tcp_stream stream_;
  std::shared_ptr<ControlServer::Impl> srv_;
  std::string peer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

}  // namespace

void ControlServer::Impl::accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket sock) {
    if (self->stopped) return;
    if (ec) {
      spdlog::warn("control: accept failed: {}", ec.message());
    } else {
      std::make_shared<HttpSession>(std::move(sock), self)->run();
    }
    self->accept();
  });
}

ControlServer::ControlServer(asio::io_context& io, ControlServerOptions options, ControlHandler handler)
    : impl_(std::make_shared<Impl>(io, std::move(options), std::move(handler))) {}

ControlServer::~ControlServer() { stop(); }

void ControlServer::start() {
  auto& im = *impl_;
  if (im.opt.agent_token.empty()) throw ConfigError("agent_token", "must not be empty");
  if (im.opt.client_token.empty()) throw ConfigError("client_token", "must not be empty");
  beast::error_code ec;
  auto addr = asio::ip::make_address(im.opt.bind_address, ec);
  if (ec) throw ConfigError("listen_address", "not an IP address: \"" + im.opt.bind_address + "\"");
  tcp::endpoint ep(addr, im.opt.port);
  im.acceptor.open(ep.protocol(), ec);
  if (!ec) im.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(ep, ec);
  if (!ec) im.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw IoError("control server cannot listen on " + im.opt.bind_address + ":" +
                  std::to_string(im.opt.port) + ": " + ec.message());
  }
  im.port = im.acceptor.local_endpoint().port();
  im.accept();
}

void ControlServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ig;
  impl_->acceptor.close(ig);
  auto sessions = impl_->sessions;  // copy: close() mutates the map
  for (auto& [id, w] : sessions) {
    if (auto s = w.lock()) s->close();
  }
}

std::uint16_t ControlServer::port() const { return impl_->port; }

}  // namespace dltrain::control
