// Data-plane authentication: the challenge–response handshake that every worker ↔ PS
// shard connection runs before its first frame (docs/protocol.md, "Handshake").
//
//   PS shard → worker   challenge  40 bytes   magic, version, type 1, nonce_ps (32)
//   worker → PS shard   answer     88 bytes   magic, version, type 2, job, generation,
//                                             0, nonce_w (32), mac_w (32)
//   PS shard → worker   proof      40 bytes   magic, version, type 3, mac_ps (32)
//
//   mac_w  = HMAC-SHA256(secret, nonce_ps ‖ u64le job ‖ u32le generation ‖ kWorkerContext)
//   mac_ps = HMAC-SHA256(secret, nonce_w  ‖ u64le job ‖ u32le generation ‖ kShardContext)
//
// The shard checks mac_w against its own job and generation, so a worker of another job,
// of an older generation of this job, or without the secret is refused before the shard
// reads a frame header; the worker checks mac_ps, so it only talks to a shard that knows
// the secret too. The two context strings keep one side's MAC from being replayed as the
// other's. The handshake authenticates the peers; it does not encrypt or authenticate
// the frames that follow.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace dltrain::wire {

inline constexpr std::uint32_t kAuthMagic = 0x41544C44u;  ///< "DLTA" in memory order
inline constexpr std::uint16_t kAuthVersion = 1;
inline constexpr std::size_t kNonceSize = 32;     ///< bytes, from OpenSSL's CSPRNG
inline constexpr std::size_t kMacSize = 32;       ///< HMAC-SHA256 output, bytes
inline constexpr std::size_t kChallengeSize = 40;
inline constexpr std::size_t kAnswerSize = 88;
inline constexpr std::size_t kProofSize = 40;
/// Context strings (ASCII, no terminator) at the end of each MAC's input.
inline constexpr std::string_view kWorkerContext = "dltrain data plane v1: worker";
inline constexpr std::string_view kShardContext = "dltrain data plane v1: ps shard";

using Nonce = std::array<std::uint8_t, kNonceSize>;
using Mac = std::array<std::uint8_t, kMacSize>;

/// Message types of the handshake (u16 at offset 6).
enum class AuthType : std::uint16_t { kChallenge = 1, kAnswer = 2, kProof = 3 };

/// A worker's answer to a challenge.
struct AuthAnswer {
  std::uint64_t job = 0;         ///< the job the worker belongs to
  std::uint32_t generation = 0;  ///< the generation it was started for
  Nonce nonce{};                 ///< the worker's challenge to the shard
  Mac mac{};                     ///< proves the worker knows the secret
};

/// HMAC-SHA256 (RFC 2104 over FIPS 180-4 SHA-256) of `data` under `key`, by OpenSSL.
/// Throws Error if OpenSSL fails. Thread-safe.
Mac hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);

/// HMAC-SHA256(secret, nonce ‖ u64le job ‖ u32le generation ‖ context): the MAC each side
/// of the handshake proves knowledge of the job secret with. Throws Error if OpenSSL
/// fails. Thread-safe.
Mac auth_mac(std::span<const std::uint8_t> secret, const Nonce& nonce, std::uint64_t job,
             std::uint32_t generation, std::string_view context);

/// Compares two MACs in constant time (CRYPTO_memcmp), so that the time a comparison
/// takes does not reveal how many leading bytes matched.
bool macs_equal(const Mac& a, const Mac& b);

/// A fresh nonce from OpenSSL's CSPRNG. Throws Error when the generator fails.
Nonce random_nonce();

/// Encoders write exactly the message's size; they never fail.
void encode_challenge(const Nonce& nonce, std::span<std::uint8_t, kChallengeSize> out);
void encode_answer(const AuthAnswer& a, std::span<std::uint8_t, kAnswerSize> out);
void encode_proof(const Mac& mac, std::span<std::uint8_t, kProofSize> out);

/// Decoders check magic, version, type and the reserved field and throw ProtocolError
/// naming the field and the value found. They do not check any MAC.
Nonce decode_challenge(std::span<const std::uint8_t, kChallengeSize> in);
AuthAnswer decode_answer(std::span<const std::uint8_t, kAnswerSize> in);
Mac decode_proof(std::span<const std::uint8_t, kProofSize> in);

}  // namespace dltrain::wire
