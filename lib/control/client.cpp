#include "control/client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "common/errors.h"

namespace dltrain::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

LeaderUrl parse_leader_url(const std::string& url, const std::string& field) {
  const std::string scheme = "ws://";
  if (url.rfind(scheme, 0) != 0) {
    throw ConfigError(field, "expected ws://HOST:PORT, got \"" + url + "\"");
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size() ||
      rest.find('/') != std::string::npos) {
    throw ConfigError(field, "expected ws://HOST:PORT, got \"" + url + "\"");
  }
  LeaderUrl u{rest.substr(0, colon), rest.substr(colon + 1)};
  if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  for (char c : u.port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) throw ConfigError(field, "port is not a number in \"" + url + "\"");
  }
  return u;
}

struct ControlClient::Impl {
  asio::io_context& io;
  std::string url, token;
  PeerKind kind;
  tcp::resolver resolver;
  websocket::stream<beast::tcp_stream> ws;
  websocket::response_type upgrade_response;
  beast::flat_buffer buf;
  std::deque<std::string> queue;
  bool open = false, closing = false;

  Impl(asio::io_context& i, std::string u, std::string t, PeerKind k)
      : io(i), url(std::move(u)), token(std::move(t)), kind(k), resolver(i), ws(i) {}
};

ControlClient::ControlClient(asio::io_context& io, std::string url, std::string token, PeerKind kind)
    : impl_(std::make_unique<Impl>(io, std::move(url), std::move(token), kind)) {}

ControlClient::~ControlClient() = default;

bool ControlClient::is_open() const { return impl_->open; }

void ControlClient::connect(std::chrono::milliseconds timeout, std::function<void(std::exception_ptr)> done) {
  LeaderUrl u;
  try {
    u = parse_leader_url(impl_->url);
  } catch (...) {
    return done(std::current_exception());
  }
  auto self = shared_from_this();
  auto fail = [done](const std::string& what) { done(std::make_exception_ptr(IoError(what))); };
  const std::string where = impl_->url;
  impl_->resolver.async_resolve(u.host, u.port, [self, u, timeout, done, fail, where](beast::error_code ec,
                                                                                      tcp::resolver::results_type r) {
    if (ec) return fail("cannot resolve leader " + where + ": " + ec.message());
    auto& im = *self->impl_;
    beast::get_lowest_layer(im.ws).expires_after(timeout);
    beast::get_lowest_layer(im.ws).async_connect(r, [self, u, done, fail, where](beast::error_code ec2,
                                                                                 const tcp::endpoint&) {
      if (ec2) {
        if (ec2 == beast::error::timeout) {
          return done(std::make_exception_ptr(TimeoutError("connecting to leader " + where + " timed out")));
        }
        return fail("cannot connect to leader " + where + ": " + ec2.message());
      }
      auto& im2 = *self->impl_;
      const std::string token = im2.token;
      im2.ws.set_option(websocket::stream_base::decorator([token](websocket::request_type& req) {
        req.set(http::field::authorization, "Bearer " + token);
        req.set(http::field::user_agent, "dltrain");
      }));
      const std::string path = im2.kind == PeerKind::kAgent ? "/v1/agent" : "/v1/client";
      im2.ws.async_handshake(im2.upgrade_response, u.host + ":" + u.port, path,
                             [self, done, fail, where](beast::error_code ec3) {
                               auto& im3 = *self->impl_;
                               if (ec3) {
                                 const auto status = im3.upgrade_response.result_int();
                                 if (ec3 == beast::error::timeout) {
                                   return done(std::make_exception_ptr(
                                       TimeoutError("the WebSocket handshake with leader " + where + " timed out")));
                                 }
                                 if (ec3 == websocket::error::upgrade_declined && status == 401) {
                                   return done(std::make_exception_ptr(
                                       AuthError("leader " + where + " refused the token (HTTP 401)")));
                                 }
                                 if (ec3 == websocket::error::upgrade_declined) {
                                   return fail("leader " + where + " declined the WebSocket upgrade (HTTP " +
                                               std::to_string(status) + ")");
                                 }
                                 return fail("WebSocket handshake with leader " + where + " failed: " + ec3.message());
                               }
                               beast::get_lowest_layer(im3.ws).expires_never();
                               websocket::stream_base::timeout to{};
                               to.handshake_timeout = std::chrono::seconds(30);
                               to.idle_timeout = kControlIdleTimeout;
                               to.keep_alive_pings = true;
                               im3.ws.set_option(to);
                               im3.ws.read_message_max(wire::kMaxControlMessage * 4);
                               im3.open = true;
                               done(nullptr);
                               // Read loop.
                               auto loop = std::make_shared<std::function<void()>>();
                               *loop = [self, loop] {
                                 self->impl_->ws.async_read(self->impl_->buf, [self, loop](beast::error_code e, std::size_t) {
                                   auto& im4 = *self->impl_;
                                   if (e) {
                                     const bool was_open = im4.open && !im4.closing;
                                     im4.open = false;
                                     *loop = nullptr;  // break the cycle
                                     if (was_open && self->on_close) self->on_close(e.message());
                                     return;
                                   }
                                   std::string text = beast::buffers_to_string(im4.buf.data());
                                   im4.buf.consume(im4.buf.size());
                                   if (self->on_message) self->on_message(text);
                                   if (im4.open) (*loop)();
                                 });
                               };
                               (*loop)();
                             });
    });
  });
}

