// The data dispatch of an elastic job (docs/training.md, "Elastic jobs"): which training
// examples each worker reads when the number of workers changes within an epoch. Pure
// bookkeeping, no sockets: PS shard 0 serves it (wire kClaim), unit-tested directly.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace dltrain::ps {

/// One chunk of an epoch: positions [index·B, min(n, (index+1)·B)) of that epoch's
/// permutation of the training set (data::epoch_permutation), B the job's batch size.
struct Chunk {
  std::uint32_t epoch = 0;
  std::uint32_t index = 0;
  bool operator==(const Chunk&) const = default;
};

/// What the dispatch has done so far (monotonic counters).
struct DispatchStats {
  std::uint64_t served = 0;    ///< chunks handed out (fresh and again)
  std::uint64_t returned = 0;  ///< chunks given back unfinished (a leave, a new process)
  std::uint64_t reissued = 0;  ///< returned chunks handed out again
};

/// Chunks handed out on demand, as ElasticDL's master hands out data shards ("dynamic
/// data sharding"): every epoch has `chunks_per_epoch` chunks; a worker claims a few at a
/// time and later acknowledges the ones it trained on, in the order it got them.
///
/// Exactly once within an epoch, whatever the membership does: a fresh chunk is handed
/// out once; a chunk given back (a leaving worker releases what it claimed and did not
/// train on; a new process of a rank gives back what its predecessor had claimed and not
/// acknowledged) is handed out again before any fresh one, to a claim for its epoch or a
/// later one. The one exception is a crash: the chunks a dead process trained on but had
/// not acknowledged yet (at most its claim window) are trained on again by whoever gets
/// them — at least once, never lost.
///
/// Thread-safety: every method may be called from any thread (one mutex).
class ChunkDispatch {
 public:
  /// Flags of a claim.
  static constexpr std::uint32_t kFresh = 1;    ///< a new process of this rank: its predecessor's claims go back first
  static constexpr std::uint32_t kRelease = 2;  ///< the rank leaves: after the acknowledgement, the rest go back

  /// Worker `rank` acknowledges the first `acked` chunks it still held (trained on), then
  /// claims up to `want` chunks for `epoch` (0 <= want <= 1024): given-back chunks of
  /// epochs <= `epoch` first (oldest first), then fresh ones of `epoch`. Returns them in
  /// the order they are to be trained on; empty when `epoch` has none left (the worker
  /// moves to the next epoch). `chunks_per_epoch` (>= 1) is fixed by the first claim.
  /// Throws ProtocolError (nothing changes) when `acked` exceeds what the rank holds,
  /// `want` is out of range, `chunks_per_epoch` is 0 or differs from the first claim's,
  /// or the flags are unknown.
  /// `gone`, when given, names the ranks gone without leaving (StepBarrier::gone): what
  /// they hold goes back first, under the same lock as the claim, so that a rank whose new
  /// process claims meanwhile keeps what it got.
  std::vector<Chunk> claim(std::uint32_t rank, std::uint32_t epoch, std::uint32_t want, std::uint32_t acked,
                           std::uint32_t flags, std::uint32_t chunks_per_epoch,
                           const std::function<std::vector<std::uint32_t>()>& gone = nullptr);

  /// Chunks `rank` holds (claimed, not acknowledged).
  std::size_t held(std::uint32_t rank) const;
  DispatchStats stats() const;

 private:
  void give_back(std::deque<Chunk>& held);

  mutable std::mutex mu_;
  std::uint32_t per_epoch_ = 0;                     ///< 0 until the first claim
  std::map<std::uint32_t, std::uint32_t> next_;     ///< per epoch: the next fresh chunk
  std::map<std::uint32_t, std::deque<Chunk>> held_; ///< per rank, in the order handed out
  std::vector<Chunk> again_;                        ///< given back, sorted by (epoch, index)
  DispatchStats stats_;
};

}  // namespace dltrain::ps
