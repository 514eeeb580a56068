// Frame codec, data-plane handshake and control envelope tests.
#include <array>
#include <cstring>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "wire/auth.h"
#include "wire/control.h"
#include "wire/frame.h"

using namespace dltrain;
using namespace dltrain::wire;

namespace {

using Buf = std::array<std::byte, kHeaderSize>;

Buf encode(const FrameHeader& h) {
  Buf b{};
  encode_header(h, std::span<std::byte, kHeaderSize>(b));
  return b;
}

FrameHeader decode(const Buf& b, const FrameLimits& l = {}) {
  return decode_header(std::span<const std::byte, kHeaderSize>(b), l);
}

std::string error_of(const Buf& b, const FrameLimits& l = {}) {
  try {
    decode(b, l);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

template <typename T>
void poke(Buf& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

}  // namespace

TEST(Frame, RoundTripsEveryMessageType) {
  const std::pair<MessageType, Codec> cases[] = {
      {MessageType::kHello, Codec::kBytes},       {MessageType::kHelloAck, Codec::kNone},
      {MessageType::kInit, Codec::kDenseF32},     {MessageType::kPush, Codec::kDenseF32},
      {MessageType::kPull, Codec::kNone},         {MessageType::kPullReply, Codec::kDenseF32},
      {MessageType::kDone, Codec::kNone},         {MessageType::kDoneAck, Codec::kNone},
      {MessageType::kQuery, Codec::kNone},        {MessageType::kQueryReply, Codec::kNone},
      {MessageType::kError, Codec::kBytes},       {MessageType::kPush, Codec::kSparseF32},
      {MessageType::kPush, Codec::kDenseF16},     {MessageType::kPullReply, Codec::kSparseF16}};
  std::uint32_t n = 1;
  for (auto [type, codec] : cases) {
    FrameHeader h;
    h.type = type;
    h.job = 0x0102030405060708ull + n;
    h.seq = 77 + n;
    h.key = 9 * n;
    h.codec = codec;
    h.count = codec == Codec::kNone ? 0 : 100 + n;
    ASSERT_TRUE(expected_payload_bytes(codec, h.count, h.payload_bytes));
    h.scale = 0.125f * static_cast<float>(n);
    h.generation = 3 + n;
    const FrameHeader d = decode(encode(h));
    EXPECT_EQ(d.type, type) << to_string(type);
    EXPECT_EQ(d.job, h.job);
    EXPECT_EQ(d.seq, h.seq);
    EXPECT_EQ(d.key, h.key);
    EXPECT_EQ(d.codec, codec);
    EXPECT_EQ(d.count, h.count);
    EXPECT_EQ(d.payload_bytes, h.payload_bytes);
    EXPECT_EQ(d.scale, h.scale);
    EXPECT_EQ(d.generation, h.generation);
    ++n;
  }
}

TEST(Frame, LayoutIsLittleEndianAtDocumentedOffsets) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.job = 5;
  h.key = 0x11223344;
  h.codec = Codec::kDenseF32;
  h.count = 2;
  h.payload_bytes = 8;
  const Buf b = encode(h);
  // "DLTR" in memory order, version 2, type 5.
  EXPECT_EQ(static_cast<char>(b[0]), 'D');
  EXPECT_EQ(static_cast<char>(b[1]), 'L');
  EXPECT_EQ(static_cast<char>(b[2]), 'T');
  EXPECT_EQ(static_cast<char>(b[3]), 'R');
  EXPECT_EQ(static_cast<int>(b[4]), 2);
  EXPECT_EQ(static_cast<int>(b[6]), 5);
  EXPECT_EQ(static_cast<int>(b[24]), 0x44);
  EXPECT_EQ(static_cast<int>(b[27]), 0x11);
  EXPECT_EQ(static_cast<int>(b[36]), 8);
}

TEST(Frame, RejectsWrongMagic) {
  Buf b = encode(FrameHeader{});
  poke<std::uint32_t>(b, 0, 0xDEADBEEF);
  EXPECT_EQ(error_of(b), "frame magic: expected 0x52544C44, got 0xDEADBEEF");
}

TEST(Frame, RejectsWrongVersion) {
  Buf b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 4, 1);  // a version-1 peer: its pull replies carry no push count
  EXPECT_EQ(error_of(b), "frame version: expected 2, got 1");
}

TEST(Frame, RejectsUnknownTypeAndCodecAndFlags) {
  Buf b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 6, 999);
  EXPECT_EQ(error_of(b), "frame type: unknown value 999");
  b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 28, 42);
  EXPECT_NE(error_of(b).find("frame codec: unknown value 42"), std::string::npos);
  b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 30, 1);
  EXPECT_EQ(error_of(b), "frame flags: expected 0, got 1");
}

