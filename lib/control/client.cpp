#include "control/client.h"

#include <map>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "common/errors.h"
#include "common/host_port.h"
#include "common/secret.h"

namespace dltrain::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using PlainWs = websocket::stream<beast::tcp_stream>;
using TlsWs = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;

LeaderUrl parse_leader_url(const std::string& url, const std::string& field) {
  const bool tls = url.rfind("wss://", 0) == 0;
  if (!tls && url.rfind("ws://", 0) != 0) {
    throw ConfigError(field, "expected ws://HOST:PORT or wss://HOST:PORT, got \"" + url + "\"");
  }
  std::string rest = url.substr(tls ? 6 : 5);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    throw ConfigError(field, "expected ws://HOST:PORT or wss://HOST:PORT, got \"" + url + "\"");
  }
  HostPort hp;
  try {
    hp = parse_host_port(rest, field);
  } catch (const ConfigError& e) {
    // e.g. "port is not a number in ..." after the expected form.
    throw ConfigError(field, "expected ws://HOST:PORT or wss://HOST:PORT, got \"" + url + "\" (" +
                                 std::string(e.what()).substr(field.size() + 2) + ")");
  }
  LeaderUrl u{hp.host, std::to_string(hp.port), tls};
  return u;
}

namespace {

// The DER bytes of the first certificate in a PEM file; throws ConfigError.
std::vector<unsigned char> certificate_der(const std::string& path, const std::string& field) {
  const std::string pem = read_file_text(path, field, "certificate");
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = bio == nullptr ? nullptr : PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) throw ConfigError(field, "\"" + path + "\" holds no PEM certificate");
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert, &der);
  X509_free(cert);
  if (n <= 0) throw ConfigError(field, "cannot encode the certificate in \"" + path + "\"");
  std::vector<unsigned char> out(der, der + n);
  OPENSSL_free(der);
  return out;
}

// How a client checks the leader's certificate (TlsClientOptions): TLS 1.2 and later,
// the peer verified against a pinned certificate, the CA file or the system's store.
void configure_tls(ssl::context& tls, const TlsClientOptions& tls_opt) {
  tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                  ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  tls.set_verify_mode(ssl::verify_peer);
  beast::error_code ec;
  if (!tls_opt.pinned_cert_file.empty()) {
    // Only the leaf matters, and it must be exactly this certificate.
    auto pinned = certificate_der(tls_opt.pinned_cert_file, "tls_cert_file");
    tls.set_verify_callback([pinned](bool, ssl::verify_context& vc) {
      X509_STORE_CTX* sc = vc.native_handle();
      if (X509_STORE_CTX_get_error_depth(sc) > 0) return true;
      X509* leaf = X509_STORE_CTX_get_current_cert(sc);
      unsigned char* der = nullptr;
      const int n = leaf == nullptr ? -1 : i2d_X509(leaf, &der);
      const bool same = n > 0 && static_cast<std::size_t>(n) == pinned.size() &&
                        std::equal(pinned.begin(), pinned.end(), der);
      OPENSSL_free(der);
      return same;
    });
  } else if (!tls_opt.ca_file.empty()) {
    const std::string cas = read_file_text(tls_opt.ca_file, tls_opt.ca_field, "CA certificates");
    tls.add_certificate_authority(asio::buffer(cas), ec);
    if (ec) {
      throw ConfigError(tls_opt.ca_field, "cannot load CA certificates \"" + tls_opt.ca_file + "\": " + ec.message());
    }
  } else {
    tls.set_default_verify_paths(ec);
  }
}

}  // namespace

struct ControlClient::Impl {
  asio::io_context& io;
  std::string url, token;
  PeerKind kind;
  TlsClientOptions tls_opt;
  tcp::resolver resolver;
  std::optional<ssl::context> tls;  // wss:// only
  std::unique_ptr<PlainWs> plain;
  std::unique_ptr<TlsWs> secure;
  websocket::response_type upgrade_response;
  beast::flat_buffer buf;
  std::deque<std::string> queue;
  bool open = false, closing = false;

