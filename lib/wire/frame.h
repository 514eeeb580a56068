// Data-plane frames between workers and PS shards.
//
// A frame is a fixed 48-byte little-endian header followed by `payload_bytes` bytes:
//
//   offset size field          meaning
//   0      4    magic          0x52544C44 ("DLTR" in memory order)
//   4      2    version        kProtocolVersion
//   6      2    type           MessageType
//   8      8    job            numeric job id
//   16     8    seq            sequence number (per connection, echoed in replies); in an
//                              init and a pull reply: the pushes the values reflect
//   24     4    key            partition key (global partition index)
//   28     2    codec          Codec of the payload
//   30     2    flags          must be 0 in version 1
//   32     4    count          element count of the payload (floats, or index/value pairs);
//                              with codec none, a figure defined by the message type
//   36     4    payload_bytes  bytes that follow the header
//   40     4    scale          fp32: the step size a Push is applied with; 1.0 elsewhere
//   44     4    generation     the job's generation; stale generations are refused
//
// Every length is validated against FrameLimits before any allocation (decode_header
// does not allocate at all). See docs/protocol.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dltrain::wire {

inline constexpr std::uint32_t kMagic = 0x52544C44u;
/// Version 2: init and pull-reply frames carry a push count in `seq` (see MessageType).
inline constexpr std::uint16_t kProtocolVersion = 2;
inline constexpr std::size_t kHeaderSize = 48;

/// Frame types. Requests from a worker carry odd numbers, replies from a PS even ones.
enum class MessageType : std::uint16_t {
  kHello = 1,       ///< worker → PS: payload = u32 rank, u32 num_workers
  kHelloAck = 2,    ///< PS → worker: count = partitions the shard holds so far
  kInit = 3,        ///< worker → PS: dense values of partition `key` that have seen `seq`
                    ///< pushes to it (0: a model's initial values; a resync offers the
                    ///< replica's count); no reply; kept by an unknown key or one whose
                    ///< values have seen fewer pushes (ShardState::init)
  kPush = 5,        ///< worker → PS: gradient of partition `key`, applied with `scale`
                    ///< as the learning rate (no reply)
  kPull = 7,        ///< worker → PS: request the current values of partition `key`;
                    ///< count = 1 asks the PS to record them as what this worker holds
  kPullReply = 8,   ///< PS → worker: values of partition `key`; `seq` = the pushes to it
                    ///< they reflect (ShardState::partition_pushes)
  kDone = 9,        ///< worker → PS: worker `key` (its rank) finished training
  kDoneAck = 10,    ///< PS → worker: count = workers that have sent kDone
  kQuery = 11,      ///< worker → PS: ask how many workers are done (count 0, no payload)
  kQueryReply = 12, ///< PS → worker: count = workers done; seq = an elastic job's
                    ///< members still training (joined, neither left nor done), else 0
  kError = 14,      ///< PS → worker: payload = UTF-8 reason; the PS closes afterwards
  kPullSparse = 15, ///< worker → PS: request the top-`count` of x − x_seen for partition
                    ///< `key` (the downlink of sparse bidirectional training); the reply is
                    ///< a kPullReply with a sparse codec
  kPullLowRank = 17, ///< worker → PS: request a low-rank approximation of x − x_seen for
                     ///< partition `key` (ShardState::pull_lowrank); payload (codec
                     ///< low-rank, `count` words) = the partition's block header; the
                     ///< reply is a kPullReply with the low-rank codec
  kPullHalf = 19,    ///< worker → PS: request all of x − x_seen for partition `key` in
                     ///< binary16 (ShardState::pull_half: the fp16 downlink); no payload;
                     ///< the reply is a kPullReply of codec kDenseF16, count = the
                     ///< partition's length
  kLeave = 21,       ///< worker → PS: worker `key` (its rank) leaves an elastic job after
                     ///< its last push (a scale-down): it is no longer waited for; no payload
  kLeaveAck = 22,    ///< PS → worker: count = the job's members still training
  kClaim = 23,       ///< worker → PS: claim training chunks of epoch `seq` for worker `key`
                     ///< (an elastic job's data dispatch, ps/dispatch.h); payload (bytes,
                     ///< 16) = u32 chunks of its earlier claims it finished, u32 flags (1
                     ///< fresh process, 2 release the rest), u32 chunks per epoch, u32
                     ///< chunks wanted (0..1024). Needs no hello.
  kClaimReply = 24,  ///< PS → worker: payload (bytes) = u32 pairs (epoch, chunk), count = bytes
};

/// Payload encodings.
enum class Codec : std::uint16_t {
  kNone = 0,       ///< no payload
  kDenseF32 = 1,   ///< count fp32 values
  kDenseF16 = 2,   ///< count IEEE binary16 values
  kSparseF32 = 3,  ///< count u32 ascending indices, then count fp32 values
  kSparseF16 = 4,  ///< count u32 ascending indices, then count binary16 values
  kBytes = 5,      ///< count raw bytes (Hello, Error)
  kSeededF32 = 6,  ///< count fp32 values at the indices compress::randomk_indices(n, count,
                   ///< seq) draws: the header's seq carries the seed, indices are not sent
  kLowRankF32 = 7, ///< count 4-byte words: u32 B, B × (u32 rows, cols, rank), then per
                   ///< block its floats in full (rank 0) or its factors P and Q in fp32
                   ///< (compress::lowrank_decode; docs/protocol.md)
};

/// Decoded header. Plain value type.
struct FrameHeader {
  std::uint16_t version = kProtocolVersion;
  MessageType type = MessageType::kHello;
  std::uint64_t job = 0;
  std::uint64_t seq = 0;
  std::uint32_t key = 0;
  Codec codec = Codec::kNone;
  std::uint16_t flags = 0;
  std::uint32_t count = 0;
  std::uint32_t payload_bytes = 0;
  float scale = 1.0f;
  std::uint32_t generation = 0;
};

/// Bounds a receiver enforces before allocating a payload buffer.
struct FrameLimits {
  /// Elements per frame: 2^27, room for a partition of up to 2^26 floats (partition_size)
  /// and a low-rank frame's block header beside it (codec 7 counts words); the bytes a
  /// frame may allocate are bounded by max_payload_bytes.
  std::uint32_t max_count = 1u << 27;
  std::uint32_t max_payload_bytes = 1u << 29;   ///< bytes per frame
};

/// Bytes the payload of `codec` with `count` elements must have; returns false when the
/// codec is unknown or the size overflows 32 bits.
bool expected_payload_bytes(Codec codec, std::uint32_t count, std::uint32_t& bytes);

/// Writes `h` into `out` (exactly kHeaderSize bytes). Never fails.
void encode_header(const FrameHeader& h, std::span<std::byte, kHeaderSize> out);

/// Parses and validates a header: magic, version, type, codec, flags, count and
/// payload_bytes against `limits` and against each other. Throws ProtocolError with the
/// field and the value found. Does not allocate. Thread-safe.
FrameHeader decode_header(std::span<const std::byte, kHeaderSize> in,
                          const FrameLimits& limits = {});

/// Human-readable name of a type ("push", "pull-reply", ...), for logs.
std::string to_string(MessageType type);

}  // namespace dltrain::wire
