// Reading Prometheus metrics in tests: a plain HTTP GET on loopback (Boost.Beast) and a
// reader of the text exposition format's samples.
#pragma once

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace dltrain::testing {

/// Status code and body of an HTTP response.
struct HttpResponse {
  int status = 0;  ///< 0: no answer (connection refused, timed out)
  std::string body;
};

/// GET http://HOST:PORT`target` with an optional bearer token, at most `timeout_s` seconds.
inline HttpResponse http_get(const std::string& host_port, const std::string& target, const std::string& token = "",
                             int timeout_s = 10) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  HttpResponse out;
  const auto colon = host_port.rfind(':');
  try {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(timeout_s));
    stream.connect(resolver.resolve(host_port.substr(0, colon), host_port.substr(colon + 1)));
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, host_port);
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    http::read(stream, buf, parser);
    out.status = static_cast<int>(parser.get().result_int());
    out.body = parser.get().body();
  } catch (const std::exception&) {
    out.status = 0;
  }
  return out;
}

/// One sample of the text exposition format: metric name, labels, value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// The samples of an exposition (comment lines skipped). Label values are read as
/// written by the serializer (no escapes in dltrain's values).
inline std::vector<Sample> parse_exposition(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t pos = line.find_first_of("{ ");
    s.name = line.substr(0, pos);
    if (pos != std::string::npos && line[pos] == '{') {
      const auto end = line.find('}', pos);
      std::string body = line.substr(pos + 1, end - pos - 1);
      std::size_t p = 0;
      while (p < body.size()) {
        const auto eq = body.find('=', p);
        const auto q2 = body.find('"', eq + 2);
        s.labels[body.substr(p, eq - p)] = body.substr(eq + 2, q2 - eq - 2);
        p = q2 + 2;  // past `",`
      }
      pos = end + 1;
    }
    s.value = std::strtod(line.c_str() + pos, nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

/// Sum of the samples named `name` whose labels include every pair of `match`; `found`
/// counts them.
inline double sum_samples(const std::vector<Sample>& samples, const std::string& name,
                          const std::map<std::string, std::string>& match, int* found = nullptr) {
  double sum = 0;
  int n = 0;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      const auto it = s.labels.find(k);
      ok = ok && it != s.labels.end() && it->second == v;
    }
    if (!ok) continue;
    sum += s.value;
    ++n;
  }
  if (found != nullptr) *found = n;
  return sum;
}

}  // namespace dltrain::testing
