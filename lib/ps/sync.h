// The consistency models of a PS shard: asynchronous SGD, bounded staleness (SSP) and
// bulk-synchronous steps (BSP), with backup workers. Pure bookkeeping over a ShardState:
// no sockets and no timers of its own (the shard's session defers a pull through the
// Release callback, and a timer of the server calls expire()), so that it is unit-tested
// directly. docs/training.md, "Consistency models", describes what a user sees.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/sync_mode.h"
#include "ps/shard_state.h"

namespace dltrain::ps {

/// The consistency model of a shard (the job's `sync`, `staleness`, `backup_workers`,
/// `[ps] barrier_timeout`).
struct SyncOptions {
  SyncMode mode = SyncMode::kAsync;
  /// kSsp: the most steps a worker may be ahead of the slowest live worker when its pull
  /// is answered, [0, 2^31). 0 waits as BSP does (but applies pushes one by one).
  std::uint32_t staleness = 0;
  /// kBsp: pushes a step may go without (Chen et al. 2016, "Revisiting distributed
  /// synchronous SGD", §3): the step is applied once live workers − backup_workers of
  /// them have pushed; later pushes for it are dropped and counted. [0, workers).
  std::uint32_t backup_workers = 0;
  /// A pull that has waited this long drops the workers it waits for from the barrier
  /// (they are slow, suspended or hung; a worker whose connection closes is dropped at
  /// once) and the step goes on. A dropped worker rejoins at the current step with its
  /// next hello or push. Must be below the workers' PS timeout, or they give up first.
  std::chrono::milliseconds barrier_timeout{30000};
  /// An elastic job (docs/training.md, "Elastic jobs"): its hellos carry the job's
  /// max_workers; ranks below `initial_workers` (the job's size when the shard started;
  /// 0 for a shard restarted from its checkpoint) are members from the start, the others
  /// once they say hello; a member leaves with leave_job(). Membership is kept in every
  /// mode, async included, for members_training().
  bool elastic = false;
  std::uint32_t initial_workers = 0;
  /// Elastic: a member whose connection closed without a leave or done (its process or
  /// its machine died), or a starting member that never connected, counts as gone after
  /// this long away: it is no member for members_training(), and gone() names it. A
  /// worker that reconnects (a resync, a restart by its agent) within it stays a member.
  std::chrono::milliseconds member_grace{60000};
};

/// What the barrier of a shard has done so far (monotonic counters, except max_lead).
struct SyncStats {
  std::uint64_t steps = 0;          ///< kBsp: steps applied, summed over partitions
  std::uint64_t late_pushes = 0;    ///< kBsp: pushes dropped because their step was applied
  std::uint64_t waits = 0;          ///< pulls that were not answered at once
  double wait_seconds = 0;          ///< time those pulls waited, summed, s
  std::uint64_t dropped = 0;        ///< workers dropped from the barrier by barrier_timeout
  std::uint64_t departures = 0;     ///< workers dropped because their connection closed before they finished
  std::uint64_t rejoins = 0;        ///< dropped workers that joined again
  std::uint64_t joins = 0;          ///< elastic: workers that became members after the start
  std::uint64_t leaves = 0;         ///< elastic: members that left (leave_job)
  /// The largest lead, in steps, of a worker over the slowest live worker at the moment
  /// one of its pulls was answered (kSsp: at most staleness; kBsp: 0).
  std::uint64_t max_lead = 0;
};

/// The step barrier of one PS shard.
///
/// Steps are counted per partition and worker: a worker's k-th push to a partition since
/// it joined is its step k there, and its clock there is the pushes it made. Every worker
/// pushes every partition once per step (PsClient::push_pull), so the clocks of one worker
/// agree across partitions. Ranks [0, workers) are expected from the start, so that the
/// first worker to connect does not run ahead of the others; a rank that finished
/// (ShardState::is_done) or was dropped is not waited for.
///
/// - kAsync: push() applies, pull() answers at once; nothing is recorded.
/// - kSsp: push() applies at once; a pull by a worker at clock c is answered when
///   c − min(clock of live workers) <= staleness.
/// - kBsp: push() stages the gradient for the open step t = applied + 1 of its partition
///   (ShardState::stage); when live − backup_workers pushes (at least one) are staged the
///   step is applied as G = (live / staged) · Σ g (ShardState::apply_staged; the sum,
///   as DGC §2 sums the workers' gradients, so that a step moves as far as `live` async
///   pushes would; the factor is 1 without backup workers) with the learning rate of the
///   step's first push. A push for a step already applied is dropped (late), and its
///   worker's clock set to the applied step. A pull by a worker at clock c is answered once
///   the partition's applied step >= c.
///
/// A worker that joins (hello) or rejoins takes the current clock: kBsp the applied step,
/// kSsp the slowest other live worker's clock.
///
/// Thread-safety: every method may be called from any thread (one mutex). Release
/// callbacks are called without it held, on the thread whose call freed them.
class StepBarrier {
 public:
  /// What push() did with a push.
  enum class PushOutcome { kApplied, kStaged, kLate };
  /// Called once when a deferred pull may be answered.
  using Release = std::function<void()>;

