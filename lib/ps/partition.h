// Cutting a model's flat parameter vector into partitions and placing them on PS shards.
#pragma once

#include <cstdint>
#include <vector>

namespace dltrain::ps {

/// One contiguous slice of the flat parameter vector, owned by one PS shard.
struct Partition {
  std::uint32_t key = 0;     ///< global partition index, 0-based, in flat-vector order
  std::int64_t offset = 0;   ///< first float in the flat parameter vector
  std::int64_t length = 0;   ///< floats, in [1, max_floats]
  int shard = 0;             ///< owning PS shard, [0, num_shards)
};

/// The partition table of one job. Every worker computes the same table from the same
/// model, so it is never sent over the wire.
struct PartitionLayout {
  std::vector<Partition> partitions;  ///< ordered by offset, keys 0..n-1
  std::int64_t total_floats = 0;      ///< sum of all lengths
  int num_shards = 1;

  /// Partitions owned by `shard`, in key order.
  std::vector<Partition> for_shard(int shard) const;
  /// Floats held by `shard`.
  std::int64_t shard_floats(int shard) const;
};

/// Builds the layout for tensors of `tensor_sizes` floats (in the model's parameter
/// order). Consecutive whole tensors are packed into one partition while it stays
/// within `max_floats`; a tensor larger than `max_floats` is cut into
/// ceil(size / max_floats) near-equal pieces. Partitions are then placed on shards
/// largest-first onto the least-loaded shard (LPT scheduling, within 4/3 of the optimal
/// maximum load; Graham 1969), ties broken by lower key and lower shard index, so the
/// result is deterministic.
/// Throws ConfigError when a size is < 1, max_floats < 1 or num_shards < 1.
PartitionLayout make_layout(const std::vector<std::int64_t>& tensor_sizes, std::int64_t max_floats,
                            int num_shards);

}  // namespace dltrain::ps