  Impl(asio::io_context& i, std::string u, std::string t, PeerKind k, TlsClientOptions o)
      : io(i), url(std::move(u)), token(std::move(t)), kind(k), tls_opt(std::move(o)), resolver(i) {
    bool wss = false;
    try {
      wss = parse_leader_url(url).tls;
    } catch (const ConfigError&) {
      // reported by connect()
    }
    if (!wss) {
      plain = std::make_unique<PlainWs>(io);
      return;
    }
    tls.emplace(ssl::context::tls_client);
    configure_tls(*tls, tls_opt);
    secure = std::make_unique<TlsWs>(io, *tls);
  }

  // Runs `f` on the WebSocket stream, whichever kind it is.
  template <class F>
  void with_ws(F&& f) {
    if (secure) {
      f(*secure);
    } else {
      f(*plain);
    }
  }
};

ControlClient::ControlClient(asio::io_context& io, std::string url, std::string token, PeerKind kind,
                             TlsClientOptions tls)
    : impl_(std::make_unique<Impl>(io, std::move(url), std::move(token), kind, std::move(tls))) {}

ControlClient::~ControlClient() = default;

bool ControlClient::is_open() const { return impl_->open; }

namespace {

// After the TCP connection (and the TLS handshake): the WebSocket upgrade, then the read
// loop. `Ws` is PlainWs or TlsWs.
template <class Ws>
void upgrade(const std::shared_ptr<ControlClient>& self, ControlClient::Impl& im, Ws& ws, const LeaderUrl& u,
             const std::function<void(std::exception_ptr)>& done);

}  // namespace

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
    self->impl_->with_ws([&](auto& ws) {
      beast::get_lowest_layer(ws).expires_after(timeout);
      beast::get_lowest_layer(ws).async_connect(r, [self, u, done, fail, where, &ws](beast::error_code ec2,
                                                                                     const tcp::endpoint&) {
        if (ec2) {
          if (ec2 == beast::error::timeout) {
            return done(std::make_exception_ptr(TimeoutError("connecting to leader " + where + " timed out")));
          }
          return fail("cannot connect to leader " + where + ": " + ec2.message());
        }
        // As the server does: small messages in a row must not wait for delayed ACKs.
        beast::error_code nd;
        beast::get_lowest_layer(ws).socket().set_option(tcp::no_delay(true), nd);
        auto& im = *self->impl_;
        if constexpr (std::is_same_v<std::decay_t<decltype(ws)>, TlsWs>) {
          auto& tls = ws.next_layer();
          // SNI, and the name the certificate must carry (unless it is pinned).
          if (!SSL_set_tlsext_host_name(tls.native_handle(), u.host.c_str())) {
            return fail("TLS: cannot set the server name " + u.host);
          }
          if (im.tls_opt.pinned_cert_file.empty()) tls.set_verify_callback(ssl::host_name_verification(u.host));
          tls.async_handshake(ssl::stream_base::client, [self, u, done, fail, where, &ws](beast::error_code ec3) {
            if (ec3) {
              if (ec3 == beast::error::timeout) {
                return done(std::make_exception_ptr(TimeoutError("the TLS handshake with leader " + where +
                                                                 " timed out")));
              }
              return fail("TLS handshake with leader " + where + " failed: " + ec3.message() +
                          (ec3.category() == asio::error::get_ssl_category()
                               ? (self->impl_->tls_opt.ca_file.empty()
                                      ? " (is the leader's certificate signed by a CA in this system's trust store? "
                                        "For a private CA set " +
                                            self->impl_->tls_opt.ca_field +
                                            ". And does the certificate name this host?)"
                                      : " (is the leader's certificate signed by the CA in " +
                                            self->impl_->tls_opt.ca_field + ", and does it name this host?)")
                               : ""));
            }
            upgrade(self, *self->impl_, ws, u, done);
          });
        } else {
          upgrade(self, im, ws, u, done);
        }
      });
    });
  });
}