  /// `state` must outlive the barrier.
  StepBarrier(SyncOptions options, ShardState& state);

  const SyncOptions& options() const { return opt_; }

  /// A worker said hello on a new connection as `rank` of `workers`; returns a token for
  /// leave(). In ssp and sync the first hello fixes the job's worker count; a later one
  /// with another count, or backup_workers >= workers, throws ProtocolError.
  std::uint64_t join(std::uint32_t rank, std::uint32_t workers);
  /// The connection with `token` closed: its worker is no longer waited for, unless it
  /// joined again on a newer connection. Releases what that frees.
  void leave(std::uint32_t rank, std::uint64_t token);
  /// Worker `rank` finished (after ShardState::mark_done). Releases what that frees.
  void done(std::uint32_t rank);
  /// Elastic: worker `rank` leaves the job at a step boundary, after its last push (which
  /// counts). From now on no step waits for it, atomically with respect to pushes and
  /// pulls; pulls it held up are released. Its next hello makes it a member again.
  /// Returns members_training(). Throws ProtocolError unless the job is elastic and the
  /// rank in range.
  std::uint32_t leave_job(std::uint32_t rank);
  /// Elastic: the members still training (joined, neither left nor done), slow ones that
  /// were dropped from the barrier included; 0 for a job that is not elastic.
  std::uint32_t members_training() const;
  /// Elastic: the members gone (away longer than member_grace, neither left nor done).
  std::vector<std::uint32_t> gone() const;

  /// Applies or stages a push from `rank` to `key` (see the class comment): `indices`
  /// empty for a dense push. ShardState's checks apply (ProtocolError, nothing changes).
  PushOutcome push(std::uint32_t rank, std::uint32_t key, std::span<const std::uint32_t> indices,
                   std::span<const float> values, bool sparse, float lr);

  /// Whether `rank` may read `key` now; when not, keeps `release` and calls it once it
  /// may (after a push, a leave, a done or expire()).
  bool pull(std::uint32_t rank, std::uint32_t key, Release release);

  /// Drops the workers that pulls waiting longer than barrier_timeout at `now` wait for,
  /// and releases what that frees. Returns the ranks dropped.
  std::vector<std::uint32_t> expire(std::chrono::steady_clock::time_point now);

  /// Whether any pull waits (the server's timer need not run otherwise).
  bool waiting() const;

  /// Removes every waiting pull without answering it and hands its release over (a
  /// stopping server destroys them, and with them the sessions they hold).
  std::vector<Release> take_waiters();

  SyncStats stats() const;

  /// `rank`'s clock at `key` (pushes since it joined, offset by its join point); -1 when
  /// the partition has seen nothing yet.
  std::int64_t clock(std::uint32_t rank, std::uint32_t key) const;

 private:
  struct Waiter {
    std::uint32_t rank;
    std::chrono::steady_clock::time_point since;
    Release release;
  };
  struct Part {
    std::vector<std::uint64_t> clock;  ///< per rank
    std::uint64_t applied = 0;         ///< kBsp: steps applied
    std::vector<bool> staged;          ///< kBsp: ranks whose push is in the open step
    std::uint32_t staged_count = 0;
    float step_lr = 0;
    std::vector<Waiter> waiters;
  };

  Part& part(std::uint32_t key);
  bool live(std::uint32_t rank) const;
  std::uint32_t live_count() const;
  std::uint64_t min_live_clock(const Part& p, std::int64_t except) const;
  bool may_read(const Part& p, std::uint32_t rank) const;
  void maybe_apply(std::uint32_t key, Part& p);
  void rejoin(std::uint32_t rank);
  void collect(std::vector<Release>& out, std::chrono::steady_clock::time_point now);

  const SyncOptions opt_;
  ShardState& state_;
  mutable std::mutex mu_;
  std::uint32_t workers_ = 0;              ///< 0 until the first hello
  std::vector<bool> dropped_;              ///< per rank: not waited for until it rejoins
  std::vector<bool> left_;                 ///< per rank, elastic: not a member (not yet joined, or left)
  /// Per rank, elastic: since when its connection is closed (or, for a starting member,
  /// since the barrier was made); empty while connected.
  std::vector<std::optional<std::chrono::steady_clock::time_point>> away_since_;
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  bool is_member(std::uint32_t rank, std::chrono::steady_clock::time_point now) const;
  std::vector<std::uint64_t> token_;       ///< per rank: its newest connection
  std::uint64_t next_token_ = 1;
  std::map<std::uint32_t, Part> parts_;
  SyncStats stats_;
};

}  // namespace dltrain::ps
