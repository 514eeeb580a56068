#include "ps/sync.h"

#include <algorithm>
#include <limits>

#include "common/errors.h"

namespace dltrain::ps {

StepBarrier::StepBarrier(SyncOptions options, ShardState& state) : opt_(options), state_(state) {}

StepBarrier::Part& StepBarrier::part(std::uint32_t key) {
  auto it = parts_.find(key);
  if (it == parts_.end()) {
    Part p;
    p.clock.assign(workers_, 0);
    p.staged.assign(workers_, false);
    it = parts_.emplace(key, std::move(p)).first;
  }
  return it->second;
}

bool StepBarrier::live(std::uint32_t rank) const {
  return !dropped_[rank] && !left_[rank] && !state_.is_done(rank);
}

std::uint32_t StepBarrier::live_count() const {
  std::uint32_t n = 0;
  for (std::uint32_t r = 0; r < workers_; ++r) n += live(r) ? 1 : 0;
  return n;
}

// The smallest clock of the live workers other than `except` (-1: none excepted); the
// largest value when there is none, so that nobody waits for nobody.
std::uint64_t StepBarrier::min_live_clock(const Part& p, std::int64_t except) const {
  std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
  for (std::uint32_t r = 0; r < workers_; ++r) {
    if (static_cast<std::int64_t>(r) != except && live(r)) m = std::min(m, p.clock[r]);
  }
  return m;
}

bool StepBarrier::may_read(const Part& p, std::uint32_t rank) const {
  switch (opt_.mode) {
    case SyncMode::kAsync:
      return true;
    case SyncMode::kSsp: {
      const std::uint64_t slowest = min_live_clock(p, -1);
      return slowest == std::numeric_limits<std::uint64_t>::max() || p.clock[rank] <= slowest + opt_.staleness;
    }
    case SyncMode::kBsp:
      return p.applied >= p.clock[rank];
  }
  return true;
}

// kBsp: applies the open step once every live worker but backup_workers of them pushed.
void StepBarrier::maybe_apply(std::uint32_t key, Part& p) {
  if (opt_.mode != SyncMode::kBsp || p.staged_count == 0) return;
  std::uint32_t missing = 0;
  for (std::uint32_t r = 0; r < workers_; ++r) missing += (live(r) && !p.staged[r]) ? 1 : 0;
  if (missing > opt_.backup_workers) return;
  const float factor = static_cast<float>(p.staged_count + missing) / static_cast<float>(p.staged_count);
  state_.apply_staged(key, p.step_lr, factor, p.staged_count);
  ++p.applied;
  ++stats_.steps;
  std::fill(p.staged.begin(), p.staged.end(), false);
  p.staged_count = 0;
}

// A worker that was dropped (or reconnects) takes the current clock at every partition.
void StepBarrier::rejoin(std::uint32_t rank) {
  for (auto& [key, p] : parts_) {
    if (opt_.mode == SyncMode::kBsp) {
      p.clock[rank] = p.staged[rank] ? p.applied + 1 : p.applied;
    } else {
      const std::uint64_t others = min_live_clock(p, rank);
      if (others != std::numeric_limits<std::uint64_t>::max()) p.clock[rank] = others;
    }
  }
}

void StepBarrier::collect(std::vector<Release>& out, std::chrono::steady_clock::time_point now) {
  for (auto& [key, p] : parts_) {
    maybe_apply(key, p);
    auto& ws = p.waiters;
    for (auto it = ws.begin(); it != ws.end();) {
      if (!may_read(p, it->rank)) {
        ++it;
        continue;
      }
      stats_.wait_seconds += std::chrono::duration<double>(now - it->since).count();
      const std::uint64_t slowest = min_live_clock(p, -1);
      if (slowest != std::numeric_limits<std::uint64_t>::max() && p.clock[it->rank] > slowest) {
        stats_.max_lead = std::max(stats_.max_lead, p.clock[it->rank] - slowest);
      }
      out.push_back(std::move(it->release));
      it = ws.erase(it);
    }
  }
}

std::uint64_t StepBarrier::join(std::uint32_t rank, std::uint32_t workers) {
  std::lock_guard lock(mu_);
  if (opt_.mode == SyncMode::kAsync && !opt_.elastic) return next_token_++;  // nothing to wait for, nothing checked
  if (workers_ == 0) {
    if (opt_.mode == SyncMode::kBsp && opt_.backup_workers >= workers) {
      throw ProtocolError("hello: backup_workers (" + std::to_string(opt_.backup_workers) +
                          ") must be less than the job's " + std::to_string(workers) + " workers");
    }
    workers_ = workers;
    dropped_.assign(workers, false);
    left_.assign(workers, false);
    away_since_.assign(workers, std::nullopt);
    if (opt_.elastic) {
      for (std::uint32_t r = 0; r < workers; ++r) {
        if (r >= opt_.initial_workers) left_[r] = true;
        else away_since_[r] = created_;  // expected; gone if it never connects
      }
    }
    token_.assign(workers, 0);
    for (auto& [key, p] : parts_) {
      p.clock.assign(workers, 0);
      p.staged.assign(workers, false);
    }
  } else if (workers != workers_) {
    throw ProtocolError("hello: worker " + std::to_string(rank) + " of " + std::to_string(workers) +
                        ", but this shard serves a job of " + std::to_string(workers_) + " workers");
  }
  if (rank >= workers_) {
    throw ProtocolError("hello: rank " + std::to_string(rank) + " out of range [0, " + std::to_string(workers_) + ")");
  }
  if (dropped_[rank]) {
    dropped_[rank] = false;
    ++stats_.rejoins;
  }
  if (left_[rank]) {
    left_[rank] = false;
    ++stats_.joins;
  }
  away_since_[rank].reset();
  rejoin(rank);
  token_[rank] = next_token_++;
  return token_[rank];
}

void StepBarrier::leave(std::uint32_t rank, std::uint64_t token) {
  if (opt_.mode == SyncMode::kAsync && !opt_.elastic) return;
  std::vector<Release> out;
  {
    std::lock_guard lock(mu_);
    if (rank >= workers_ || token_[rank] != token) return;  // a newer connection of the rank
    if (opt_.elastic && !left_[rank] && !state_.is_done(rank)) away_since_[rank] = std::chrono::steady_clock::now();
    if (opt_.mode == SyncMode::kAsync || dropped_[rank] || left_[rank] || state_.is_done(rank)) {
      return;  // it was not waited for anyway
    }
    dropped_[rank] = true;
    ++stats_.departures;
    collect(out, std::chrono::steady_clock::now());
  }
  for (auto& r : out) r();
}

std::uint32_t StepBarrier::leave_job(std::uint32_t rank) {
  if (!opt_.elastic) throw ProtocolError("leave: the job is not elastic");
  std::vector<Release> out;
  std::uint32_t members = 0;
  {
    std::lock_guard lock(mu_);
    if (rank >= workers_) throw ProtocolError("leave: rank " + std::to_string(rank) + " never said hello");
    if (!left_[rank]) {
      left_[rank] = true;
      ++stats_.leaves;
    }
    const auto now = std::chrono::steady_clock::now();
    collect(out, now);
    for (std::uint32_t r = 0; r < workers_; ++r) members += is_member(r, now) ? 1 : 0;
  }
  for (auto& r : out) r();
  return members;
}

bool StepBarrier::is_member(std::uint32_t rank, std::chrono::steady_clock::time_point now) const {
  if (left_[rank] || state_.is_done(rank)) return false;
  return !away_since_[rank] || now - *away_since_[rank] < opt_.member_grace;
}

std::uint32_t StepBarrier::members_training() const {
  if (!opt_.elastic) return 0;
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (workers_ == 0) return now - created_ < opt_.member_grace ? opt_.initial_workers : 0;  // nobody said hello yet
  std::uint32_t members = 0;
  for (std::uint32_t r = 0; r < workers_; ++r) members += is_member(r, now) ? 1 : 0;
  return members;
}

std::vector<std::uint32_t> StepBarrier::gone() const {
  std::vector<std::uint32_t> out;
  if (!opt_.elastic) return out;
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (std::uint32_t r = 0; r < workers_; ++r) {
    if (!left_[r] && !state_.is_done(r) && !is_member(r, now)) out.push_back(r);
  }
  return out;
}

void StepBarrier::done(std::uint32_t rank) {
  (void)rank;  // ShardState::mark_done recorded it; live() reads it from there
  if (opt_.mode == SyncMode::kAsync) return;
  std::vector<Release> out;
  {
    std::lock_guard lock(mu_);
    collect(out, std::chrono::steady_clock::now());
  }
  for (auto& r : out) r();
}

StepBarrier::PushOutcome StepBarrier::push(std::uint32_t rank, std::uint32_t key,
                                           std::span<const std::uint32_t> indices, std::span<const float> values,
                                           bool sparse, float lr) {
  if (opt_.mode == SyncMode::kAsync) {
    if (sparse) {
      state_.push_sparse(key, indices, values, lr);
    } else {
      state_.push(key, values, lr);
    }
    return PushOutcome::kApplied;
  }
  std::vector<Release> out;
  PushOutcome outcome = PushOutcome::kApplied;
  {
    std::lock_guard lock(mu_);
    if (rank >= workers_) throw ProtocolError("push before hello");
    Part& p = part(key);
    const bool was_dropped = dropped_[rank];
    if (was_dropped) {
      dropped_[rank] = false;
      ++stats_.rejoins;
      rejoin(rank);
    }
    if (opt_.mode == SyncMode::kSsp) {
      if (sparse) {
        state_.push_sparse(key, indices, values, lr);
      } else {
        state_.push(key, values, lr);
      }
      ++p.clock[rank];
    } else if (was_dropped || p.staged[rank] || p.clock[rank] + 1 <= p.applied) {
      // Its step was applied without it (it was dropped, or a backup worker's push came
      // late), or it already pushed the open step: dropped; it is now at the applied step
      // (or at the open one, whose application its pull then waits for).
      outcome = PushOutcome::kLate;
      ++stats_.late_pushes;
      p.clock[rank] = p.staged[rank] ? p.applied + 1 : p.applied;
    } else {
      if (sparse) {
        state_.stage_sparse(key, indices, values);
      } else {
        state_.stage(key, values);
      }
      outcome = PushOutcome::kStaged;
      if (p.staged_count == 0) p.step_lr = lr;
      p.staged[rank] = true;
      ++p.staged_count;
      p.clock[rank] = p.applied + 1;
    }
    collect(out, std::chrono::steady_clock::now());
  }
  for (auto& r : out) r();
  return outcome;
}

bool StepBarrier::pull(std::uint32_t rank, std::uint32_t key, Release release) {
  if (opt_.mode == SyncMode::kAsync) return true;
  std::lock_guard lock(mu_);
  if (rank >= workers_) throw ProtocolError("pull before hello");
  Part& p = part(key);
  if (may_read(p, rank)) {
    const std::uint64_t slowest = min_live_clock(p, -1);
    if (slowest != std::numeric_limits<std::uint64_t>::max() && p.clock[rank] > slowest) {
      stats_.max_lead = std::max(stats_.max_lead, p.clock[rank] - slowest);
    }
    return true;
  }
  ++stats_.waits;
  p.waiters.push_back(Waiter{rank, std::chrono::steady_clock::now(), std::move(release)});
  return false;
}

std::vector<std::uint32_t> StepBarrier::expire(std::chrono::steady_clock::time_point now) {
  std::vector<std::uint32_t> gone;
  std::vector<Release> out;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, p] : parts_) {
      for (const auto& w : p.waiters) {
        if (now - w.since < opt_.barrier_timeout) continue;
        for (std::uint32_t r = 0; r < workers_; ++r) {
          if (!live(r) || r == w.rank) continue;
          const bool holds = opt_.mode == SyncMode::kBsp ? !p.staged[r]
                                                         : p.clock[w.rank] > p.clock[r] + opt_.staleness;
          if (holds) {
            dropped_[r] = true;
            ++stats_.dropped;
            gone.push_back(r);
          }
        }
      }
    }
    if (!gone.empty()) collect(out, now);
  }
  for (auto& r : out) r();
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  return gone;
}

bool StepBarrier::waiting() const {
  std::lock_guard lock(mu_);
  for (const auto& [key, p] : parts_) {
    if (!p.waiters.empty()) return true;
  }
  return false;
}

std::vector<StepBarrier::Release> StepBarrier::take_waiters() {
  std::vector<Release> out;
  std::lock_guard lock(mu_);
  for (auto& [key, p] : parts_) {
    for (auto& w : p.waiters) out.push_back(std::move(w.release));
    p.waiters.clear();
  }
  return out;
}

SyncStats StepBarrier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::int64_t StepBarrier::clock(std::uint32_t rank, std::uint32_t key) const {
  std::lock_guard lock(mu_);
  auto it = parts_.find(key);
  if (it == parts_.end() || rank >= it->second.clock.size()) return -1;
  return static_cast<std::int64_t>(it->second.clock[rank]);
}

}  // namespace dltrain::ps
