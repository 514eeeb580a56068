// What the payload of a data-plane frame carries, decoded without a socket: the hello of a
// worker, a push in any of the push codecs (the PS side), a sparse pull reply (the worker
// side). Pure functions over buffers, so that the decoding is unit-tested and fuzzed
// (tests/fuzz/) on its own; the PS session (ps/server.cpp) and the client's pull replies
// (ps/client.cpp) call them. Formats: docs/protocol.md, "Frames".
//
// A payload is passed as the 4-byte words it was read into (std::span<const float>, as
// many words as ⌈payload_bytes / 4⌉): fp32 values are read in place, indices and fp16
// values are copied out byte-wise, so nothing is read through a pointer of another type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/frame.h"

namespace dltrain::ps {

/// The payload of a hello frame: the worker's rank of `workers`.
struct Hello {
  std::uint32_t rank = 0;     ///< [0, workers)
  std::uint32_t workers = 0;  ///< >= 1
};

/// Decodes a hello frame `h` (codec bytes, count 8: u32 rank, u32 workers). Throws
/// ProtocolError naming the field unless the codec is bytes, the count 8, `payload` at
/// least 2 words, workers >= 1 and rank < workers.
Hello decode_hello(const wire::FrameHeader& h, std::span<const float> payload);

/// A push decoded to fp32: dense (`indices` empty, `values` one per coordinate of the
/// partition) or sparse (`values[j]` at coordinate `indices[j]`). The spans point into
/// the payload or into the PayloadScratch given to decode_push, valid until either
/// changes. Whether the indices are ascending and inside the partition and the values
/// finite is checked where the push is applied (ShardState::push / push_sparse), which
/// applies nothing then.
struct PushView {
  bool sparse = false;
  std::span<const std::uint32_t> indices;
  std::span<const float> values;
};

/// Buffers decode_push decodes fp16 values, indices and seeded indices into; one per
/// connection, reused from frame to frame.
struct PayloadScratch {
  std::vector<std::uint32_t> indices;
  std::vector<std::uint16_t> half;
  std::vector<float> values;
};

/// Decodes the payload of push frame `h` to a partition of `length` floats: dense fp32
/// (read in place), dense fp16 (converted, compress/fp16.h), sparse fp32 or fp16 (count
/// u32 indices, then count values), seeded fp32 (count values at the indices
/// compress::randomk_indices(length, count, h.seq) draws), low-rank (count words: a block
/// header, then full blocks and P/Q factors, reconstructed into scratch by
/// compress::lowrank_decode; O(length·rank)). Requires `payload` to hold
/// h.payload_bytes bytes (decode_header checked them against codec and count). Throws
/// ProtocolError when the codec is not a push codec, the scale (the learning rate) is
/// not finite, a seeded count exceeds `length`, or a low-rank header does not describe
/// `length` floats and the payload's values (naming the block and field). O(count); allocates only in `scratch`.
PushView decode_push(const wire::FrameHeader& h, std::span<const float> payload, std::size_t length,
                     PayloadScratch& scratch);

/// Adds a sparse fp32 pull reply of `count` (index, value) pairs (`payload`: count u32
/// indices, then count fp32 values, 2·count words) to `replica`, the worker's copy of the
/// partition: replica[index] += value. Checks every index first (strictly ascending,
/// below replica.size()) and changes nothing when one is bad: throws ProtocolError naming
/// the index and its position. Requires payload.size() >= 2·count.
void apply_sparse_reply(std::span<const float> payload, std::uint32_t count, std::span<float> replica);

}  // namespace dltrain::ps
