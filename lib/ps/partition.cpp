#include "ps/partition.h"

#include <algorithm>
#include <numeric>

#include "common/errors.h"

namespace dltrain::ps {

std::vector<Partition> PartitionLayout::for_shard(int shard) const {
  std::vector<Partition> out;
  for (const auto& p : partitions) {
    if (p.shard == shard) out.push_back(p);
  }
  return out;
}

std::int64_t PartitionLayout::shard_floats(int shard) const {
  std::int64_t n = 0;
  for (const auto& p : partitions) {
    if (p.shard == shard) n += p.length;
  }
  return n;
}

PartitionLayout make_layout(const std::vector<std::int64_t>& tensor_sizes, std::int64_t max_floats,
                            int num_shards) {
  if (max_floats < 1) {
    throw ConfigError("ps.partition_size", "expected >= 1, got " + std::to_string(max_floats));
  }
  if (num_shards < 1) {
    throw ConfigError("ps_shards", "expected >= 1, got " + std::to_string(num_shards));
  }
  PartitionLayout layout;
  layout.num_shards = num_shards;
  std::int64_t offset = 0;
  std::int64_t open_len = 0;  // floats in the partition being packed
  auto close_open = [&] {
    if (open_len > 0) {
      layout.partitions.push_back({0, offset - open_len, open_len, 0});
      open_len = 0;
    }
  };
  for (std::size_t i = 0; i < tensor_sizes.size(); ++i) {
    const std::int64_t n = tensor_sizes[i];
    if (n < 1) {
      throw ConfigError("model", "tensor " + std::to_string(i) + " has " + std::to_string(n) +
                                     " elements; expected >= 1");
    }
    if (n > max_floats) {
      close_open();
      const std::int64_t pieces = (n + max_floats - 1) / max_floats;
      std::int64_t start = offset;
      for (std::int64_t k = 0; k < pieces; ++k) {
        const std::int64_t len = n / pieces + (k < n % pieces ? 1 : 0);
        layout.partitions.push_back({0, start, len, 0});
        start += len;
      }
      offset += n;
      continue;
    }
    if (open_len + n > max_floats) close_open();
    open_len += n;
    offset += n;
  }
  close_open();
  layout.total_floats = offset;
  for (std::size_t k = 0; k < layout.partitions.size(); ++k) {
    layout.partitions[k].key = static_cast<std::uint32_t>(k);
  }
  // LPT placement.
  std::vector<std::size_t> order(layout.partitions.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return layout.partitions[a].length > layout.partitions[b].length;
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(num_shards), 0);
  for (std::size_t idx : order) {
    auto it = std::min_element(load.begin(), load.end());
    const int shard = static_cast<int>(it - load.begin());
    layout.partitions[idx].shard = shard;
    *it += layout.partitions[idx].length;
  }
  return layout;
}

}  // namespace dltrain::ps
