// The parameter state one PS shard holds, and the SGD it applies to pushes.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <vector>

#include "compress/lowrank.h"

namespace dltrain::ps {

/// A copy of everything a PS shard needs to carry on after a restart (see checkpoint.h):
/// every partition's parameters, momentum buffer and push count, the workers that
/// finished, and the shard's push count. Per-worker x_seen is not included: a restarted shard starts without it,
/// and every worker's first pull after reconnecting is dense, which rebuilds it.
struct ShardSnapshot {
  struct Partition {
    std::uint32_t key = 0;
    std::vector<float> x;  ///< parameters, length n >= 1
    std::vector<float> v;  ///< momentum buffer: empty (shard momentum 0) or length n
    /// Pushes the values reflect (ShardState::partition_pushes), the freshness a
    /// restarted shard compares a worker's replica with.
    std::uint64_t pushes = 0;
  };
  std::vector<Partition> partitions;  ///< ascending key
  std::vector<std::uint32_t> done;    ///< ranks of finished workers, ascending
  std::uint64_t pushes = 0;           ///< ShardState::pushes(): pushes applied, all partitions
};

/// What ShardState::init did with the values it was offered.
enum class InitOutcome {
  kCreated,  ///< the partition was unknown; it now holds the values
  kIgnored,  ///< the partition holds values that reflect at least as many pushes
  kRebuilt,  ///< the offer had seen more pushes: its values replaced the partition's
};

/// Parameters and momentum buffers of the partitions owned by one PS shard.
///
/// A push of gradient g to partition p with learning rate lr applies heavy-ball momentum
/// SGD (Polyak 1964; the PyTorch `torch.optim.SGD` form):
///     v ← m·v + g,   x ← x − lr·v
/// as it arrives (asynchronous SGD: no waiting for other workers).
///
/// Thread-safety: every method may be called concurrently; each partition has its own
/// mutex, so pushes to different partitions proceed in parallel.
class ShardState {
 public:
  /// `momentum` in [0, 1); 0 when the workers apply momentum themselves (DGC).
  explicit ShardState(double momentum);

  /// Offers values for partition `key` (length = values.size()) that reflect
  /// `seen_pushes` pushes to it: 0 for a model's initial values, or the push count a
  /// worker's replica was pulled at (the count pull() and pull_diff() return). An unknown
  /// partition takes them (kCreated). A known one takes them only when they are fresher
  /// than what it holds, seen_pushes > partition_pushes(key) (kRebuilt: a shard restarted
  /// from an older checkpoint, or without one, rebuilds from the freshest replica; the
  /// momentum buffer and every x_seen are kept), and otherwise ignores them (kIgnored:
  /// in particular, of several workers' initial values the first wins — every worker
  /// initialises from the same seed, so they agree). Throws ProtocolError when `key` is
  /// known with a different length or a value is NaN/Inf.
  InitOutcome init(std::uint32_t key, std::span<const float> values, std::uint64_t seen_pushes = 0);

  /// Applies one dense gradient push (see class comment). Throws ProtocolError when the
  /// key is not initialised, the length differs, or a value is NaN/Inf (nothing is
  /// applied then: a bad gradient never reaches the model).
  void push(std::uint32_t key, std::span<const float> grad, float lr);

  /// Applies a sparse push: gradient `values[j]` at coordinate `indices[j]`, zero
  /// elsewhere. With momentum 0 this costs O(k); otherwise the whole momentum buffer
  /// decays (O(n)). Throws ProtocolError, applying nothing, unless the indices are
  /// strictly ascending and < the partition's length, the counts agree and every value
  /// is finite.
  void push_sparse(std::uint32_t key, std::span<const std::uint32_t> indices, std::span<const float> values,
                   float lr);

  /// Synchronous SGD (BSP, ps/sync.h): adds dense gradient `grad` to partition `key`'s
  /// step accumulator instead of applying it. The same checks as push(); nothing is
  /// added when one fails. The accumulator (n floats) is allocated at the first call.
  void stage(std::uint32_t key, std::span<const float> grad);

  /// The sparse form of stage(): adds `values[j]` at coordinate `indices[j]` to the step
  /// accumulator, O(k). The same checks as push_sparse().
  void stage_sparse(std::uint32_t key, std::span<const std::uint32_t> indices, std::span<const float> values);

  /// Applies the accumulated step of `key` and clears the accumulator: with G = factor·acc,
  ///     v ← m·v + G,   x ← x − lr·v      (x ← x − lr·G when m = 0),
  /// the synchronous update of the step's pushes (Chen et al. 2016, §2, summed as DGC §2
  /// sums the workers' gradients; `factor` rescales the pushes of a step that dropped
  /// backup workers' ones). Counts `contributions` pushes (partition_pushes, pushes()).
  /// O(n). Throws ProtocolError when the key is unknown.
  void apply_staged(std::uint32_t key, float lr, float factor, std::uint64_t contributions);

  /// Copies the current values of `key` into `out` (same length). With `rank` >= 0 it
  /// also records that worker `rank` now holds exactly these values (its x_seen, the
  /// base of later pull_diff calls). Returns partition_pushes(key) at the time of the
  /// copy. Throws ProtocolError when the key is unknown or the length differs.
  std::uint64_t pull(std::uint32_t key, std::span<float> out, int rank = -1);

  /// The downlink of sparse bidirectional training (docs/compression.md, "Downlink (PS)"; docs/architecture.md, "Sparse bidirectional
  /// training"): d = x − x_seen[rank]; writes the top-k of |d| (ascending indices) and
  /// their d values, and adds them to x_seen[rank]; the rest of d stays for later pulls.
  /// Requires an earlier pull(key, out, rank). Returns partition_pushes(key) at the time
  /// of the read. Throws ProtocolError otherwise or when k > length.
  std::uint64_t pull_diff(std::uint32_t key, int rank, std::size_t k, std::vector<std::uint32_t>& indices,
                          std::vector<float>& values);