namespace {

template <class Ws>
void upgrade(const std::shared_ptr<ControlClient>& self, ControlClient::Impl& im, Ws& ws, const LeaderUrl& u,
             const std::function<void(std::exception_ptr)>& done) {
  const std::string where = im.url;
  auto fail = [done](const std::string& what) { done(std::make_exception_ptr(IoError(what))); };
  const std::string token = im.token;
  ws.set_option(websocket::stream_base::decorator([token](websocket::request_type& req) {
    req.set(http::field::authorization, "Bearer " + token);
    req.set(http::field::user_agent, "dltrain");
  }));
  const std::string path = im.kind == PeerKind::kAgent ? "/v1/agent" : "/v1/client";
  ws.async_handshake(im.upgrade_response, u.host + ":" + u.port, path,
                     [self, done, fail, where, &ws, &im](beast::error_code ec3) {
                       if (ec3) {
                         const auto status = im.upgrade_response.result_int();
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
                         // A TLS leader answers a plain HTTP upgrade with a TLS alert or by
                         // closing: say which scheme to use rather than only "end of stream".
                         const bool plain = where.rfind("ws://", 0) == 0;
                         return fail("WebSocket handshake with leader " + where + " failed: " + ec3.message() +
                                     (plain && status == 0 ? " (if the leader serves TLS, use wss://)" : ""));
                       }
                       beast::get_lowest_layer(ws).expires_never();
                       websocket::stream_base::timeout to{};
                       to.handshake_timeout = std::chrono::seconds(30);
                       to.idle_timeout = kControlIdleTimeout;
                       to.keep_alive_pings = true;
                       ws.set_option(to);
                       ws.read_message_max(wire::kMaxControlMessage * 4);
                       // A client masks what it sends through a buffer of this size; at
                       // Beast's default (4 KiB) a large message (a model file's window)
                       // went out as a frame per 4 KiB: 3 MiB took 768 frames' handling at
                       // both ends, ~110 MB/s on loopback here; 256 KiB frames, ~2 Gbit/s.
                       ws.write_buffer_bytes(256 * 1024);
                       im.open = true;
                       done(nullptr);
                       // Read loop. The pending read's handler owns the loop; the loop
                       // only names itself weakly, so that a handler destroyed unrun (its
                       // io_context stopped or gone) frees the loop and the client.
                       auto loop = std::make_shared<std::function<void()>>();
                       *loop = [self, weak = std::weak_ptr<std::function<void()>>(loop), &ws, &im] {
                         ws.async_read(im.buf, [self, loop = weak.lock(), &im](beast::error_code e, std::size_t) {
                           if (e) {
                             const bool was_open = im.open && !im.closing;
                             im.open = false;
                             if (was_open && self->on_close) self->on_close(e.message());
                             return;
                           }
                           std::string text = beast::buffers_to_string(im.buf.data());
                           im.buf.consume(im.buf.size());
                           if (self->on_message) self->on_message(text);
                           if (im.open) (*loop)();
                         });
                       };
                       (*loop)();
                     });
}

}  // namespace

void ControlClient::send(std::string text) {
  auto& im = *impl_;
  if (!im.open) return;
  im.queue.push_back(std::move(text));
  if (im.queue.size() > 1) return;
  auto self = shared_from_this();
  im.with_ws([&](auto& ws) {
    // As the read loop: the pending write's handler owns the loop, which names itself weakly.
    auto write = std::make_shared<std::function<void()>>();
    *write = [self, weak = std::weak_ptr<std::function<void()>>(write), &ws] {
      auto& i = *self->impl_;
      ws.text(true);
      ws.async_write(asio::buffer(i.queue.front()), [self, write = weak.lock()](beast::error_code ec, std::size_t) {
        auto& j = *self->impl_;
        if (ec) {
          j.queue.clear();
          return;
        }
        j.queue.pop_front();
        if (!j.queue.empty() && j.open) (*write)();
      });
    };
    (*write)();
  });
}

void ControlClient::close() {
  auto& im = *impl_;
  if (!im.open || im.closing) return;
  im.closing = true;
  auto self = shared_from_this();
  im.with_ws([&](auto& ws) {
    ws.async_close(websocket::close_code::normal, [self](beast::error_code) { self->impl_->open = false; });
  });
}

