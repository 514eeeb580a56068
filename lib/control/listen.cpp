#include "control/listen.h"

#include <openssl/crypto.h>

#include "common/errors.h"

namespace dltrain::control {

namespace asio = boost::asio;

std::uint16_t listen_on(asio::ip::tcp::acceptor& acceptor, const std::string& address, std::uint16_t port,
                        const std::string& what, const std::string& field) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) throw ConfigError(field, "not an IP address: \"" + address + "\"");
  const asio::ip::tcp::endpoint ep(addr, port);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw IoError(what + " cannot listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  return acceptor.local_endpoint().port();
}

bool bearer_matches(std::string_view header, const std::string& token) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || header.substr(0, prefix.size()) != prefix) return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
}

std::string_view bearer_token(std::string_view header) {
  constexpr std::string_view prefix = "Bearer ";
  return header.substr(0, prefix.size()) == prefix ? header.substr(prefix.size()) : std::string_view();
}

bool token_matches(std::string_view given, const std::string& token) {
  if (token.empty() || given.size() != token.size()) return false;
  return CRYPTO_memcmp(given.data(), token.data(), token.size()) == 0;
}

}  // namespace dltrain::control
