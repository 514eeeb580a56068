#include "ps/shard_state.h"

#include <algorithm>

#include "common/errors.h"

namespace dltrain::ps {

ShardState::ShardState(double momentum) : momentum_(static_cast<float>(momentum)) {}

ShardState::Slot* ShardState::find(std::uint32_t key) const {
  std::lock_guard lock(map_mu_);
  auto it = slots_.find(key);
  return it == slots_.end() ? nullptr : it->second.get();
}

bool ShardState::init(std::uint32_t key, std::span<const float> values) {
  std::lock_guard lock(map_mu_);
  auto it = slots_.find(key);
  if (it != slots_.end()) {
    if (it->second->x.size() != values.size()) {
      throw ProtocolError("init of partition " + std::to_string(key) + ": length " +
                          std::to_string(values.size()) + " differs from the known " +
                          std::to_string(it->second->x.size()));
    }
    return false;
  }
  auto slot = std::make_unique<Slot>();
  slot->x.assign(values.begin(), values.end());
  slot->v.assign(values.size(), 0.0f);
  slots_.emplace(key, std::move(slot));
  return true;
}

void ShardState::push(std::uint32_t key, std::span<const float> grad, float lr) {
  Slot* s = find(key);
  if (s == nullptr) {
    throw ProtocolError("push to partition " + std::to_string(key) + ", which this shard does not hold");
  }
  std::lock_guard lock(s->mu);
  if (s->x.size() != grad.size()) {
    throw ProtocolError("push to partition " + std::to_string(key) + ": length " +
                        std::to_string(grad.size()) + ", expected " + std::to_string(s->x.size()));
  }
  float* x = s->x.data();
  float* v = s->v.data();
  const float* g = grad.data();
  const float m = momentum_;
  const std::size_t n = grad.size();
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = m * v[i] + g[i];
    x[i] -= lr * v[i];
  }
  std::lock_guard mlock(map_mu_);
  ++pushes_;
}

void ShardState::pull(std::uint32_t key, std::span<float> out) const {
  Slot* s = find(key);
  if (s == nullptr) {
    throw ProtocolError("pull of partition " + std::to_string(key) + ", which this shard does not hold");
  }
  std::lock_guard lock(s->mu);
  if (s->x.size() != out.size()) {
    throw ProtocolError("pull of partition " + std::to_string(key) + ": length " +
                        std::to_string(out.size()) + ", expected " + std::to_string(s->x.size()));
  }
  std::copy(s->x.begin(), s->x.end(), out.begin());
}

std::int64_t ShardState::length(std::uint32_t key) const {
  Slot* s = find(key);
  return s == nullptr ? -1 : static_cast<std::int64_t>(s->x.size());
}

std::size_t ShardState::num_partitions() const {
  std::lock_guard lock(map_mu_);
  return slots_.size();
}

std::uint64_t ShardState::pushes() const {
  std::lock_guard lock(map_mu_);
  return pushes_;
}

std::size_t ShardState::mark_done(std::uint32_t rank) {
  std::lock_guard lock(map_mu_);
  done_.insert(rank);
  return done_.size();
}

std::size_t ShardState::done_count() const {
  std::lock_guard lock(map_mu_);
  return done_.size();
}

}  // namespace dltrain::ps
