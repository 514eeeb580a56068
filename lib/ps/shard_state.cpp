#include "ps/shard_state.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "compress/fp16.h"
#include "compress/topk.h"

#include "common/errors.h"

namespace dltrain::ps {

ShardState::ShardState(double momentum) : momentum_(static_cast<float>(momentum)) {}

ShardState::Slot* ShardState::find(std::uint32_t key) const {
  std::lock_guard lock(map_mu_);
  auto it = slots_.find(key);
  return it == slots_.end() ? nullptr : it->second.get();
}

InitOutcome ShardState::init(std::uint32_t key, std::span<const float> values, std::uint64_t seen_pushes) {
  const auto bad = std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
  if (bad != values.end()) {
    throw ProtocolError("init of partition " + std::to_string(key) + ": value " +
                        std::to_string(bad - values.begin()) + " is " + std::to_string(*bad) +
                        " (NaN/Inf values are refused)");
  }
  Slot* known = nullptr;
  {
    std::lock_guard lock(map_mu_);
    auto it = slots_.find(key);
    if (it == slots_.end()) {
      auto slot = std::make_unique<Slot>();
      slot->x.assign(values.begin(), values.end());
      if (momentum_ != 0.0f) slot->v.assign(values.size(), 0.0f);
      slot->pushes = seen_pushes;
      slots_.emplace(key, std::move(slot));
      return InitOutcome::kCreated;
    }
    known = it->second.get();  // slots are never removed
  }
  std::lock_guard lock(known->mu);
  if (known->x.size() != values.size()) {
    throw ProtocolError("init of partition " + std::to_string(key) + ": length " + std::to_string(values.size()) +
                        " differs from the known " + std::to_string(known->x.size()));
  }
  if (seen_pushes <= known->pushes) return InitOutcome::kIgnored;
  known->x.assign(values.begin(), values.end());
  known->pushes = seen_pushes;
  rebuilds_.fetch_add(1, std::memory_order_relaxed);
  return InitOutcome::kRebuilt;
}

namespace {

void check_finite(std::span<const float> v, std::uint32_t key) {
  // A binary32 value is NaN or ±Inf exactly when its 8 exponent bits are all ones
  // (IEEE 754-2008, §3.4). The test runs branch-free over blocks, so that the compiler
  // vectorises it (a per-element std::isfinite with an early exit was ~9 % of a PS
  // shard's time under dense push+pull, docs/benchmarks.md); only a block that holds a
  // bad value is searched again for its position.
  constexpr std::size_t kBlock = 4096;
  const std::size_t n = v.size();
  for (std::size_t lo = 0; lo < n; lo += kBlock) {
    const std::size_t hi = std::min(n, lo + kBlock);
    std::uint32_t bad = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      bad |= static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(v[i]) & 0x7f800000u) == 0x7f800000u);
    }
    if (bad == 0) continue;
    for (std::size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(v[i])) {
        throw ProtocolError("push to partition " + std::to_string(key) + ": value " + std::to_string(i) + " is " +
                            std::to_string(v[i]) + " (NaN/Inf gradients are refused)");
      }
    }
  }
}

// The checks of a sparse push (push_sparse, stage_sparse) against a partition of n
// values: counts agree and fit, indices strictly ascending and in range, values finite.
void check_sparse(std::uint32_t key, std::size_t n, std::span<const std::uint32_t> idx, std::span<const float> vals) {
  if (idx.size() != vals.size()) {
    throw ProtocolError("sparse push to partition " + std::to_string(key) + ": " + std::to_string(idx.size()) +
                        " indices but " + std::to_string(vals.size()) + " values");
  }
  if (idx.size() > n) {
    throw ProtocolError("sparse push to partition " + std::to_string(key) + ": count " + std::to_string(idx.size()) +
                        " exceeds the partition's " + std::to_string(n) + " values");
  }
  for (std::size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] >= n) {
      throw ProtocolError("sparse push to partition " + std::to_string(key) + ": index " + std::to_string(idx[j]) +
                          " out of range [0, " + std::to_string(n) + ")");
    }
    if (j > 0 && idx[j] <= idx[j - 1]) {
      throw ProtocolError("sparse push to partition " + std::to_string(key) + ": indices must be strictly ascending (" +
                          std::to_string(idx[j - 1]) + " then " + std::to_string(idx[j]) + ")");
    }
  }
  check_finite(vals, key);
}

}  // namespace

