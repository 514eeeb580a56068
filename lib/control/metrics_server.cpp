#include "control/metrics_server.h"

#include <optional>
#include <sstream>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "control/listen.h"

namespace dltrain::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// ------------------------------------------------------------------ MetricsBuilder

prometheus::MetricFamily& MetricsBuilder::family(const std::string& name, const std::string& help,
                                                 prometheus::MetricType type) {
  for (auto& f : families_) {
    if (f.name == name) return f;
  }
  families_.push_back(prometheus::MetricFamily{name, help, type, {}});
  return families_.back();
}

namespace {

prometheus::ClientMetric sample(const MetricLabels& labels) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  return m;
}

}  // namespace

void MetricsBuilder::counter(const std::string& name, const std::string& help, const MetricLabels& labels,
                             double value) {
  auto m = sample(labels);
  m.counter.value = value;
  family(name, help, prometheus::MetricType::Counter).metric.push_back(std::move(m));
}

void MetricsBuilder::gauge(const std::string& name, const std::string& help, const MetricLabels& labels,
                           double value) {
  auto m = sample(labels);
  m.gauge.value = value;
  family(name, help, prometheus::MetricType::Gauge).metric.push_back(std::move(m));
}

std::string MetricsBuilder::serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families_);
  return out.str();
}

// ------------------------------------------------------------------ MetricsServer

struct MetricsServer::Impl : std::enable_shared_from_this<MetricsServer::Impl> {
  asio::io_context& io;
  MetricsServerOptions opt;
  std::vector<MetricsCollector> collectors;
  tcp::acceptor acceptor;
  std::uint16_t port = 0;
  std::uint64_t scrapes = 0;
  bool stopped = false;

  Impl(asio::io_context& i, MetricsServerOptions o, std::vector<MetricsCollector> c)
      : io(i), opt(std::move(o)), collectors(std::move(c)), acceptor(i) {}
  void accept();
  std::string collect() {
    MetricsBuilder b;
    for (auto& c : collectors) c(b);
    return b.serialize();
  }
};

namespace {

// One connection, one request.
class MetricsSession : public std::enable_shared_from_this<MetricsSession> {
 public:
  MetricsSession(tcp::socket sock, std::shared_ptr<MetricsServer::Impl> srv)
      : stream_(std::move(sock)), srv_(std::move(srv)) {}

  void run() {
    parser_.emplace();
    parser_->body_limit(0);
    parser_->header_limit(8 * 1024);
    stream_.expires_after(srv_->opt.request_timeout);
    http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return;  // a scraper that went away, or a bad request: nothing to answer
      self->route(self->parser_->release());
    });
  }

 private:
  void route(const http::request<http::string_body>& req) {
    const std::string_view target(req.target().data(), req.target().size());
    const auto path = target.substr(0, target.find('?'));
    if (path != "/metrics" && path != "/healthz") return respond(http::status::not_found, "not found\n");
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      return respond(http::status::method_not_allowed, "use GET\n");
    }
    if (path == "/healthz") return respond(http::status::ok, "ok\n");
    if (!srv_->opt.token.empty()) {
      const auto auth = req[http::field::authorization];
      if (!bearer_matches(std::string_view(auth.data(), auth.size()), srv_->opt.token)) {
        spdlog::warn("metrics: refused a scrape without the right bearer token");
        return respond(http::status::unauthorized, "missing or wrong bearer token\n", true);
      }
    }
    std::string body;
    try {
      body = srv_->collect();
    } catch (const std::exception& e) {
      spdlog::error("metrics: collecting failed: {}", e.what());
      return respond(http::status::internal_server_error, "collecting the metrics failed\n");
    }
    ++srv_->scrapes;
    respond(http::status::ok, std::move(body), false, "text/plain; version=0.0.4; charset=utf-8",
            req.method() == http::verb::head);
  }

  void respond(http::status status, std::string body, bool challenge = false,
               const char* type = "text/plain; charset=utf-8", bool head = false) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "dltrain");
    res->set(http::field::content_type, type);
    if (challenge) res->set(http::field::www_authenticate, "Bearer realm=\"dltrain metrics\"");
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    if (head) res->body().clear();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, std::size_t) {
      beast::error_code ig;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ig);
    });
  }

  beast::tcp_stream stream_;
  std::shared_ptr<MetricsServer::Impl> srv_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

}  // namespace

void MetricsServer::Impl::accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket sock) {
    if (self->stopped) return;
    if (ec) {
      spdlog::warn("metrics: accept failed: {}", ec.message());
    } else {
      std::make_shared<MetricsSession>(std::move(sock), self)->run();
    }
    self->accept();
  });
}

MetricsServer::MetricsServer(asio::io_context& io, MetricsServerOptions options,
                             std::vector<MetricsCollector> collectors)
    : impl_(std::make_shared<Impl>(io, std::move(options), std::move(collectors))) {}

MetricsServer::~MetricsServer() { stop(); }

void MetricsServer::start() {
  auto& im = *impl_;
  beast::error_code ec;
  const auto addr = asio::ip::make_address(im.opt.bind_address, ec);
  if (ec) throw ConfigError("metrics_address", "not an IP address: \"" + im.opt.bind_address + "\"");
  if (!addr.is_loopback() && im.opt.token.empty()) {
    throw ConfigError("metrics_token", "required when metrics_address (\"" + im.opt.bind_address +
                                           "\") is not a loopback address: anyone who reaches it could read the "
                                           "metrics (set metrics_token or metrics_token_file, or bind 127.0.0.1)");
  }
  im.port = listen_on(im.acceptor, im.opt.bind_address, im.opt.port, "metrics endpoint", "metrics_address");
  im.accept();
}

void MetricsServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ig;
  impl_->acceptor.close(ig);
}

std::uint16_t MetricsServer::port() const { return impl_->port; }

std::uint64_t MetricsServer::scrapes() const { return impl_->scrapes; }

}  // namespace dltrain::control
