#include "control/server.h"

#include <optional>

#include <boost/asio.hpp>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/secret.h"
#include "control/listen.h"
#include "control/sessions.h"

namespace dltrain::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

struct ControlServer::Impl : std::enable_shared_from_this<ControlServer::Impl> {
  asio::io_context& io;
  std::shared_ptr<SessionHost> host;
  tcp::acceptor acceptor;
  std::uint16_t port = 0;
  bool stopped = false;

  Impl(asio::io_context& i, ControlServerOptions o, ControlHandler h)
      : io(i), host(std::make_shared<SessionHost>(SessionHost{std::move(o), std::move(h)})), acceptor(i) {}
  void accept();
};

namespace {

std::string endpoint_string(const tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  return ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

void ControlServer::Impl::accept() {
  acceptor.async_accept([self = this->shared_from_this()](beast::error_code ec, tcp::socket sock) {
    if (self->stopped) return;
    if (ec) {
      spdlog::warn("control: accept failed: {}", ec.message());
    } else {
      // Control messages are small and often come several in a row (a task's events, a
      // follower's stream, a list reply's tail): with Nagle's algorithm each one after
      // the first waits for the peer's delayed ACK (40 ms on Linux).
      beast::error_code nd;
      sock.set_option(tcp::no_delay(true), nd);
      std::string peer = endpoint_string(sock);
      if (self->host->tls) {
        serve_connection(TlsStream(std::move(sock), *self->host->tls), std::move(peer), self->host);
      } else {
        serve_connection(beast::tcp_stream(std::move(sock)), std::move(peer), self->host);
      }
    }
    self->accept();
  });
}

ControlServer::ControlServer(asio::io_context& io, ControlServerOptions options, ControlHandler handler)
    : impl_(std::make_shared<Impl>(io, std::move(options), std::move(handler))) {}

ControlServer::~ControlServer() { stop(); }

void ControlServer::start() {
  auto& im = *impl_;
  const ControlServerOptions& opt = im.host->opt;
  if (opt.agent_token.empty()) throw ConfigError("agent_token", "must not be empty");
  if (opt.client_token.empty()) throw ConfigError("client_token", "must not be empty");
  if (opt.tls_cert_file.empty() != opt.tls_key_file.empty()) {
    throw ConfigError(opt.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "TLS needs both tls_cert_file and tls_key_file");
  }
  if (!opt.tls_cert_file.empty()) {
    im.host->tls = std::make_shared<ssl::context>(ssl::context::tls_server);
    auto& tls = *im.host->tls;
    tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                    ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
    beast::error_code tec;
    const std::string chain = read_file_text(opt.tls_cert_file, "tls_cert_file", "certificate chain");
    tls.use_certificate_chain(asio::buffer(chain), tec);
    if (tec) {
      throw ConfigError("tls_cert_file", "cannot load the certificate chain \"" + opt.tls_cert_file +
                                             "\" (PEM expected): " + tec.message());
    }
    const std::string key = read_private_file_text(opt.tls_key_file, "tls_key_file", "TLS key file");
    tls.use_private_key(asio::buffer(key), ssl::context::pem, tec);
    if (tec) {
      // A key that parses but was refused does not belong to the certificate.
      BIO* bio = BIO_new_mem_buf(key.data(), static_cast<int>(key.size()));
      EVP_PKEY* parsed = bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
      BIO_free(bio);
      EVP_PKEY_free(parsed);
      if (parsed != nullptr) {
        throw ConfigError("tls_key_file", "the private key \"" + opt.tls_key_file +
                                              "\" does not match the certificate \"" + opt.tls_cert_file + "\"");
      }
      throw ConfigError("tls_key_file", "cannot load the private key \"" + opt.tls_key_file +
                                            "\" (PEM expected): " + tec.message());
    }
    if (SSL_CTX_check_private_key(tls.native_handle()) != 1) {
      throw ConfigError("tls_key_file", "the private key \"" + opt.tls_key_file +
                                            "\" does not match the certificate \"" + opt.tls_cert_file + "\"");
    }
  }
  im.port = listen_on(im.acceptor, opt.bind_address, opt.port, "control server", "listen_address");
  im.accept();
}

void ControlServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ig;
  impl_->acceptor.close(ig);
  auto sessions = impl_->host->sessions;  // copy: close() mutates the map
  for (auto& [id, w] : sessions) {
    if (auto s = w.lock()) s->close();
  }
}

std::uint16_t ControlServer::port() const { return impl_->port; }

}  // namespace dltrain::control
