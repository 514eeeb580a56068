#include "control/listen.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>

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

namespace {

// SHA-256 of `s`: tokens are compared by their digests, so that neither the time a
// comparison takes nor its early exits reveal a token's bytes or its length.
std::array<unsigned char, 32> digest(std::string_view s) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr);
  return d;
}

}  // namespace

bool bearer_matches(std::string_view header, const std::string& token) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.substr(0, prefix.size()) != prefix) return false;
  return token_matches(header.substr(prefix.size()), token);
}

std::string_view bearer_token(std::string_view header) {
  constexpr std::string_view prefix = "Bearer ";
  return header.substr(0, prefix.size()) == prefix ? header.substr(prefix.size()) : std::string_view();
}

bool token_matches(std::string_view given, const std::string& token) {
  if (token.empty()) return false;
  const auto a = digest(given), b = digest(token);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace dltrain::control
