#include "ha/etcd_client.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <limits>

#include <boost/asio/connect.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>

#include "common/file_transfer.h"
#include "common/secret.h"
#include "ha/etcd_json.h"

namespace dltrain::ha {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using json = nlohmann::json;
using tcp = asio::ip::tcp;
using gateway::b64;
using gateway::bool_of;
using gateway::int_of;
using gateway::object_of;

// Not in the anonymous namespace: EtcdClient::Impl (external linkage) holds them.
struct EtcdUrl {
  bool tls = false;
  std::string host, port;
};

namespace {

EtcdUrl parse_url(const std::string& url) {
  EtcdUrl u;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    u.tls = true;
    rest = url.substr(8);
  } else {
    throw ConfigError("etcd", "endpoint \"" + url + "\": expected http://HOST:PORT or https://HOST:PORT");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size() || rest.find('/') != std::string::npos) {
    throw ConfigError("etcd", "endpoint \"" + url + "\": expected http://HOST:PORT or https://HOST:PORT");
  }
  u.host = rest.substr(0, colon);
  u.port = rest.substr(colon + 1);
  if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  if (!std::all_of(u.port.begin(), u.port.end(), [](unsigned char c) { return std::isdigit(c); }) ||
      u.port.size() > 5 || std::stoi(u.port) < 1 || std::stoi(u.port) > 65535) {
    throw ConfigError("etcd", "endpoint \"" + url + "\": port \"" + u.port + "\" is not in [1, 65535]");
  }
  return u;
}

// The end of the range of keys that start with `prefix` (etcd's "range_end": the prefix
// with its last byte that is not 0xff incremented).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& c = prefix.back();
    if (static_cast<unsigned char>(c) < 0xff) {
      c = static_cast<char>(static_cast<unsigned char>(c) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace

void check_endpoints(const std::vector<std::string>& endpoints) {
  if (endpoints.empty()) throw ConfigError("etcd", "expected at least one endpoint, e.g. [\"http://10.0.0.1:2379\"]");
  for (const auto& e : endpoints) parse_url(e);
}

struct EtcdClient::Impl {
  EtcdOptions opt;
  std::vector<EtcdUrl> urls;
  std::size_t current = 0;  // the endpoint that answered last
  std::optional<ssl::context> tls;
  std::string token;        // from /v3/auth/authenticate
  asio::io_context io;

  explicit Impl(EtcdOptions o) : opt(std::move(o)) {
    check_endpoints(opt.endpoints);
    for (const auto& e : opt.endpoints) urls.push_back(parse_url(e));
    if (std::any_of(urls.begin(), urls.end(), [](const EtcdUrl& u) { return u.tls; })) {
      tls.emplace(ssl::context::tls_client);
      tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                       ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      tls->set_verify_mode(ssl::verify_peer);
      beast::error_code ec;
      if (!opt.ca_file.empty()) {
        const std::string cas = read_file_text(opt.ca_file, "etcd_ca_file", "CA certificates");
        tls->add_certificate_authority(asio::buffer(cas), ec);
        if (ec) throw ConfigError("etcd_ca_file", "cannot load CA certificates \"" + opt.ca_file + "\": " + ec.message());
      } else {
        tls->set_default_verify_paths(ec);
      }
      if (!opt.cert_file.empty()) {
        const std::string cert = read_file_text(opt.cert_file, "etcd_cert_file", "client certificate");
        const std::string key = read_file_text(opt.key_file, "etcd_key_file", "client key");
        tls->use_certificate_chain(asio::buffer(cert), ec);
        if (ec) throw ConfigError("etcd_cert_file", "cannot load \"" + opt.cert_file + "\": " + ec.message());
        tls->use_private_key(asio::buffer(key), ssl::context::pem, ec);
        if (ec) throw ConfigError("etcd_key_file", "cannot load \"" + opt.key_file + "\": " + ec.message());
      }
    }
  }

  // Runs the asynchronous operation `start` begins (given its completion handler) to its
  // end: the streams' deadlines (beast::tcp_stream::expires_after) bound only
  // asynchronous operations. Throws beast::system_error with its error.
  template <class Start>
  void run(Start&& start) {
    beast::error_code result = asio::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    io.restart();
    while (result == asio::error::would_block && io.run_one() > 0) {
    }
    if (result) throw beast::system_error(result);
  }

  // One HTTP exchange with one endpoint on `stream` (plain or TLS), connected and
  // handshaken already. `on_line`, for a streamed reply (watch), gets each JSON line and
  // returns true to stop reading.
  template <class Stream>
  json exchange(Stream& stream, const EtcdUrl& u, const std::string& path, const json& body,
                const std::function<bool(const json&)>& on_line) {
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, u.host + ":" + u.port);
    req.set(http::field::content_type, "application/json");
    if (!token.empty() && path != "/v3/auth/authenticate") req.set(http::field::authorization, token);
    req.body() = body.dump();
    req.prepare_payload();
    run([&](auto h) { http::async_write(stream, req, h); });
    beast::flat_buffer buf;
    if (!on_line) {
      http::response_parser<http::string_body> parser;
      parser.body_limit(64u << 20);
      run([&](auto h) { http::async_read(stream, buf, parser, h); });
      return reply_of(parser.get().result_int(), parser.get().body(), u);
    }
    // A streamed reply: chunks of newline-separated JSON objects.
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    std::string pending;
    bool done = false;
    auto take = [&](std::string_view data) {
      pending.append(data);
      for (auto nl = pending.find('\n'); nl != std::string::npos && !done; nl = pending.find('\n')) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded()) throw ProtocolError("etcd: a watch line that is not JSON: " + line.substr(0, 200));
        if (j.is_object() && j.contains("error")) (void)reply_of(500, line, u);
        done = on_line(j);
      }
    };
    run([&](auto h) { http::async_read_header(stream, buf, parser, h); });
    if (parser.get().result_int() != 200) {
      // An error: its body is one JSON object, read whole.
      run([&](auto h) { http::async_read(stream, buf, parser, h); });
      return reply_of(parser.get().result_int(), parser.get().body(), u);
    }
    // No exception may leave the parser's callback (it runs inside Asio's handlers): it
    // is kept, the read ends, and it is thrown here.
    std::exception_ptr failed;
    auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code& ec) -> std::size_t {
      try {
        take(std::string_view(data.data(), data.size()));
      } catch (...) {
        failed = std::current_exception();
        ec = http::error::bad_chunk;
      }
      return data.size();
    };
    parser.on_chunk_body(on_chunk);  // the parser keeps a reference: on_chunk outlives the reads
    while (!done && !parser.is_done()) {
      try {
        run([&](auto h) { http::async_read_some(stream, buf, parser, h); });
      } catch (const beast::system_error&) {
        if (failed) std::rethrow_exception(failed);
        throw;
      }
      if (!parser.chunked() && !parser.get().body().empty()) {  // an unchunked stream: the body grows
        std::string data;
        data.swap(parser.get().body());
        take(data);
      }
    }
    return json::object();
  }

  static json reply_of(unsigned status, const std::string& text, const EtcdUrl& u) {
    return gateway::reply_of(status, text, (u.tls ? "https://" : "http://") + u.host + ":" + u.port);
  }

  // One request to endpoint `u`, with `timeout` over the whole exchange.
  json request_one(const EtcdUrl& u, const std::string& path, const json& body, std::chrono::milliseconds timeout,
                   const std::function<bool(const json&)>& on_line) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    tcp::resolver resolver(io);
    tcp::resolver::results_type results;
    {
      // The name lookup is bounded too (a resolver that is away during a partition).
      asio::steady_timer limit(io, deadline);
      limit.async_wait([&resolver](const beast::error_code& ec) {
        if (!ec) resolver.cancel();
      });
      try {
        run([&](auto h) {
          resolver.async_resolve(u.host, u.port, [&results, h](const beast::error_code& ec, tcp::resolver::results_type r) mutable {
            results = std::move(r);
            h(ec);
          });
        });
      } catch (const beast::system_error& e) {
        if (e.code() == asio::error::operation_aborted) throw beast::system_error(beast::error::timeout);
        throw;
      }
      limit.cancel();
      io.restart();
      io.poll();  // the cancelled timer's handler
    }
    if (!u.tls) {
      beast::tcp_stream stream(io);
      stream.expires_at(deadline);  // a deadline for every operation below
      run([&](auto h) { stream.async_connect(results, h); });
      auto r = exchange(stream, u, path, body, on_line);
      beast::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_both, ec);
      return r;
    }
    beast::ssl_stream<beast::tcp_stream> stream(io, *tls);
    if (!SSL_set_tlsext_host_name(stream.native_handle(), u.host.c_str())) {
      throw IoError("etcd: cannot set the TLS server name " + u.host);
    }
    stream.set_verify_callback(ssl::host_name_verification(u.host));
    beast::get_lowest_layer(stream).expires_at(deadline);
    run([&](auto h) { beast::get_lowest_layer(stream).async_connect(results, h); });
    run([&](auto h) { stream.async_handshake(ssl::stream_base::client, h); });
    auto r = exchange(stream, u, path, body, on_line);
    beast::error_code ec;
    beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ec);  // no close_notify wait
    return r;
  }

  void authenticate(const EtcdUrl& u) {
    const json r = request_one(u, "/v3/auth/authenticate", {{"name", opt.user}, {"password", opt.password}},
                               opt.request_timeout, {});
    const auto t = r.find("token");
    token = t != r.end() && t->is_string() ? t->get<std::string>() : "";
    if (token.empty()) throw EtcdError("", -1, "etcd: /v3/auth/authenticate returned no token");
  }

  // `path` on the endpoint that answered last, then on each other in turn; an endpoint
  // that answers with an error other than "unavailable" ends the search (the request
  // itself is wrong, or the credentials).
  json request(const std::string& path, const json& body, std::chrono::milliseconds timeout = {},
               const std::function<bool(const json&)>& on_line = {}) {
    if (timeout.count() == 0) timeout = opt.request_timeout;
    std::string failures;
    for (std::size_t k = 0; k < urls.size(); ++k) {
      const std::size_t i = (current + k) % urls.size();
      const EtcdUrl& u = urls[i];
      const std::string where = opt.endpoints[i];
      for (int attempt = 0; attempt < 2; ++attempt) {
        try {
          if (!opt.user.empty() && token.empty()) authenticate(u);
          json r = request_one(u, path, body, timeout, on_line);
          current = i;
          return r;
        } catch (const EtcdError& e) {
          // An expired token (16, unauthenticated, "invalid auth token"): once more with a new one.
          if (e.code() == 16 && !token.empty() && attempt == 0) {
            token.clear();
            continue;
          }
          if (e.code() != 14 && e.code() != -1) throw;  // the member answered: the request is refused
          failures += (failures.empty() ? "" : "; ") + std::string(e.what());
        } catch (const beast::system_error& e) {
          // A watch that ran out of time ends quietly: it saw no change.
          if (on_line && e.code() == beast::error::timeout) return json::object();
          failures += (failures.empty() ? "" : "; ") + where + ": " + describe(e.code(), timeout);
        } catch (const ProtocolError& e) {
          failures += (failures.empty() ? "" : "; ") + where + ": " + e.what();
        }
        break;
      }
    }
    throw EtcdError("", -1, "etcd: no endpoint answered " + path + " (" + failures + ")");
  }

  static std::string describe(const beast::error_code& ec, std::chrono::milliseconds timeout) {
    if (ec == beast::error::timeout) return "no answer within " + std::to_string(timeout.count()) + " ms";
    return ec.message();
  }
};

