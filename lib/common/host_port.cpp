#include "common/host_port.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstring>

#include "common/errors.h"

namespace dltrain {

HostPort parse_host_port(std::string_view text, const std::string& field, const std::string& form) {
  const std::string item(text);
  const auto bad = [&] { return ConfigError(field, "expected " + form + ", got \"" + item + "\""); };
  const auto colon = item.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == item.size()) throw bad();
  const std::string port = item.substr(colon + 1);
  if (port.size() > 5) throw ConfigError(field, "port out of range in \"" + item + "\"");
  for (char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) throw ConfigError(field, "port is not a number in \"" + item + "\"");
  }
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) throw ConfigError(field, "port out of range in \"" + item + "\"");
  std::string host = item.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw bad();
  return {host, static_cast<std::uint16_t>(p)};
}

std::string format_host_port(const std::string& host, std::uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, address.c_str(), &v6) == 1 && std::memcmp(&v6, &in6addr_loopback, sizeof v6) == 0;
}

}  // namespace dltrain