ShardState::Slot* ShardState::checked(std::uint32_t key, const char* what) const {
  Slot* s = find(key);
  if (s == nullptr) {
    throw ProtocolError(std::string(what) + " partition " + std::to_string(key) + ", which this shard does not hold");
  }
  return s;
}

void ShardState::stage(std::uint32_t key, std::span<const float> grad) {
  Slot* s = checked(key, "push to");
  check_finite(grad, key);
  std::lock_guard lock(s->mu);
  if (s->x.size() != grad.size()) {
    throw ProtocolError("push to partition " + std::to_string(key) + ": length " +
                        std::to_string(grad.size()) + ", expected " + std::to_string(s->x.size()));
  }
  if (s->acc.empty()) s->acc.assign(s->x.size(), 0.0f);
  float* a = s->acc.data();
  for (std::size_t i = 0; i < grad.size(); ++i) a[i] += grad[i];
}

void ShardState::stage_sparse(std::uint32_t key, std::span<const std::uint32_t> idx, std::span<const float> vals) {
  Slot* s = checked(key, "push to");
  std::lock_guard lock(s->mu);
  check_sparse(key, s->x.size(), idx, vals);
  if (s->acc.empty()) s->acc.assign(s->x.size(), 0.0f);
  for (std::size_t j = 0; j < idx.size(); ++j) s->acc[idx[j]] += vals[j];
}

void ShardState::apply_staged(std::uint32_t key, float lr, float factor, std::uint64_t contributions) {
  Slot* s = checked(key, "a step of");
  std::lock_guard lock(s->mu);
  const std::size_t n = s->x.size();
  if (s->acc.empty()) s->acc.assign(n, 0.0f);
  float* x = s->x.data();
  float* a = s->acc.data();
  if (s->v.empty()) {
    for (std::size_t i = 0; i < n; ++i) x[i] -= lr * (factor * a[i]);
  } else {
    float* v = s->v.data();
    const float m = momentum_;
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = m * v[i] + factor * a[i];
      x[i] -= lr * v[i];
    }
  }
  std::fill(s->acc.begin(), s->acc.end(), 0.0f);
  s->pushes += contributions;
  pushes_.fetch_add(contributions, std::memory_order_relaxed);
}

void ShardState::push(std::uint32_t key, std::span<const float> grad, float lr) {
  Slot* s = find(key);
  if (s == nullptr) {
    throw ProtocolError("push to partition " + std::to_string(key) + ", which this shard does not hold");
  }
  check_finite(grad, key);
  std::lock_guard lock(s->mu);
  if (s->x.size() != grad.size()) {
    throw ProtocolError("push to partition " + std::to_string(key) + ": length " +
                        std::to_string(grad.size()) + ", expected " + std::to_string(s->x.size()));
  }
  float* x = s->x.data();
  const float* g = grad.data();
  const std::size_t n = grad.size();
  if (s->v.empty()) {
    for (std::size_t i = 0; i < n; ++i) x[i] -= lr * g[i];
  } else {
    float* v = s->v.data();
    const float m = momentum_;
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = m * v[i] + g[i];
      x[i] -= lr * v[i];
    }
  }
  ++s->pushes;
  pushes_.fetch_add(1, std::memory_order_relaxed);
}

