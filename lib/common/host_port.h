// HOST:PORT, the one form every address in dltrain takes (the leader's URL, the PS shard
// endpoints a worker is given, the endpoints in `dltrain status`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dltrain {

/// A host (IP literal, without brackets for IPv6, or a name) and a TCP port.
struct HostPort {
  std::string host;
  std::uint16_t port = 0;  ///< [1, 65535]
};

/// Parses "HOST:PORT" or "[IPv6]:PORT" (the last colon ends the host, so "::1:80" is
/// host ::1). The port must be decimal digits in [1, 65535] and the host non-empty. Throws ConfigError(field, "expected <form>, got \"text\"")
/// where `form` describes what the field holds (e.g. "HOST:PORT[,HOST:PORT...]"), or
/// ConfigError(field, "port out of range in \"text\""). Thread-safe.
HostPort parse_host_port(std::string_view text, const std::string& field, const std::string& form = "HOST:PORT");

/// "HOST:PORT" for `host` (an IP literal or a name) and `port`, an IPv6 literal in
/// brackets ("[::1]:7070"): what parse_host_port reads back, and the authority of a URL.
std::string format_host_port(const std::string& host, std::uint16_t port);

/// True when `address` is an IP literal of the loopback network: IPv4 127.0.0.0/8 or IPv6
/// ::1 (a name such as "localhost" is not, nor is an IPv4-mapped IPv6 address). POSIX
/// inet_pton, no resolver. Thread-safe.
bool is_loopback_address(const std::string& address);

}  // namespace dltrain