TEST(Frame, RejectsOversizedCountsBeforeAllocating) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.codec = Codec::kDenseF32;
  h.count = 1000;
  h.payload_bytes = 4000;
  FrameLimits small{100, 1u << 20};
  EXPECT_EQ(error_of(encode(h), small), "frame count: 1000 exceeds the limit 100");
  // A hostile header claiming 4 GiB - 1 of payload.
  h.count = 1u << 30;
  h.payload_bytes = 0xFFFFFFFFu;
  EXPECT_NE(error_of(encode(h)).find("exceeds the limit"), std::string::npos);
}

TEST(Frame, RejectsPayloadLengthThatDisagreesWithCodec) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.codec = Codec::kDenseF32;
  h.count = 10;
  h.payload_bytes = 39;  // truncated: 10 floats need 40 bytes
  EXPECT_EQ(error_of(encode(h)), "frame payload_bytes: codec 1 with count 10 needs 40 bytes, header says 39");
  h.codec = Codec::kSparseF32;
  h.payload_bytes = 40;  // 10 index/value pairs need 80
  EXPECT_EQ(error_of(encode(h)), "frame payload_bytes: codec 3 with count 10 needs 80 bytes, header says 40");
}

TEST(Frame, PayloadSizesPerCodec) {
  std::uint32_t b = 0;
  ASSERT_TRUE(expected_payload_bytes(Codec::kDenseF16, 7, b));
  EXPECT_EQ(b, 14u);
  ASSERT_TRUE(expected_payload_bytes(Codec::kSparseF16, 7, b));
  EXPECT_EQ(b, 42u);
  EXPECT_FALSE(expected_payload_bytes(Codec::kSparseF32, 0x40000000u, b));  // overflows 32 bits
}

TEST(ControlEnvelope, ParsesRequestsRepliesAndErrors) {
  auto req = parse_envelope(make_request("7", "submit", {{"job_toml", "x"}}));
  EXPECT_EQ(req.id, "7");
  EXPECT_EQ(req.type, "submit");
  EXPECT_EQ(req.body["job_toml"], "x");
  auto ok = parse_envelope(make_reply("7", {{"job", "job-1"}}));
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.body["job"], "job-1");
  auto err = parse_envelope(make_error("8", error_code::kInvalidJob, "batch_size: bad", "batch_size"));
  EXPECT_FALSE(err.ok);
  EXPECT_EQ(err.error["code"], "invalid_job");
  EXPECT_EQ(err.error["field"], "batch_size");
  auto ev = parse_envelope(make_event({{"event", "progress"}}));
  EXPECT_EQ(ev.type, "event");
  EXPECT_TRUE(ev.id.empty());
}

TEST(ControlEnvelope, RejectsMalformedMessagesWithTheField) {
  auto msg = [](const std::string& text) {
    try {
      parse_envelope(text);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_EQ(msg("[1]"), "control message: expected a JSON object");
  EXPECT_EQ(msg(R"({"id":"1","type":"list"})"), "control message field \"v\": expected the protocol version (integer)");
  EXPECT_EQ(msg(R"({"v":2,"id":"1","type":"list"})"),
            "control message field \"v\": version 2 is not supported (this build speaks version 1)");
  EXPECT_EQ(msg(R"({"v":1,"id":"1"})"), "control message field \"type\": expected a non-empty string");
  EXPECT_EQ(msg(R"({"v":1,"type":"list"})"), "control message field \"id\": required for type \"list\"");
  EXPECT_EQ(msg(R"({"v":1,"id":"1","type":"list","body":[]})"), "control message field \"body\": expected an object");
}

namespace {

std::string hex(std::span<const std::uint8_t> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (auto c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// The fixed inputs of the known-answer tests below.
struct AuthVector {
  std::array<std::uint8_t, 32> key{};
  Nonce nonce{};
  AuthVector() {
    for (int i = 0; i < 32; ++i) {
      key[i] = static_cast<std::uint8_t>(i);           // 00 01 .. 1f
      nonce[i] = static_cast<std::uint8_t>(0xa0 + i);  // a0 a1 .. bf
    }
  }
};

}  // namespace

TEST(DataPlaneAuth, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2; also `printf 'what do ya want for nothing?' | openssl dgst
  // -sha256 -hmac Jefe`.
  EXPECT_EQ(hex(hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(DataPlaneAuth, HandshakeMacsMatchAnIndependentComputation) {
  // Computed with Python's hmac module over the layout docs/protocol.md gives:
  //   import hmac, hashlib, struct
  //   key = bytes(range(32)); nonce = bytes(range(0xa0, 0xc0))
  //   msg = nonce + struct.pack('<QI', 7, 3) + b"dltrain data plane v1: worker"
  //   hmac.new(key, msg, hashlib.sha256).hexdigest()
  // and the same with b"dltrain data plane v1: ps shard" for the shard's proof.
  AuthVector v;
  EXPECT_EQ(hex(auth_mac(v.key, v.nonce, 7, 3, kWorkerContext)),
            "939902a31d848c46ddd23b9f100cd25e83ba2610033d06d9a57b75aeb2cdf1ab");
  EXPECT_EQ(hex(auth_mac(v.key, v.nonce, 7, 3, kShardContext)),
            "5a17b9d8d05759d9177090cb3482dd3b3469d8ec1c1fc284f61d526872381704");
  // Every input matters: another generation, job, nonce or key gives another MAC.
  const Mac m = auth_mac(v.key, v.nonce, 7, 3, kWorkerContext);
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, v.nonce, 7, 2, kWorkerContext)));
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, v.nonce, 8, 3, kWorkerContext)));
  Nonce other = v.nonce;
  other[31] ^= 1;
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, other, 7, 3, kWorkerContext)));
  auto key2 = v.key;
  key2[0] ^= 1;
  EXPECT_FALSE(macs_equal(m, auth_mac(key2, v.nonce, 7, 3, kWorkerContext)));
  EXPECT_TRUE(macs_equal(m, auth_mac(v.key, v.nonce, 7, 3, kWorkerContext)));
}