void ShardState::push_sparse(std::uint32_t key, std::span<const std::uint32_t> idx, std::span<const float> vals,
                             float lr) {
  Slot* s = checked(key, "push to");
  std::lock_guard lock(s->mu);
  const std::size_t n = s->x.size();
  check_sparse(key, n, idx, vals);
  float* x = s->x.data();
  if (s->v.empty()) {
    for (std::size_t j = 0; j < idx.size(); ++j) x[idx[j]] -= lr * vals[j];
  } else {
    float* v = s->v.data();
    const float m = momentum_;
    for (std::size_t i = 0; i < n; ++i) v[i] *= m;
    for (std::size_t j = 0; j < idx.size(); ++j) v[idx[j]] += vals[j];
    for (std::size_t i = 0; i < n; ++i) x[i] -= lr * v[i];
  }
  ++s->pushes;
  pushes_.fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t ShardState::pull(std::uint32_t key, std::span<float> out, int rank) {
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
  if (rank >= 0) s->seen[rank] = s->x;
  return s->pushes;
}

std::vector<float>& ShardState::difference(Slot& s, std::uint32_t key, int rank, const char* what) {
  auto it = s.seen.find(rank);
  if (it == s.seen.end()) {
    throw ProtocolError(std::string(what) + " of partition " + std::to_string(key) + " by worker " +
                        std::to_string(rank) + " before any dense pull");
  }
  const std::size_t n = s.x.size();
  s.diff.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.diff[i] = s.x[i] - it->second[i];
  return it->second;
}

std::uint64_t ShardState::pull_diff(std::uint32_t key, int rank, std::size_t k, std::vector<std::uint32_t>& indices,
                                    std::vector<float>& values) {
  Slot* s = checked(key, "pull of");
  std::lock_guard lock(s->mu);
  auto& seen = difference(*s, key, rank, "sparse pull");
  const std::size_t n = s->x.size();
  if (k > n) {
    throw ProtocolError("sparse pull of partition " + std::to_string(key) + ": k = " + std::to_string(k) +
                        " exceeds the partition's " + std::to_string(n) + " values");
  }
  thread_local compress::TopkScratch scratch;
  compress::topk_sampled(s->diff, k, 0.01, key * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank), indices,
                         scratch);
  values.resize(indices.size());
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const auto i = indices[j];
    values[j] = s->diff[i];
    seen[i] += s->diff[i];
  }
  return s->pushes;
}

std::uint64_t ShardState::pull_half(std::uint32_t key, int rank, std::vector<std::uint16_t>& out) {
  Slot* s = checked(key, "pull of");
  std::lock_guard lock(s->mu);
  auto& seen = difference(*s, key, rank, "fp16 pull");
  const std::size_t n = s->x.size();
  out.resize(n);
  constexpr float kMaxHalf = 65504.0f;  // the largest finite binary16
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = compress::float_to_half(std::clamp(s->diff[i], -kMaxHalf, kMaxHalf));
    out[i] = h;
    seen[i] += compress::half_to_float(h);
  }
  return s->pushes;
}

std::uint64_t ShardState::pull_lowrank(std::uint32_t key, int rank, std::span<const std::uint32_t> blocks,
                                       std::vector<std::uint32_t>& header, std::vector<float>& values) {
  Slot* s = checked(key, "pull of");
  std::lock_guard lock(s->mu);
  const std::size_t n = s->x.size();
  auto& seen = difference(*s, key, rank, "low-rank pull");
  auto& [tiling, state] = s->lowrank[rank];
  if (!state || !std::equal(tiling.begin(), tiling.end(), blocks.begin(), blocks.end())) {
    std::vector<compress::LowRankBlock> parsed;
    try {
      parsed = compress::parse_lowrank_header(blocks, n);
    } catch (const InvalidArgument& e) {
      throw ProtocolError("low-rank pull of partition " + std::to_string(key) + ": " + e.what());
    }
    tiling.assign(blocks.begin(), blocks.end());
    state = std::make_unique<compress::PowerSgdState>(std::vector<std::vector<compress::LowRankBlock>>{std::move(parsed)},
                                                      key * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank));
  }
  state->compress(0, s->diff, header, values);
  // x_seen takes exactly what the worker will add: the decoding of what is sent.
  s->decoded.resize(n);
  compress::lowrank_decode(header, values, s->decoded);
  for (std::size_t i = 0; i < n; ++i) seen[i] += s->decoded[i];
  return s->pushes;
}

