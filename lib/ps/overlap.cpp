#include "ps/overlap.h"

#include <algorithm>

namespace dltrain::ps {

PartitionTracker::PartitionTracker(const std::vector<std::int64_t>& tensor_sizes, const ps::PartitionLayout& layout)
    : sizes_(tensor_sizes), parts_(tensor_sizes.size()), lengths_(layout.partitions.size(), 0) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < sizes_.size(); ++i) {
    for (const auto& p : layout.partitions) {
      const std::int64_t lo = std::max(off, p.offset), hi = std::min(off + sizes_[i], p.offset + p.length);
      if (hi > lo) parts_[i].emplace_back(p.key, hi - lo);
    }
    offsets_.push_back(off);
    off += sizes_[i];
  }
  for (const auto& p : layout.partitions) lengths_[p.key] = p.length;
  begin_step();
}

void PartitionTracker::begin_step() {
  remaining_ = lengths_;
  claimed_.assign(lengths_.size(), false);
  got_.assign(sizes_.size(), false);
}

std::vector<std::uint32_t> PartitionTracker::arrived(std::size_t i) {
  got_[i] = true;
  std::vector<std::uint32_t> done;
  for (const auto& [key, floats] : parts_[i]) {
    remaining_[key] -= floats;
    if (remaining_[key] == 0) done.push_back(key);
  }
  return done;
}

bool PartitionTracker::claim(std::uint32_t key) {
  if (claimed_[key]) return false;
  claimed_[key] = true;
  return true;
}

void PartitionTracker::zero_missing(const ps::Partition& p, std::span<float> grads) const {
  for (std::size_t i = 0; i < sizes_.size(); ++i) {
    if (got_[i]) continue;
    const std::int64_t lo = std::max(offsets_[i], p.offset), hi = std::min(offsets_[i] + sizes_[i], p.offset + p.length);
    if (hi > lo) std::fill(grads.begin() + lo, grads.begin() + hi, 0.0f);
  }
}

}  // namespace dltrain::ps
