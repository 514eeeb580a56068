// What the control server and the metrics endpoint share: binding a listener and
// checking a bearer token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>

namespace dltrain::control {

/// Opens, binds (SO_REUSEADDR) and listens on `address`:`port` with `acceptor`; returns the
/// bound port. `what` names the listener in the error ("control server"). Throws
/// ConfigError(`field`) for an address that is not an IP literal, IoError when it cannot
/// bind or listen.
std::uint16_t listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& address, std::uint16_t port,
                        const std::string& what, const std::string& field);

/// `Authorization` header value `header` is exactly "Bearer <token>" (token_matches).
/// Pure, thread-safe.
bool bearer_matches(std::string_view header, const std::string& token);

/// `given` is exactly `token`, compared by their SHA-256 digests in constant time (so
/// neither a token's bytes nor its length show in the time taken); an empty `token`
/// matches nothing. Pure, thread-safe.
bool token_matches(std::string_view given, const std::string& token);

/// The token of an `Authorization: Bearer <token>` header value; "" for any other value.
std::string_view bearer_token(std::string_view header);

}  // namespace dltrain::control
