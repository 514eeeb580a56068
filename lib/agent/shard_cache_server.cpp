#include "agent/shard_cache_server.h"

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <list>
#include <mutex>
#include <thread>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/file_transfer.h"
#include "data/shards.h"

namespace dltrain::agent {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using local = asio::local::stream_protocol;
namespace {

constexpr std::size_t kMaxRequestBytes = 4 << 20;  // a prefetch of many shards

ShardRef ref_of(const nlohmann::json& j) {
  ShardRef r;
  r.url = j.at("url").get<std::string>();
  r.sha256 = j.at("sha256").get<std::string>();
  r.bytes = j.at("bytes").get<std::int64_t>();
  if (!is_sha256_hex(r.sha256)) throw std::invalid_argument("sha256 is not 64 lowercase hex digits");
  if (r.bytes < 0 || r.bytes > data::kMaxShardBytes) throw std::invalid_argument("bytes out of range");
  data::check_data_url(r.url);
  return r;
}

nlohmann::json stats_json(const ShardCacheStats& s) {
  return {{"capacity_bytes", s.capacity_bytes}, {"bytes", s.bytes},       {"shards", s.shards},
          {"pinned", s.pinned},                 {"hits", s.hits},         {"misses", s.misses},
          {"fetches", s.fetches},               {"bytes_fetched", s.bytes_fetched}, {"evictions", s.evictions},
          {"failures", s.failures}};
}

}  // namespace

struct ShardCacheServer::Impl {
  std::string path;
  ShardCache& cache;
  asio::io_context io;
  local::acceptor acceptor{io};
  std::thread accept_thread;
  std::mutex mu;
  struct Conn {
    local::socket socket;
    std::thread thread;
    std::atomic<bool> done{false};
    explicit Conn(local::socket s) : socket(std::move(s)) {}
  };
  std::list<std::unique_ptr<Conn>> conns;
  std::atomic<bool> stopping{false};
  std::atomic<int> next_owner{1};

  Impl(const std::string& p, ShardCache& c) : path(p), cache(c) {}

  http::response<http::string_body> handle(const http::request<http::string_body>& req, ShardCache::Owner owner) {
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.keep_alive(req.keep_alive());
    res.set(http::field::content_type, "application/json");
    const auto fail = [&](http::status st, const std::string& msg) {
      res.result(st);
      res.body() = nlohmann::json{{"error", msg}}.dump();
    };
    try {
      const std::string target(req.target());
      if (req.method() == http::verb::get && target == "/v1/stats") {
        res.body() = stats_json(cache.stats()).dump();
      } else if (req.method() != http::verb::post) {
        fail(http::status::method_not_allowed, "POST " + target + " expected");
      } else {
        const auto body = nlohmann::json::parse(req.body());
        if (target == "/v1/manifest") {
          const auto url = body.at("url").get<std::string>();
          data::check_data_url(url);
          res.set(http::field::content_type, "application/json");
          res.body() = cache.read_text(url, data::kMaxManifestBytes);
        } else if (target == "/v1/acquire") {
          const auto ref = ref_of(body);
          bool hit = false;
          const auto p = cache.acquire(ref, owner, &hit);
          res.body() = nlohmann::json{{"path", p}, {"hit", hit}}.dump();
        } else if (target == "/v1/release") {
          cache.release(body.at("sha256").get<std::string>(), owner);
          res.result(http::status::no_content);
          res.body().clear();
        } else if (target == "/v1/prefetch") {
          std::vector<ShardRef> refs;
          for (const auto& s : body.at("shards")) refs.push_back(ref_of(s));
          cache.prefetch(refs);
          res.result(http::status::accepted);
          res.body() = "{}";
        } else {
          fail(http::status::not_found, "no route " + target);
        }
      }
    } catch (const data::FetchError& e) {
      fail(http::status::bad_gateway, e.what());
    } catch (const IoError& e) {
      fail(http::status::insufficient_storage, e.what());
    } catch (const Error& e) {
      fail(http::status::bad_request, e.what());
    } catch (const std::exception& e) {
      fail(http::status::bad_request, std::string("malformed request: ") + e.what());
    }
    res.prepare_payload();
    return res;
  }

  void serve(Conn& c, ShardCache::Owner owner) {
    boost::beast::flat_buffer buf;
    boost::system::error_code ec;
    while (!stopping) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(kMaxRequestBytes);
      http::read(c.socket, buf, parser, ec);
      if (ec) break;
      auto res = handle(parser.get(), owner);
      http::write(c.socket, res, ec);
      if (ec || !res.keep_alive()) break;
    }
    cache.release_owner(owner);
    c.done = true;  // the socket is closed by whoever joins this thread
  }

  void accept_loop() {
    while (!stopping) {
      boost::system::error_code ec;
      local::socket s(io);
      acceptor.accept(s, ec);
      if (ec) {
        if (stopping) return;
        spdlog::warn("shard cache socket: accept failed: {}", ec.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // EMFILE and the like: no busy loop
        continue;
      }
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = conns.begin(); it != conns.end();) {  // reap finished connections
        if ((*it)->done) {
          (*it)->thread.join();
          boost::system::error_code ignored;
          (*it)->socket.close(ignored);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      auto c = std::make_unique<Conn>(std::move(s));
      Conn* raw = c.get();
      const int owner = next_owner++;
      c->thread = std::thread([this, raw, owner] { serve(*raw, owner); });
      conns.push_back(std::move(c));
    }
  }
};

ShardCacheServer::ShardCacheServer(const std::string& socket_path, ShardCache& cache)
    : impl_(std::make_unique<Impl>(socket_path, cache)) {
  if (socket_path.size() >= 108) throw IoError("shard cache socket path \"" + socket_path + "\" is 108 bytes or longer");
  std::error_code fec;
  std::filesystem::remove(socket_path, fec);
  boost::system::error_code ec;
  const auto old = ::umask(077);
  impl_->acceptor.open(local(), ec);
  if (!ec) impl_->acceptor.bind(local::endpoint(socket_path), ec);
  ::umask(old);
  if (!ec) impl_->acceptor.listen(64, ec);
  if (ec) throw IoError("cannot listen on the shard cache socket \"" + socket_path + "\": " + ec.message());
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
}

ShardCacheServer::~ShardCacheServer() {
  impl_->stopping = true;
  boost::system::error_code ec;
  // shutdown() wakes the blocked accept(); the acceptor is closed once its thread is gone.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  impl_->accept_thread.join();
  impl_->acceptor.close(ec);
  {
    // Wake every connection's blocked read (their sockets stay open until joined).
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& c : impl_->conns) ::shutdown(c->socket.native_handle(), SHUT_RDWR);
  }
  for (auto& c : impl_->conns) {
    c->thread.join();
    c->socket.close(ec);
  }
  std::error_code fec;
  std::filesystem::remove(impl_->path, fec);
}

const std::string& ShardCacheServer::path() const { return impl_->path; }

}  // namespace dltrain::agent
