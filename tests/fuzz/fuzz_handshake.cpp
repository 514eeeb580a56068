// Fuzzes the data-plane handshake (wire/auth.h): the challenge and proof a worker reads
// from a PS shard (40 bytes each) and the answer a shard reads from a worker (88 bytes),
// as the shard checks it (ps/server.cpp, check_answer).
//
// Input: the bytes of one message; the first 40 are also read as a challenge and as a
// proof, the first 88 as an answer. Checks, beyond "no crash":
//   - a message that decodes encodes back to the same bytes;
//   - a decoder refuses exactly the messages whose magic, version, type or reserved
//     field is wrong;
//   - the answer's MAC, checked as the shard checks it, is accepted exactly when it is
//     the HMAC of the shard's nonce, job and generation (here: when the input carries the
//     right one, which a seed does).
#include <array>
#include <cstdint>
#include <cstring>

#include "common/errors.h"
#include "fuzz_check.h"
#include "wire/auth.h"

using namespace dltrain;

namespace {

// The shard's side of the seeds' handshakes (tests/fuzz/make_corpus.cpp writes the same).
constexpr std::array<std::uint8_t, 32> kSecret = {
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
    0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0};
constexpr wire::Nonce kShardNonce = {0x5a};

template <typename T>
T load(const std::uint8_t* b, std::size_t off) {
  T v;
  std::memcpy(&v, b + off, sizeof v);
  return v;
}

bool prefix_ok(const std::uint8_t* b, wire::AuthType t) {
  return load<std::uint32_t>(b, 0) == wire::kAuthMagic && load<std::uint16_t>(b, 4) == wire::kAuthVersion &&
         load<std::uint16_t>(b, 6) == static_cast<std::uint16_t>(t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size >= wire::kChallengeSize) {
    std::array<std::uint8_t, wire::kChallengeSize> in;
    std::memcpy(in.data(), data, in.size());
    const bool ok_ref = prefix_ok(in.data(), wire::AuthType::kChallenge);
    try {
      const auto nonce = wire::decode_challenge(in);
      FUZZ_CHECK(ok_ref, "decode_challenge accepted a bad prefix");
      std::array<std::uint8_t, wire::kChallengeSize> out;
      wire::encode_challenge(nonce, out);
      FUZZ_CHECK(out == in, "encode_challenge(decode_challenge(b)) != b");
    } catch (const ProtocolError&) {
      FUZZ_CHECK(!ok_ref, "decode_challenge refused a valid challenge");
    }
    const bool proof_ref = prefix_ok(in.data(), wire::AuthType::kProof);
    try {
      const auto mac = wire::decode_proof(in);
      FUZZ_CHECK(proof_ref, "decode_proof accepted a bad prefix");
      std::array<std::uint8_t, wire::kProofSize> out;
      wire::encode_proof(mac, out);
      FUZZ_CHECK(out == in, "encode_proof(decode_proof(b)) != b");
    } catch (const ProtocolError&) {
      FUZZ_CHECK(!proof_ref, "decode_proof refused a valid proof");
    }
  }
  if (size >= wire::kAnswerSize) {
    std::array<std::uint8_t, wire::kAnswerSize> in;
    std::memcpy(in.data(), data, in.size());
    const bool ok_ref = prefix_ok(in.data(), wire::AuthType::kAnswer) && load<std::uint32_t>(in.data(), 20) == 0;
    wire::AuthAnswer a;
    try {
      a = wire::decode_answer(in);
      FUZZ_CHECK(ok_ref, "decode_answer accepted a bad prefix or reserved field");
    } catch (const ProtocolError&) {
      FUZZ_CHECK(!ok_ref, "decode_answer refused a valid answer");
      return 0;
    }
    std::array<std::uint8_t, wire::kAnswerSize> out;
    wire::encode_answer(a, out);
    FUZZ_CHECK(out == in, "encode_answer(decode_answer(b)) != b");
    FUZZ_CHECK(a.job == load<std::uint64_t>(in.data(), 8) && a.generation == load<std::uint32_t>(in.data(), 16),
               "decode_answer read another job or generation");
    // The shard's MAC check, against a MAC computed here from the same inputs.
    const auto expected = wire::auth_mac(kSecret, kShardNonce, a.job, a.generation, wire::kWorkerContext);
    const bool equal = std::memcmp(expected.data(), a.mac.data(), wire::kMacSize) == 0;
    FUZZ_CHECK(wire::macs_equal(expected, a.mac) == equal, "macs_equal disagrees with memcmp");
    // The shard's own proof must never verify as a worker's answer (distinct contexts).
    const auto shard_mac = wire::auth_mac(kSecret, kShardNonce, a.job, a.generation, wire::kShardContext);
    FUZZ_CHECK(!wire::macs_equal(shard_mac, expected), "the two contexts give the same MAC");
  }
  return 0;
}
