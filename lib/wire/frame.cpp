#include "wire/frame.h"

#include <cstdio>
#include <cstring>
#include <ostream>

#include "common/enforce.h"
#include "common/errors.h"
#include "wire/le_bytes.h"

namespace dltrain::wire {
namespace {

// A 32-bit value that ENFORCE messages print as 0x%08X (the magic number).
struct Hex32 {
  std::uint32_t v;
  bool operator==(const Hex32&) const = default;
  friend std::ostream& operator<<(std::ostream& out, const Hex32& x) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08X", x.v);
    return out << buf;
  }
};

bool known_type(std::uint16_t t) {
  switch (static_cast<MessageType>(t)) {
    case MessageType::kHello:
    case MessageType::kHelloAck:
    case MessageType::kInit:
    case MessageType::kPush:
    case MessageType::kPull:
    case MessageType::kPullReply:
    case MessageType::kDone:
    case MessageType::kDoneAck:
    case MessageType::kQuery:
    case MessageType::kQueryReply:
    case MessageType::kError:
    case MessageType::kPullSparse:
    case MessageType::kPullLowRank:
    case MessageType::kPullHalf:
    case MessageType::kLeave:
    case MessageType::kLeaveAck:
    case MessageType::kClaim:
    case MessageType::kClaimReply:
      return true;
  }
  return false;
}

}  // namespace

bool expected_payload_bytes(Codec codec, std::uint32_t count, std::uint32_t& bytes) {
  std::uint64_t per = 0;
  switch (codec) {
    case Codec::kNone: per = 0; break;
    case Codec::kDenseF32: per = 4; break;
    case Codec::kDenseF16: per = 2; break;
    case Codec::kSparseF32: per = 8; break;
    case Codec::kSparseF16: per = 6; break;
    case Codec::kBytes: per = 1; break;
    case Codec::kSeededF32: per = 4; break;
    case Codec::kLowRankF32: per = 4; break;
    default: return false;
  }
  std::uint64_t total = per * count;
  if (total > 0xFFFFFFFFull) return false;
  bytes = static_cast<std::uint32_t>(total);
  return true;
}

void encode_header(const FrameHeader& h, std::span<std::byte, kHeaderSize> out) {
  store_le<std::uint32_t>(out.data(), 0, kMagic);
  store_le<std::uint16_t>(out.data(), 4, h.version);
  store_le<std::uint16_t>(out.data(), 6, static_cast<std::uint16_t>(h.type));
  store_le<std::uint64_t>(out.data(), 8, h.job);
  store_le<std::uint64_t>(out.data(), 16, h.seq);
  store_le<std::uint32_t>(out.data(), 24, h.key);
  store_le<std::uint16_t>(out.data(), 28, static_cast<std::uint16_t>(h.codec));
  store_le<std::uint16_t>(out.data(), 30, h.flags);
  store_le<std::uint32_t>(out.data(), 32, h.count);
  store_le<std::uint32_t>(out.data(), 36, h.payload_bytes);
  store_le<float>(out.data(), 40, h.scale);
  store_le<std::uint32_t>(out.data(), 44, h.generation);
}

FrameHeader decode_header(std::span<const std::byte, kHeaderSize> in, const FrameLimits& limits) {
  DLTRAIN_ENFORCE_EQ(Hex32{load_le<std::uint32_t>(in.data(), 0)}, Hex32{kMagic}, ProtocolError, "frame magic");
  FrameHeader h;
  h.version = load_le<std::uint16_t>(in.data(), 4);
  DLTRAIN_ENFORCE_EQ(h.version, kProtocolVersion, ProtocolError, "frame version");
  const auto type = load_le<std::uint16_t>(in.data(), 6);
  if (!known_type(type)) throw ProtocolError("frame type: unknown value " + std::to_string(type));
  h.type = static_cast<MessageType>(type);
  h.job = load_le<std::uint64_t>(in.data(), 8);
  h.seq = load_le<std::uint64_t>(in.data(), 16);
  h.key = load_le<std::uint32_t>(in.data(), 24);
  const auto codec = load_le<std::uint16_t>(in.data(), 28);
  h.codec = static_cast<Codec>(codec);
  h.flags = load_le<std::uint16_t>(in.data(), 30);
  DLTRAIN_ENFORCE_EQ(h.flags, 0u, ProtocolError, "frame flags");
  h.count = load_le<std::uint32_t>(in.data(), 32);
  h.payload_bytes = load_le<std::uint32_t>(in.data(), 36);
  h.scale = load_le<float>(in.data(), 40);
  h.generation = load_le<std::uint32_t>(in.data(), 44);
  if (h.count > limits.max_count) {
    throw ProtocolError("frame count: " + std::to_string(h.count) + " exceeds the limit " +
                        std::to_string(limits.max_count));
  }
  if (h.payload_bytes > limits.max_payload_bytes) {
    throw ProtocolError("frame payload_bytes: " + std::to_string(h.payload_bytes) +
                        " exceeds the limit " + std::to_string(limits.max_payload_bytes));
  }
  std::uint32_t want = 0;
  if (!expected_payload_bytes(h.codec, h.count, want)) {
    throw ProtocolError("frame codec: unknown value " + std::to_string(codec) +
                        " or count overflow");
  }
  if (want != h.payload_bytes) {
    throw ProtocolError("frame payload_bytes: codec " + std::to_string(codec) + " with count " +
                        std::to_string(h.count) + " needs " + std::to_string(want) +
                        " bytes, header says " + std::to_string(h.payload_bytes));
  }
  return h;
}

std::string to_string(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kHelloAck: return "hello-ack";
    case MessageType::kInit: return "init";
    case MessageType::kPush: return "push";
    case MessageType::kPull: return "pull";
    case MessageType::kPullReply: return "pull-reply";
    case MessageType::kDone: return "done";
    case MessageType::kDoneAck: return "done-ack";
    case MessageType::kQuery: return "query";
    case MessageType::kQueryReply: return "query-reply";
    case MessageType::kError: return "error";
    case MessageType::kPullSparse: return "pull-sparse";
    case MessageType::kPullLowRank: return "pull-lowrank";
    case MessageType::kPullHalf: return "pull-fp16";
    case MessageType::kLeave: return "leave";
    case MessageType::kLeaveAck: return "leave-ack";
    case MessageType::kClaim: return "claim";
    case MessageType::kClaimReply: return "claim-reply";
  }
  return "unknown(" + std::to_string(static_cast<unsigned>(type)) + ")";
}

}  // namespace dltrain::wire