  /// The fp16 downlink (compression method fp16; docs/compression.md, "Downlink (PS)"):
  /// d = x − x_seen[rank] in full, each value rounded to binary16 (compress::
  /// float_to_half, round to nearest even; values beyond ±65504, the largest finite
  /// binary16, sent as ±65504) into `out` (resized to the partition's length), and exactly
  /// their decoding added to x_seen[rank], so that the worker's replica (which adds the
  /// same decoding) and x_seen stay bit-identical and the rounding error stays in
  /// x − x_seen for later pulls (error feedback). Requires an earlier pull(key, out,
  /// rank). Returns partition_pushes(key). Throws ProtocolError for an unknown key or no
  /// dense pull before.
  std::uint64_t pull_half(std::uint32_t key, int rank, std::vector<std::uint16_t>& out);

  /// The low-rank downlink (docs/compression.md, "Low rank"): d = x − x_seen[rank], each
  /// matrix of `blocks` (the tiling the worker sends with its pull: compress::
  /// parse_lowrank_header) compressed by PowerSGD's step with this worker's warm-started Q
  /// (compress::PowerSgdState, kept per worker and partition), full blocks sent as they
  /// are; writes the wire header and values (compress::lowrank_decode's) and adds exactly
  /// their decoding to x_seen[rank], so that the worker's replica and x_seen stay equal and
  /// what was not sent stays in x − x_seen for later pulls. Requires an earlier
  /// pull(key, out, rank). Returns partition_pushes(key). Throws ProtocolError for an
  /// unknown key, no dense pull before, or a header that does not tile the partition.
  std::uint64_t pull_lowrank(std::uint32_t key, int rank, std::span<const std::uint32_t> blocks,
                             std::vector<std::uint32_t>& header, std::vector<float>& values);

  /// Bytes of parameter state held (x, momentum, the BSP step accumulator once staged,
  /// and one x_seen per worker that pulled): 4·n·(1 + [momentum > 0] + [BSP] + workers)
  /// per partition.
  std::size_t state_bytes() const;

  /// Length of partition `key`, or -1 when unknown.
  std::int64_t length(std::uint32_t key) const;

  /// Number of initialised partitions.
  std::size_t num_partitions() const;

  /// Pushes applied so far (all partitions; restored from a checkpoint after a restart).
  std::uint64_t pushes() const;

  /// The pushes partition `key`'s values reflect: those applied to it, counted from the
  /// replica or checkpoint it was last initialised, rebuilt or restored from. Throws
  /// ProtocolError when the key is unknown.
  std::uint64_t partition_pushes(std::uint32_t key) const;

  /// Times init() returned kRebuilt.
  std::uint64_t rebuilds() const;

  /// Records that worker `rank` finished; returns how many distinct workers have.
  std::size_t mark_done(std::uint32_t rank);
  /// Distinct workers that have finished.
  std::size_t done_count() const;
  /// Whether worker `rank` has finished (mark_done, or restored from a checkpoint).
  bool is_done(std::uint32_t rank) const;

  /// Copies the state (see ShardSnapshot). Each partition is copied under its own mutex
  /// while pushes to the others go on, so with concurrent pushes the copy is consistent
  /// per partition, not across partitions — as asynchronous SGD itself is. O(state).
  ShardSnapshot snapshot() const;

  /// Replaces the state by `snap` (a shard being restarted, before it serves anyone);
  /// every x_seen is dropped. Throws ProtocolError, changing nothing, when a partition's
  /// momentum buffer does not match this shard's momentum (non-empty with momentum 0,
  /// or empty with momentum > 0), its lengths differ, or keys repeat.
  void restore(ShardSnapshot snap);

 private:
  struct Slot {
    mutable std::mutex mu;
    std::vector<float> x;  ///< parameters
    std::vector<float> v;  ///< momentum buffer (empty when momentum is 0)
    std::uint64_t pushes = 0;  ///< see partition_pushes()
    std::map<int, std::vector<float>> seen;  ///< x_seen per worker rank
    std::vector<float> diff;                 ///< scratch for pull_diff and pull_lowrank
    std::vector<float> decoded;              ///< scratch: a low-rank pull's decoding
    /// The low-rank downlink's state per worker rank, and the tiling it was made for.
    std::map<int, std::pair<std::vector<std::uint32_t>, std::unique_ptr<compress::PowerSgdState>>> lowrank;
    std::vector<float> acc;                  ///< BSP step accumulator (stage / apply_staged)
  };
  Slot* checked(std::uint32_t key, const char* what) const;
  // With s's mutex held: x − x_seen[rank] into s.diff; returns x_seen[rank]. Throws
  // ProtocolError ("`what` of partition K by worker R before any dense pull") when the
  // worker has not pulled `key` densely yet.
  static std::vector<float>& difference(Slot& s, std::uint32_t key, int rank, const char* what);
  Slot* find(std::uint32_t key) const;

  const float momentum_;
  mutable std::mutex map_mu_;
  std::map<std::uint32_t, std::unique_ptr<Slot>> slots_;
  std::set<std::uint32_t> done_;
  // Counters outside map_mu_: a push holds its slot's mutex, and taking map_mu_ there
  // would invert the order state_bytes() and snapshot() take them in (map, then slot).
  std::atomic<std::uint64_t> pushes_{0};
  std::atomic<std::uint64_t> rebuilds_{0};
};

}  // namespace dltrain::ps