EtcdClient::EtcdClient(EtcdOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
EtcdClient::~EtcdClient() = default;

const std::string& EtcdClient::endpoint() const { return impl_->opt.endpoints[impl_->current]; }

std::string EtcdClient::check() {
  const json r = impl_->request("/v3/maintenance/status", json::object());
  const auto text = [](const json& j, const char* key) {
    const auto it = j.is_object() ? j.find(key) : j.end();
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  };
  return "etcd " + text(r, "version") + " at " + endpoint() + ", cluster " + text(object_of(r, "header"), "cluster_id") +
         ", raft leader member " + text(r, "leader");
}

std::optional<KeyValue> EtcdClient::get(const std::string& key) {
  const auto kvs = gateway::range_kvs(impl_->request("/v3/kv/range", {{"key", b64(key)}}));
  if (kvs.empty()) return std::nullopt;
  return kvs.front();
}

std::vector<KeyValue> EtcdClient::get_prefix(const std::string& prefix, std::int64_t limit, const std::string& from,
                                             bool keys_only) {
  json body{{"key", b64(from.empty() ? prefix : from)}, {"range_end", b64(prefix_end(prefix))}};
  if (keys_only) body["keys_only"] = true;
  if (limit > 0) body["limit"] = std::to_string(limit);
  return gateway::range_kvs(impl_->request("/v3/kv/range", body));
}

std::int64_t EtcdClient::put(const std::string& key, const std::string& value, std::int64_t lease) {
  json body{{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return int_of(object_of(impl_->request("/v3/kv/put", body), "header"), "revision");
}

std::int64_t EtcdClient::erase(const std::string& key, bool prefix) {
  json body{{"key", b64(key)}};
  if (prefix) body["range_end"] = b64(prefix_end(key));
  return int_of(impl_->request("/v3/kv/deleterange", body), "deleted");
}

using gateway::txn_result;

EtcdClient::TxnResult EtcdClient::create(const std::string& key, const std::string& value, std::int64_t lease) {
  json put{{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json body{
      {"compare", json::array({{{"key", b64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})}};
  return txn_result(impl_->request("/v3/kv/txn", body));
}

EtcdClient::TxnResult EtcdClient::put_if(const std::string& guard, std::int64_t guard_revision, const std::string& key,
                                         const std::string& value) {
  return fenced(guard, guard_revision, {TxnOp::put(key, value)});
}

EtcdClient::TxnResult EtcdClient::fenced(const std::string& guard, std::int64_t guard_revision,
                                         const std::vector<TxnOp>& ops) {
  json success = json::array();
  for (const auto& op : ops) {
    if (op.kind == TxnOp::kPut) {
      success.push_back({{"request_put", {{"key", b64(op.key)}, {"value", b64(op.value)}}}});
    } else {
      json del{{"key", b64(op.key)}};
      if (op.kind == TxnOp::kDeletePrefix) del["range_end"] = b64(prefix_end(op.key));
      success.push_back({{"request_delete_range", del}});
    }
  }
  const json body{{"compare", json::array({{{"key", b64(guard)},
                                             {"target", "CREATE"},
                                             {"result", "EQUAL"},
                                             {"create_revision", std::to_string(guard_revision)}}})},
                  {"success", success},
                  {"failure", json::array({{{"request_range", {{"key", b64(guard)}}}}})}};
  return txn_result(impl_->request("/v3/kv/txn", body));
}

bool EtcdClient::erase_if(const std::string& key, std::int64_t revision) {
  const json body{{"compare", json::array({{{"key", b64(key)},
                                             {"target", "CREATE"},
                                             {"result", "EQUAL"},
                                             {"create_revision", std::to_string(revision)}}})},
                  {"success", json::array({{{"request_delete_range", {{"key", b64(key)}}}}})}};
  return bool_of(impl_->request("/v3/kv/txn", body), "succeeded");
}

void EtcdClient::compact(std::int64_t revision) {
  try {
    impl_->request("/v3/kv/compaction", {{"revision", std::to_string(revision)}});
  } catch (const EtcdError& e) {
    // "mvcc: required revision has been compacted": done already, by us or etcd's own.
    if (std::string(e.what()).find("compacted") == std::string::npos) throw;
  }
}

std::int64_t EtcdClient::lease_grant(int ttl_seconds) {
  if (ttl_seconds < 1) throw ConfigError("ttl", "a lease needs a TTL of at least 1 s, got " + std::to_string(ttl_seconds));
  const json r = impl_->request("/v3/lease/grant", {{"TTL", std::to_string(ttl_seconds)}});
  const auto id = int_of(r, "ID");
  if (id == 0) throw EtcdError(endpoint(), -1, "etcd at " + endpoint() + ": no lease granted: " + r.dump());
  return id;
}

std::int64_t EtcdClient::lease_keepalive(std::int64_t id) {
  const json r = impl_->request("/v3/lease/keepalive", {{"ID", std::to_string(id)}});
  return int_of(object_of(r, "result"), "TTL");
}

void EtcdClient::lease_revoke(std::int64_t id) {
  try {
    impl_->request("/v3/lease/revoke", {{"ID", std::to_string(id)}});
  } catch (const EtcdError& e) {
    if (e.code() != 5) throw;  // 5, not found: it expired already
  }
}

std::vector<WatchEvent> EtcdClient::watch(const std::string& key, std::int64_t from_revision,
                                          std::chrono::milliseconds timeout) {
  json create{{"key", b64(key)}};
  if (from_revision > 0) create["start_revision"] = std::to_string(from_revision);
  std::vector<WatchEvent> events;
  const auto on_line = [&](const json& line) { return gateway::watch_line(line, events); };
  impl_->request("/v3/watch", {{"create_request", create}}, timeout, on_line);
  return events;
}

}  // namespace dltrain::ha
