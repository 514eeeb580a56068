// Prometheus metrics: a builder for metric families (prometheus-cpp's data model) and the
// HTTP endpoint that serves them in the text exposition format
// (https://prometheus.io/docs/instrumenting/exposition_formats/), on an agent's
// metrics_address. docs/operations.md ("Metrics") lists every family.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <prometheus/metric_family.h>

namespace dltrain::control {

/// Label name → value pairs of one sample, in the order given.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

/// Collects metric families for one scrape. Names follow the Prometheus conventions:
/// `dltrain_` prefix, base units (seconds, bytes) in the name, counters end in `_total`.
/// A family added twice under the same name is one family (its samples are appended),
/// so several sources (an agent and the leader in one process) can share a builder.
/// Not thread-safe; one per scrape.
class MetricsBuilder {
 public:
  /// Adds a counter sample: `value` is cumulative since the process that counts it
  /// started (a task restart is a reset, which Prometheus's rate() handles).
  void counter(const std::string& name, const std::string& help, const MetricLabels& labels, double value);
  /// Adds a gauge sample.
  void gauge(const std::string& name, const std::string& help, const MetricLabels& labels, double value);
  /// The families, in the order first added.
  const std::vector<prometheus::MetricFamily>& families() const { return families_; }
  /// The text exposition format (version 0.0.4) of every family.
  std::string serialize() const;

 private:
  prometheus::MetricFamily& family(const std::string& name, const std::string& help, prometheus::MetricType type);
  std::vector<prometheus::MetricFamily> families_;
};

/// Options of a metrics endpoint.
struct MetricsServerOptions {
  std::string bind_address = "127.0.0.1";  ///< IP literal
  std::uint16_t port = 0;                  ///< 0 = ephemeral; read back with port()
  /// When not empty, every request must carry `Authorization: Bearer <token>` (401
  /// otherwise). Must not be empty when bind_address is not a loopback address.
  std::string token;
  std::chrono::seconds request_timeout{10};  ///< to read a request and write its answer
};

/// Fills `out` with the metrics of one scrape. Called on the io thread.
using MetricsCollector = std::function<void(MetricsBuilder& out)>;

/// HTTP endpoint (Boost.Beast) on `io`: `GET /metrics` → 200 with the text exposition of
/// what the collectors add (Content-Type `text/plain; version=0.0.4`), `GET /healthz` →
/// 200 without detail; 401 without the token when one is set, 405 for another method,
/// 404 for another path. One request per connection; requests are bounded (8 KiB
/// header, no body) and timed out. Single-threaded: every method and every collector
/// runs on the thread that runs `io`.
class MetricsServer {
 public:
  MetricsServer(boost::asio::io_context& io, MetricsServerOptions options, std::vector<MetricsCollector> collectors);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// Binds and listens. Throws ConfigError("metrics_address") for an address that is not
  /// an IP literal, ConfigError("metrics_token") when the address is not loopback and no
  /// token is set, IoError when it cannot bind.
  void start();
  /// Stops accepting. Idempotent.
  void stop();
  /// The bound port (after start()).
  std::uint16_t port() const;
  /// Requests answered with 200 so far.
  std::uint64_t scrapes() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::control
