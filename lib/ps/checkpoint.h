// Checkpoints of a PS shard's state: a small versioned binary file, written atomically,
// checked with CRC-32 when read (format: docs/protocol.md, "PS shard checkpoints").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/partition.h"
#include "ps/shard_state.h"

namespace dltrain::ps {

/// "DLCK" in memory order, the first 4 bytes of every checkpoint file.
inline constexpr std::uint32_t kCheckpointMagic = 0x4B434C44;
/// The format version this code writes. It also reads version 1, whose partitions carry
/// no push count (each is read as having seen the shard's total).
inline constexpr std::uint16_t kCheckpointVersion = 2;
/// Bytes of the fixed header, of each partition's header (version 2; 16 in version 1)
/// and of the CRC-32 trailer.
inline constexpr std::size_t kCheckpointHeaderSize = 40;
inline constexpr std::size_t kCheckpointPartitionHeaderSize = 24;
inline constexpr std::size_t kCheckpointV1PartitionHeaderSize = 16;
inline constexpr std::size_t kCheckpointTrailerSize = 4;
/// Upper bounds checked when reading, before anything is allocated: values per
/// partition (the data plane's frame limit, 2^26) and finished-worker ranks.
inline constexpr std::uint32_t kCheckpointMaxPartitionLength = 1u << 26;
inline constexpr std::uint32_t kCheckpointMaxDone = 1u << 20;

/// Serialises `snap` of shard `shard` of job `job` (little-endian; header, finished
/// ranks, partitions, CRC-32 of everything before it). Throws ProtocolError when a
/// partition is empty, longer than kCheckpointMaxPartitionLength or has a momentum
/// buffer of another length.
std::vector<std::byte> encode_checkpoint(const ShardSnapshot& snap, std::uint64_t job, std::uint32_t shard);

/// Parses a checkpoint written for shard `shard` of job `job`. Every length is checked
/// against the bytes that remain before anything is allocated, and the CRC-32 before any
/// field is trusted. Throws ProtocolError naming the problem: too short (truncated), bad
/// magic or version, checksum mismatch (corrupted), another job or shard, a length that
/// runs past the end, keys or ranks not strictly ascending, trailing bytes.
ShardSnapshot decode_checkpoint(std::span<const std::byte> bytes, std::uint64_t job, std::uint32_t shard);

/// Writes `bytes` to `path` atomically: to `path + ".tmp"` (mode 0600, truncated first,
/// so a stale temporary file from a crash is simply overwritten), fsync, rename over
/// `path`, fsync of the directory. A crash at any point leaves either the old file or
/// the new one at `path`. Throws IoError naming the step that failed.
void write_file_atomically(const std::string& path, std::span<const std::byte> bytes);

/// Reads the checkpoint at `path`: std::nullopt when there is none (ENOENT); throws
/// IoError when it cannot be read and ProtocolError when it is refused (decode_checkpoint).
std::optional<ShardSnapshot> read_checkpoint_file(const std::string& path, std::uint64_t job, std::uint32_t shard);

/// The shard index a worker's replica file is written under: a replica holds every
/// partition of the job (all shards), in the checkpoint format with no momentum buffers.
inline constexpr std::uint32_t kWorkerReplicaShard = 0xFFFFFFFFu;

/// Saves a worker's parameter replica (`params`, layout.total_floats floats, split by
/// `layout`'s partitions) as a checkpoint file of shard kWorkerReplicaShard of job `job`;
/// `steps` (the worker's global step) goes in the pushes field. Atomic
/// (write_file_atomically). The file is what a re-assigned job's new PS shards are rebuilt
/// from when the shard that held a partition was lost (docs/operations.md). Throws
/// ConfigError when `params` does not match the layout, IoError when writing fails.
void write_replica_file(const std::string& path, std::span<const float> params, const PartitionLayout& layout,
                        std::uint64_t job, std::uint64_t steps);

/// Copies the parameters of a replica (`snap`, as decode_checkpoint returned it for shard
/// kWorkerReplicaShard) into `params` (layout.total_floats floats) and returns its steps.
/// Throws ConfigError when `params` does not match the layout and ProtocolError, copying
/// nothing, unless `snap` holds exactly `layout`'s partitions (keys ascending) with their
/// lengths.
std::uint64_t replica_into(const ShardSnapshot& snap, std::span<float> params, const PartitionLayout& layout);

/// Reads a replica written by write_replica_file into `params` (layout.total_floats).
/// Throws IoError when there is no file or it cannot be read, ProtocolError when it is
/// refused (decode_checkpoint) or does not hold exactly `layout`'s partitions with their
/// lengths. Returns the steps it was saved at.
std::uint64_t read_replica_file(const std::string& path, std::span<float> params, const PartitionLayout& layout,
                                std::uint64_t job);

/// Writes checkpoints of one shard's state to one file.
///
/// Thread-safety: save() may be called from any thread; calls are serialised (they share
/// the temporary file).
class ShardCheckpointer {
 public:
  ShardCheckpointer(std::string path, std::uint64_t job, std::uint32_t shard, std::shared_ptr<ShardState> state);

  /// Snapshots the state and writes it atomically. Returns false, writing nothing, while
  /// the shard holds no partition (so an empty state never replaces a checkpoint that
  /// could still be loaded); true once written. Throws IoError when writing fails (the
  /// previous checkpoint is then still in place).
  bool save();

  /// The checkpoint file's path, as given.
  const std::string& path() const { return path_; }
  /// Checkpoints written so far, and the size in bytes of the last one.
  std::uint64_t saves() const;
  std::uint64_t last_bytes() const;
  /// Unix time (s) the last checkpoint was written; 0 before the first.
  double last_save_unix() const;

 private:
  const std::string path_;
  const std::uint64_t job_;
  const std::uint32_t shard_;
  const std::shared_ptr<ShardState> state_;
  mutable std::mutex mu_;
  std::uint64_t saves_ = 0, last_bytes_ = 0;
  double last_save_unix_ = 0;
};

}  // namespace dltrain::ps