BlockingControlClient::BlockingControlClient(const std::string& url, const std::string& token,
                                             std::chrono::milliseconds timeout, TlsClientOptions tls) {
  client_ = std::make_shared<ControlClient>(io_, url, token, PeerKind::kClient, std::move(tls));
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

std::vector<std::string> split_leader_urls(const std::string& value, const std::string& field) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = value.find(',', start);
    std::string part = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    part = b == std::string::npos ? "" : part.substr(b, e - b + 1);
    if (part.empty()) throw ConfigError(field, "an empty leader URL in \"" + value + "\"");
    out.push_back(std::move(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::pair<std::unique_ptr<BlockingControlClient>, std::size_t> connect_first(
    const std::vector<std::string>& urls, const std::string& token, std::chrono::milliseconds total,
    std::chrono::milliseconds per_try, const TlsClientOptions& tls, const std::function<void(const std::string&)>& say) {
  if (urls.empty()) throw ConfigError("leader", "no leader URL");
  // One leader: one try, failing as it always has (no round of retries).
  if (urls.size() == 1) return {std::make_unique<BlockingControlClient>(urls[0], token, total, tls), 0};
  const auto deadline = std::chrono::steady_clock::now() + total;
  std::map<std::string, std::string> why;  // the latest failure of each URL
  std::vector<std::string> first_round;     // the first round's failures, said if it fails whole
  bool all_timeouts = true;
  for (std::size_t round = 0;; ++round) {
    for (std::size_t i = 0; i < urls.size(); ++i) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto budget = std::max(std::chrono::milliseconds(100), std::min(per_try, left));
      std::string failed;
      try {
        return {std::make_unique<BlockingControlClient>(urls[i], token, budget, tls), i};
      } catch (const AuthError&) {
        throw;
      } catch (const IoError& e) {
        failed = e.what();
        all_timeouts = false;
      } catch (const TimeoutError& e) {
        failed = e.what();
      }
      {
        why[urls[i]] = failed;
        const auto& e = failed;
        const bool more = std::chrono::steady_clock::now() < deadline;
        // Each URL's failure in the first round — said only once that round has failed
        // whole (a standby's closed port is the normal state) — then one line per round
        // every 5 s.
        const std::string line = "leader at " + urls[i] + ": " + e +
                                 (!more ? "" : i + 1 < urls.size() ? "; trying " + urls[i + 1] : "; trying again from " + urls[0]);
        if (round == 0) {
          first_round.push_back(line);
          if (say && i + 1 == urls.size()) {
            for (const auto& l : first_round) say(l);
          }
        } else if (say && i == 0 && round % 10 == 0) {
          say(line);
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string msg = urls.size() == 1 ? why.begin()->second : "no leader answered within " +
                                                                         std::to_string(total.count() / 1000) + " s (";
        if (urls.size() > 1) {
          bool first = true;
          for (const auto& u : urls) {
            if (!why.count(u)) continue;
            msg += (first ? "" : "; ") + u + ": " + why[u];
            first = false;
          }
          msg += ")";
        }
        if (all_timeouts) throw TimeoutError(msg);
        throw IoError(msg);
      }
    }
    std::this_thread::sleep_for(std::min(std::chrono::milliseconds(500), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                            deadline - std::chrono::steady_clock::now())));
  }
}

namespace {

// measure_link's state: one POST /v1/link-probe at a time, each on a fresh connection,
// all on the caller's io_context.
class LinkProbe : public std::enable_shared_from_this<LinkProbe> {
 public:
  using Done = std::function<void(const LinkMeasurement*, const std::string& error)>;
  LinkProbe(asio::io_context& io, LeaderUrl u, std::string token, const TlsClientOptions& tls_opt,
            std::int64_t max_bytes, std::chrono::milliseconds timeout, Done done)
      : io_(io), u_(std::move(u)), token_(std::move(token)), max_(std::max<std::int64_t>(1, max_bytes)),
        timeout_(timeout), done_(std::move(done)), resolver_(io), pinned_(!tls_opt.pinned_cert_file.empty()) {
    if (u_.tls) {
      tls_.emplace(ssl::context::tls_client);
      configure_tls(*tls_, tls_opt);
    }
  }

  void start() {
    resolver_.async_resolve(u_.host, u_.port, [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type r) {
      if (ec) return self->fail("cannot resolve the leader: " + ec.message());
      self->endpoints_ = std::move(r);
      self->probe(0);
    });
  }

 private:
  void probe(std::size_t bytes) {
    plain_.reset();
    secure_.reset();
    req_ = {http::verb::post, "/v1/link-probe", 11};
    req_.set(http::field::host, u_.host);
    req_.set(http::field::authorization, "Bearer " + token_);
    req_.body().assign(bytes, 'x');
    req_.prepare_payload();
    res_ = {};
    buf_.clear();
    start_ = std::chrono::steady_clock::now();
    auto self = shared_from_this();
    auto connected = [self, bytes](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->fail("cannot connect: " + ec.message());
      if (!self->secure_) return self->exchange(*self->plain_, bytes);
      self->secure_->async_handshake(ssl::stream_base::client, [self, bytes](beast::error_code e) {
        if (e) return self->fail("TLS handshake: " + e.message());
        self->exchange(*self->secure_, bytes);
      });
    };
    if (tls_) {
      secure_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io_, *tls_);
      if (!SSL_set_tlsext_host_name(secure_->native_handle(), u_.host.c_str())) {
        return fail("cannot set the TLS server name " + u_.host);
      }
      // A pinned certificate is checked by configure_tls's callback, without the name.
      if (!pinned_) secure_->set_verify_callback(ssl::host_name_verification(u_.host));
      beast::get_lowest_layer(*secure_).expires_after(timeout_);
      beast::get_lowest_layer(*secure_).async_connect(endpoints_, connected);
    } else {
      plain_ = std::make_unique<beast::tcp_stream>(io_);
      plain_->expires_after(timeout_);
      plain_->async_connect(endpoints_, connected);
    }
  }

  template <class Stream>
  void exchange(Stream& stream, std::size_t bytes) {
    auto self = shared_from_this();
    http::async_write(stream, req_, [self, &stream, bytes](beast::error_code ec, std::size_t) {
      if (ec) return self->fail(ec.message());
      http::async_read(stream, self->buf_, self->res_, [self, bytes](beast::error_code e, std::size_t) {
        if (e) return self->fail(e.message());
        self->answered(bytes);
      });
    });
  }

  void answered(std::size_t bytes) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (res_.result() != http::status::ok) {
      return fail("HTTP " + std::to_string(res_.result_int()) + " " + res_.body());
    }
    std::size_t next = 0;
    if (bytes == 0) {
      // The connection's set-up and the answer cost the same with and without the filler:
      // timed alone, they come off every probe.
      m_.rtt_seconds = seconds;
      next = static_cast<std::size_t>(std::min(kLinkProbeStartBytes, max_));
    } else {
      m_.bytes = static_cast<std::int64_t>(bytes);
      m_.seconds = seconds;
      if (seconds - m_.rtt_seconds < kLinkProbeSeconds && m_.bytes < max_) {
        next = static_cast<std::size_t>(std::min(m_.bytes * 4, max_));
      }
    }
    if (next == 0) {
      // Jitter can make the empty probe nearly as slow as the full one: the filler's time is
      // taken as at least half the probe's, so that the rate is never over twice bytes / time.
      m_.bytes_per_sec = static_cast<double>(m_.bytes) / std::max(m_.seconds - m_.rtt_seconds, m_.seconds / 2);
      return finish(&m_, "");
    }
    // The next probe from the event loop: this connection is closed outside its own handler.
    asio::post(io_, [self = shared_from_this(), next] { self->probe(next); });
  }

  void fail(const std::string& why) { finish(nullptr, "link probe to " + u_.host + ":" + u_.port + ": " + why); }

  void finish(const LinkMeasurement* m, const std::string& error) {
    if (!done_) return;
    auto done = std::move(done_);
    done_ = nullptr;
    done(m, error);
    asio::post(io_, [self = shared_from_this()] {
      self->plain_.reset();
      self->secure_.reset();
    });
  }

  asio::io_context& io_;
  LeaderUrl u_;
  std::string token_;
  std::int64_t max_;
  std::chrono::milliseconds timeout_;
  Done done_;
  tcp::resolver resolver_;
  bool pinned_;
  tcp::resolver::results_type endpoints_;
  std::optional<ssl::context> tls_;
  std::unique_ptr<beast::tcp_stream> plain_;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  beast::flat_buffer buf_;
  std::chrono::steady_clock::time_point start_;
  LinkMeasurement m_;
};

}  // namespace

void measure_link(asio::io_context& io, const std::string& url, const std::string& agent_token,
                  const TlsClientOptions& tls, std::int64_t max_bytes, std::chrono::milliseconds timeout,
                  std::function<void(const LinkMeasurement*, const std::string& error)> done) {
  std::make_shared<LinkProbe>(io, parse_leader_url(url, "leader_url"), agent_token, tls, max_bytes, timeout,
                              std::move(done))
      ->start();
}

}  // namespace dltrain::control