TEST(DataPlaneAuth, MessagesHaveTheDocumentedBytes) {
  AuthVector v;
  std::array<std::uint8_t, kChallengeSize> c{};
  encode_challenge(v.nonce, c);
  // magic "DLTA", version 1, type 1, then the nonce.
  EXPECT_EQ(hex(std::span(c).first(8)), "444c544101000100");
  EXPECT_EQ(hex(std::span(c).subspan(8)), hex(v.nonce));
  EXPECT_EQ(decode_challenge(c), v.nonce);

  AuthAnswer a;
  a.job = 0x0102030405060708ull;
  a.generation = 0x0a0b0c0d;
  a.nonce = v.nonce;
  a.mac = auth_mac(v.key, v.nonce, a.job, a.generation, kWorkerContext);
  std::array<std::uint8_t, kAnswerSize> b{};
  encode_answer(a, b);
  EXPECT_EQ(hex(std::span(b).first(24)), "444c544101000200" "0807060504030201" "0d0c0b0a" "00000000");
  EXPECT_EQ(hex(std::span(b).subspan(24, 32)), hex(a.nonce));
  EXPECT_EQ(hex(std::span(b).subspan(56)), hex(a.mac));
  const AuthAnswer back = decode_answer(b);
  EXPECT_EQ(back.job, a.job);
  EXPECT_EQ(back.generation, a.generation);
  EXPECT_EQ(back.nonce, a.nonce);
  EXPECT_EQ(back.mac, a.mac);

  std::array<std::uint8_t, kProofSize> p{};
  encode_proof(a.mac, p);
  EXPECT_EQ(hex(std::span(p).first(8)), "444c544101000300");
  EXPECT_EQ(decode_proof(p), a.mac);
}

TEST(DataPlaneAuth, DecodersRefuseForeignBytesNamingTheField) {
  AuthVector v;
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::array<std::uint8_t, kAnswerSize> b{};
  encode_answer(AuthAnswer{}, b);
  auto bad = b;
  bad[0] = 0x44;
  bad[3] = 0x52;  // a frame's magic "DLTR": a worker that skipped the handshake
  EXPECT_EQ(error_of([&] { decode_answer(bad); }),
            "handshake answer magic: expected 0x41544C44, got 0x52544C44 (not a dltrain data-plane peer, or an "
            "older version)");
  bad = b;
  bad[4] = 2;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer version: expected 1, got 2");
  bad = b;
  bad[6] = 3;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer type: expected 2, got 3");
  bad = b;
  bad[20] = 1;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer reserved field: expected 0, got 1");
  std::array<std::uint8_t, kChallengeSize> c{};
  encode_challenge(v.nonce, c);
  std::array<std::uint8_t, kProofSize> p{};
  std::memcpy(p.data(), c.data(), kProofSize);  // a challenge where a proof belongs
  EXPECT_EQ(error_of([&] { decode_proof(p); }), "handshake proof type: expected 3, got 1");
}

TEST(DataPlaneAuth, NoncesAreFresh) {
  // 256 random bits: two equal nonces would mean a broken generator.
  EXPECT_NE(random_nonce(), random_nonce());
}