void ControlClient::send(std::string text) {
  auto& im = *impl_;
  if (!im.open) return;
  im.queue.push_back(std::move(text));
  if (im.queue.size() > 1) return;
  auto self = shared_from_this();
  auto write = std::make_shared<std::function<void()>>();
  *write = [self, write] {
    auto& i = *self->impl_;
    i.ws.text(true);
    i.ws.async_write(asio::buffer(i.queue.front()), [self, write](beast::error_code ec, std::size_t) {
      auto& j = *self->impl_;
      if (ec) {
        j.queue.clear();
        *write = nullptr;
        return;
      }
      j.queue.pop_front();
      if (!j.queue.empty() && j.open) {
        (*write)();
      } else {
        *write = nullptr;
      }
    });
  };
  (*write)();
}

void ControlClient::close() {
  auto& im = *impl_;
  if (!im.open || im.closing) return;
  im.closing = true;
  auto self = shared_from_this();
  im.ws.async_close(websocket::close_code::normal, [self](beast::error_code) {
    self->impl_->open = false;
  });
}

BlockingControlClient::BlockingControlClient(const std::string& url, const std::string& token,
                                             std::chrono::milliseconds timeout) {
  client_ = std::make_shared<ControlClient>(io_, url, token, PeerKind::kClient);
  std::exception_ptr err;
  bool finished = false;
  client_->connect(timeout, [&](std::exception_ptr e) {
    err = e;
    finished = true;
  });
  client_->on_message = [this](const std::string& text) {
    try {
      inbox_.push_back(wire::parse_envelope(text));
    } catch (const ProtocolError& e) {
      closed_ = std::string("leader sent a malformed message: ") + e.what();
    }
  };
  client_->on_close = [this](const std::string& reason) { closed_ = "connection to the leader closed: " + reason; };
  const auto deadline = std::chrono::steady_clock::now() + timeout + std::chrono::seconds(1);
  while (!finished && io_.run_one_until(deadline) > 0) {
  }
  if (!finished) throw TimeoutError("connecting to leader " + url + " timed out");
  if (err) std::rethrow_exception(err);
}

BlockingControlClient::~BlockingControlClient() {
  if (client_ && client_->is_open()) {
    client_->close();
    io_.run_for(std::chrono::milliseconds(500));
  }
}

nlohmann::json BlockingControlClient::request(const std::string& type, const nlohmann::json& body,
                                              std::chrono::milliseconds timeout) {
  const std::string id = "c" + std::to_string(next_id_++);
  client_->send(wire::make_request(id, type, body));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
      if (it->type == "reply" && it->id == id) {
        wire::Envelope env = std::move(*it);
        inbox_.erase(it);
        if (!env.ok) {
          throw RemoteError(env.error.value("code", "unknown"), env.error.value("message", "(no message)"),
                            env.error.value("field", ""));
        }
        return env.body;
      }
    }
    if (closed_) throw IoError(*closed_);
    if (std::chrono::steady_clock::now() >= deadline || io_.run_one_until(deadline) == 0) {
      if (closed_) throw IoError(*closed_);
      if (std::chrono::steady_clock::now() >= deadline) {
        throw TimeoutError("the leader did not answer \"" + type + "\" within " +
                           std::to_string(timeout.count() / 1000) + " s");
      }
      io_.restart();
    }
  }
}

std::optional<nlohmann::json> BlockingControlClient::next_event(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    while (!inbox_.empty()) {
      wire::Envelope env = std::move(inbox_.front());
      inbox_.pop_front();
      if (env.type == "event") return env.body;
    }
    if (closed_) throw IoError(*closed_);
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    if (io_.run_one_until(deadline) == 0) {
      if (closed_) throw IoError(*closed_);
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      io_.restart();
    }
  }
}

}  // namespace dltrain::control

namespace dltrain::control {

std::string default_standalone_client_file() {
  std::string base;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && *x != '\0') {
    base = x;
  } else {
    const char* home = std::getenv("HOME");
    base = std::string(home != nullptr && *home != '\0' ? home : "/root") + "/.local/state";
  }
  return base + "/dltrain/standalone.json";
}

}  // namespace dltrain::control