std::size_t ShardState::state_bytes() const {
  std::lock_guard lock(map_mu_);
  std::size_t b = 0;
  for (const auto& [k, slot] : slots_) {
    std::lock_guard sl(slot->mu);
    b += 4 * (slot->x.size() + slot->v.size() + slot->acc.size());
    for (const auto& [r, v] : slot->seen) b += 4 * v.size();
  }
  return b;
}

std::int64_t ShardState::length(std::uint32_t key) const {
  Slot* s = find(key);
  return s == nullptr ? -1 : static_cast<std::int64_t>(s->x.size());
}

std::size_t ShardState::num_partitions() const {
  std::lock_guard lock(map_mu_);
  return slots_.size();
}

std::uint64_t ShardState::pushes() const { return pushes_.load(std::memory_order_relaxed); }

std::uint64_t ShardState::partition_pushes(std::uint32_t key) const {
  Slot* s = find(key);
  if (s == nullptr) throw ProtocolError("partition " + std::to_string(key) + " is not held by this shard");
  std::lock_guard lock(s->mu);
  return s->pushes;
}

std::uint64_t ShardState::rebuilds() const { return rebuilds_.load(std::memory_order_relaxed); }

std::size_t ShardState::mark_done(std::uint32_t rank) {
  std::lock_guard lock(map_mu_);
  done_.insert(rank);
  return done_.size();
}

std::size_t ShardState::done_count() const {
  std::lock_guard lock(map_mu_);
  return done_.size();
}

bool ShardState::is_done(std::uint32_t rank) const {
  std::lock_guard lock(map_mu_);
  return done_.count(rank) != 0;
}

ShardSnapshot ShardState::snapshot() const {
  ShardSnapshot snap;
  std::vector<std::pair<std::uint32_t, Slot*>> slots;
  {
    std::lock_guard lock(map_mu_);
    snap.done.assign(done_.begin(), done_.end());
    snap.pushes = pushes_.load(std::memory_order_relaxed);
    for (const auto& [k, slot] : slots_) slots.emplace_back(k, slot.get());
  }
  // Slots are never removed, so the pointers stay valid without map_mu_.
  snap.partitions.reserve(slots.size());
  for (const auto& [k, slot] : slots) {
    ShardSnapshot::Partition p;
    p.key = k;
    std::lock_guard sl(slot->mu);
    p.x = slot->x;
    p.v = slot->v;
    p.pushes = slot->pushes;
    snap.partitions.push_back(std::move(p));
  }
  return snap;
}

void ShardState::restore(ShardSnapshot snap) {
  std::map<std::uint32_t, std::unique_ptr<Slot>> slots;
  for (auto& p : snap.partitions) {
    const std::string what = "restoring partition " + std::to_string(p.key);
    if (p.x.empty()) throw ProtocolError(what + ": no values");
    if (momentum_ != 0.0f && p.v.size() != p.x.size()) {
      throw ProtocolError(what + ": momentum buffer of " + std::to_string(p.v.size()) + " values for " +
                          std::to_string(p.x.size()) + " parameters (this shard's momentum is " +
                          std::to_string(momentum_) + ")");
    }
    if (momentum_ == 0.0f && !p.v.empty()) {
      throw ProtocolError(what + ": it has a momentum buffer but this shard's momentum is 0");
    }
    auto slot = std::make_unique<Slot>();
    slot->x = std::move(p.x);
    slot->v = std::move(p.v);
    slot->pushes = p.pushes;
    if (!slots.emplace(p.key, std::move(slot)).second) throw ProtocolError(what + ": the key appears twice");
  }
  std::lock_guard lock(map_mu_);
  slots_ = std::move(slots);
  done_ = std::set<std::uint32_t>(snap.done.begin(), snap.done.end());
  pushes_.store(snap.pushes, std::memory_order_relaxed);
}

}  // namespace dltrain::ps
