#include "ps/payload.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "compress/fp16.h"
#include "compress/lowrank.h"
#include "compress/topk.h"

namespace dltrain::ps {
namespace {

// `n` u32 (or u16) values copied out of the payload's bytes from byte `offset` on.
template <typename T>
void copy_out(std::span<const float> payload, std::size_t offset, std::size_t n, std::vector<T>& out) {
  out.resize(n);
  if (n != 0) std::memcpy(out.data(), reinterpret_cast<const std::byte*>(payload.data()) + offset, n * sizeof(T));
}

void expect_codec(const wire::FrameHeader& h, wire::Codec c) {
  if (h.codec != c) {
    throw ProtocolError(wire::to_string(h.type) + " frame codec: expected " + std::to_string(static_cast<int>(c)) +
                        ", got " + std::to_string(static_cast<int>(h.codec)));
  }
}

}  // namespace

Hello decode_hello(const wire::FrameHeader& h, std::span<const float> payload) {
  expect_codec(h, wire::Codec::kBytes);
  if (h.count != 8) throw ProtocolError("hello frame count: expected 8, got " + std::to_string(h.count));
  if (payload.size() < 2) {
    throw ProtocolError("hello frame payload: expected 8 bytes, got " + std::to_string(4 * payload.size()));
  }
  std::uint32_t v[2];
  std::memcpy(v, payload.data(), sizeof v);
  if (v[1] == 0 || v[0] >= v[1]) {
    throw ProtocolError("hello: rank " + std::to_string(v[0]) + " of " + std::to_string(v[1]) + " workers");
  }
  return {v[0], v[1]};
}

PushView decode_push(const wire::FrameHeader& h, std::span<const float> payload, std::size_t length,
                     PayloadScratch& scratch) {
  const std::size_t c = h.count;
  // A NaN or infinite learning rate would poison every coordinate it touches, as a NaN
  // gradient would (those are refused where the push is applied).
  if (!std::isfinite(h.scale)) {
    throw ProtocolError("push to partition " + std::to_string(h.key) + ": scale (learning rate) " +
                        std::to_string(h.scale) + " is not finite");
  }
  switch (h.codec) {
    case wire::Codec::kDenseF32:
      return {false, {}, payload.first(c)};
    case wire::Codec::kDenseF16:
      copy_out(payload, 0, c, scratch.half);
      scratch.values.resize(c);
      compress::from_half(scratch.half, scratch.values);
      return {false, {}, scratch.values};
    case wire::Codec::kSparseF32:
      copy_out(payload, 0, c, scratch.indices);
      return {true, scratch.indices, payload.subspan(c, c)};
    case wire::Codec::kSparseF16:
      copy_out(payload, 0, c, scratch.indices);
      copy_out(payload, 4 * c, c, scratch.half);
      scratch.values.resize(c);
      compress::from_half(scratch.half, scratch.values);
      return {true, scratch.indices, scratch.values};
    case wire::Codec::kSeededF32:
      if (c > length) {
        throw ProtocolError("seeded push to partition " + std::to_string(h.key) + ": count " + std::to_string(c) +
                            " exceeds the partition's " + std::to_string(length) + " values");
      }
      compress::randomk_indices(length, c, h.seq, scratch.indices);
      return {true, scratch.indices, payload.first(c)};
    case wire::Codec::kLowRankF32: {
      const std::string where = "low-rank push to partition " + std::to_string(h.key);
      if (c == 0) throw ProtocolError(where + ": no payload");
      copy_out(payload, 0, 1, scratch.indices);
      const std::uint64_t blocks = scratch.indices[0];
      const std::uint64_t words = 1 + 3 * blocks;  // compress::lowrank_header_words, without overflow
      if (blocks == 0 || words > c) {
        throw ProtocolError(where + ": a header of " + std::to_string(blocks) + " blocks needs " +
                            std::to_string(words) + " words, the frame has " + std::to_string(c));
      }
      copy_out(payload, 0, static_cast<std::size_t>(words), scratch.indices);
      scratch.values.resize(length);
      try {
        compress::lowrank_decode(scratch.indices, payload.subspan(words, c - words), scratch.values);
      } catch (const InvalidArgument& e) {
        throw ProtocolError(where + ": " + e.what());
      }
      return {false, {}, scratch.values};
    }
    default:
      throw ProtocolError("push frame codec: " + std::to_string(static_cast<int>(h.codec)) +
                          " is not a push encoding");
  }
}

void apply_sparse_reply(std::span<const float> payload, std::uint32_t count, std::span<float> replica) {
  if (payload.size() / 2 < count) {
    throw InvalidArgument("apply_sparse_reply: " + std::to_string(count) + " pairs need " +
                          std::to_string(2 * static_cast<std::uint64_t>(count)) + " payload words, got " +
                          std::to_string(payload.size()));
  }
  const std::byte* idx = reinterpret_cast<const std::byte*>(payload.data());
  std::uint32_t prev = 0;
  for (std::uint32_t j = 0; j < count; ++j) {
    std::uint32_t i;
    std::memcpy(&i, idx + 4 * static_cast<std::size_t>(j), 4);
    if (i >= replica.size() || (j > 0 && i <= prev)) {
      throw ProtocolError("bad index " + std::to_string(i) + " at position " + std::to_string(j) +
                          " (indices must be strictly ascending and below " + std::to_string(replica.size()) + ")");
    }
    prev = i;
  }
  const float* val = payload.data() + count;
  for (std::uint32_t j = 0; j < count; ++j) {
    std::uint32_t i;
    std::memcpy(&i, idx + 4 * static_cast<std::size_t>(j), 4);
    replica[i] += val[j];
  }
}

}  // namespace dltrain::ps
