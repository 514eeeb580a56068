#include "wire/auth.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/errors.h"
#include "wire/le_bytes.h"

namespace dltrain::wire {
namespace {

void put_prefix(std::uint8_t* out, AuthType type) {
  store_le(out, 0, kAuthMagic);
  store_le(out, 4, kAuthVersion);
  store_le(out, 6, static_cast<std::uint16_t>(type));
}

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", v);
  return b;
}

// Checks the 8-byte prefix every handshake message starts with.
void check_prefix(const std::uint8_t* in, AuthType want, const char* what) {
  const auto magic = load_le<std::uint32_t>(in, 0);
  if (magic != kAuthMagic) {
    throw ProtocolError(std::string("handshake ") + what + " magic: expected " + hex32(kAuthMagic) + ", got " +
                        hex32(magic) + " (not a dltrain data-plane peer, or an older version)");
  }
  const auto version = load_le<std::uint16_t>(in, 4);
  if (version != kAuthVersion) {
    throw ProtocolError(std::string("handshake ") + what + " version: expected " + std::to_string(kAuthVersion) +
                        ", got " + std::to_string(version));
  }
  const auto type = load_le<std::uint16_t>(in, 6);
  if (type != static_cast<std::uint16_t>(want)) {
    throw ProtocolError(std::string("handshake ") + what + " type: expected " +
                        std::to_string(static_cast<int>(want)) + ", got " + std::to_string(type));
  }
}

}  // namespace

Mac hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
  Mac out{};
  unsigned int len = 0;
  // HMAC() with a caller-supplied buffer is OpenSSL 1.1 and 3.x API (not deprecated in 3).
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(), data.size(), out.data(), &len) ==
          nullptr ||
      len != kMacSize) {
    throw Error("OpenSSL HMAC-SHA256 failed");
  }
  return out;
}

Mac auth_mac(std::span<const std::uint8_t> secret, const Nonce& nonce, std::uint64_t job, std::uint32_t generation,
             std::string_view context) {
  std::vector<std::uint8_t> msg(kNonceSize + 8 + 4 + context.size());
  std::memcpy(msg.data(), nonce.data(), kNonceSize);
  store_le(msg.data(), kNonceSize, job);
  store_le(msg.data(), kNonceSize + 8, generation);
  std::memcpy(msg.data() + kNonceSize + 12, context.data(), context.size());
  return hmac_sha256(secret, msg);
}

bool macs_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), kMacSize) == 0; }

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw Error("OpenSSL RAND_bytes failed");
  return n;
}

void encode_challenge(const Nonce& nonce, std::span<std::uint8_t, kChallengeSize> out) {
  put_prefix(out.data(), AuthType::kChallenge);
  std::memcpy(out.data() + 8, nonce.data(), kNonceSize);
}

void encode_answer(const AuthAnswer& a, std::span<std::uint8_t, kAnswerSize> out) {
  put_prefix(out.data(), AuthType::kAnswer);
  store_le(out.data(), 8, a.job);
  store_le(out.data(), 16, a.generation);
  store_le(out.data(), 20, std::uint32_t{0});
  std::memcpy(out.data() + 24, a.nonce.data(), kNonceSize);
  std::memcpy(out.data() + 56, a.mac.data(), kMacSize);
}

void encode_proof(const Mac& mac, std::span<std::uint8_t, kProofSize> out) {
  put_prefix(out.data(), AuthType::kProof);
  std::memcpy(out.data() + 8, mac.data(), kMacSize);
}

Nonce decode_challenge(std::span<const std::uint8_t, kChallengeSize> in) {
  check_prefix(in.data(), AuthType::kChallenge, "challenge");
  Nonce n{};
  std::memcpy(n.data(), in.data() + 8, kNonceSize);
  return n;
}

AuthAnswer decode_answer(std::span<const std::uint8_t, kAnswerSize> in) {
  check_prefix(in.data(), AuthType::kAnswer, "answer");
  const auto reserved = load_le<std::uint32_t>(in.data(), 20);
  if (reserved != 0) {
    throw ProtocolError("handshake answer reserved field: expected 0, got " + std::to_string(reserved));
  }
  AuthAnswer a;
  a.job = load_le<std::uint64_t>(in.data(), 8);
  a.generation = load_le<std::uint32_t>(in.data(), 16);
  std::memcpy(a.nonce.data(), in.data() + 24, kNonceSize);
  std::memcpy(a.mac.data(), in.data() + 56, kMacSize);
  return a;
}

Mac decode_proof(std::span<const std::uint8_t, kProofSize> in) {
  check_prefix(in.data(), AuthType::kProof, "proof");
  Mac m{};
  std::memcpy(m.data(), in.data() + 8, kMacSize);
  return m;
}

}  // namespace dltrain::wire
