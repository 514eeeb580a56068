#include "data/shard_client.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace dltrain::data {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using local = asio::local::stream_protocol;

struct ShardCacheClient::Impl {
  std::string path;
  asio::io_context io;
  local::socket socket{io};
  boost::beast::flat_buffer buf;

  // One request and its response; a 2xx body, else IoError with the agent's "error".
  std::string call(http::verb verb, const std::string& target, const std::string& body) {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    http::write(socket, req, ec);
    if (ec) throw IoError("the agent's shard cache (" + path + "): " + ec.message());
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxManifestBytes + 1024);
    http::read(socket, buf, parser, ec);
    if (ec) throw IoError("the agent's shard cache (" + path + "): " + ec.message() + " (did the agent stop?)");
    auto res = parser.release();
    const unsigned code = res.result_int();
    if (code >= 200 && code < 300) return std::move(res.body());
    std::string msg = res.body();
    try {
      msg = nlohmann::json::parse(res.body()).at("error").get<std::string>();
    } catch (const std::exception&) {
    }
    throw IoError(msg);
  }
};

ShardCacheClient::ShardCacheClient(const std::string& socket_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = socket_path;
  boost::system::error_code ec;
  impl_->socket.connect(local::endpoint(socket_path), ec);
  if (ec) {
    throw IoError("cannot reach the agent's shard cache at \"" + socket_path + "\": " + ec.message() +
                  " (sharded data is read through the agent that started this worker)");
  }
}

ShardCacheClient::~ShardCacheClient() = default;

std::string ShardCacheClient::manifest(const std::string& url) {
  return impl_->call(http::verb::post, "/v1/manifest", nlohmann::json{{"url", url}}.dump());
}

std::string ShardCacheClient::acquire(const ShardRequest& s, bool* hit) {
  const auto j = nlohmann::json::parse(impl_->call(
      http::verb::post, "/v1/acquire", nlohmann::json{{"url", s.url}, {"sha256", s.sha256}, {"bytes", s.bytes}}.dump()));
  if (hit) *hit = j.value("hit", false);
  return j.at("path").get<std::string>();
}

void ShardCacheClient::release(const std::string& sha256) {
  impl_->call(http::verb::post, "/v1/release", nlohmann::json{{"sha256", sha256}}.dump());
}

void ShardCacheClient::prefetch(const std::vector<ShardRequest>& shards) {
  auto arr = nlohmann::json::array();
  for (const auto& s : shards) arr.push_back({{"url", s.url}, {"sha256", s.sha256}, {"bytes", s.bytes}});
  impl_->call(http::verb::post, "/v1/prefetch", nlohmann::json{{"shards", arr}}.dump());
}

}  // namespace dltrain::data
