// Worker-side gradient compression: error feedback, DGC momentum correction, momentum
// factor masking, local gradient clipping, sparsity warm-up (plain C++, no LibTorch).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <memory>

#include "common/compression_spec.h"
#include "compress/lowrank.h"
#include "compress/topk.h"

namespace dltrain::compress {

// Method, CompressionSpec and density_at: common/compression_spec.h.

/// How one partition's update travels.
enum class Encoding {
  kDense,     ///< `values` holds all n floats
  kDenseF16,  ///< `half` holds all n binary16 values
  kSparse,    ///< `indices` (ascending) and `values`, k each
  kSeeded,    ///< `values` only; the indices are randomk_indices(n, k, seed)
  kLowRank,   ///< `indices` holds the block header, `values` the factors (lowrank_decode)
};

/// One encoded partition update. Buffers are reused between calls.
struct Encoded {
  Encoding encoding = Encoding::kDense;
  std::vector<std::uint32_t> indices;
  std::vector<float> values;
  std::vector<std::uint16_t> half;
  std::uint64_t seed = 0;
  /// Elements the frame carries (n for dense encodings, k otherwise).
  /// With kLowRank: the 4-byte words, header and factors.
  std::size_t count() const {
    if (encoding == Encoding::kDenseF16) return half.size();
    if (encoding == Encoding::kLowRank) return indices.size() + values.size();
    return values.size();
  }
};

/// Per-worker compression state over a model's partitions.
///
/// Per step and partition, with gradient g (Lin et al. 2018, Algorithm 1 and §3):
///   none:    send g
///   fp16:    v += g; send h = fp16(v); v -= h                    (error feedback)
///   topk:    v += g; send v at top-k(|v|); zero v there           (error feedback)
///   randomk: v += g; send v at k seeded random indices; zero v there
///   powersgd: v += g; send v's rank-r factors per matrix (PowerSgdState); v −= P̂·Qᵀ;
///            tensors that are no matrix (or below min_compress_bytes) sent in full; at
///            density 1 (the warm-up) v is sent in full
///   dgc:     u = m·u + g; v += u; send v at sampled-top-k(|v|); zero v there, and zero u
///            at the sent coordinates that had been held back (momentum factor masking).
/// dgc's masking deviates from the paper in one respect: a coordinate sent in the very
/// step its accumulation started (v was 0 before the step) keeps its momentum. Those
/// coordinates carry no stale momentum — the reason §3.3 masks — and keeping it makes
/// dgc at density 1 exactly momentum SGD, as momentum correction (§3.2) intends; the
/// paper's rule would turn it into SGD without momentum. See docs/compression.md.
///
/// Thread-safety: none; one instance per worker thread.
class GradientCompressor {
 public:
  /// `lengths[p]` = floats of partition p. `seed` makes sampling and random-k
  /// deterministic per worker.
  GradientCompressor(CompressionSpec spec, std::vector<std::int64_t> lengths, std::uint64_t seed);

  /// Local gradient clipping (DGC §3.4; Pascanu et al. 2013): when spec.clip_norm > 0,
  /// scales `grad` (the whole flat gradient) so its L2 norm is at most
  /// clip_norm · num_workers^-1/2. Returns the norm before clipping.
  double clip(std::span<float> grad, int num_workers) const;

  /// Encodes partition p's gradient at `density` for step `step`. Returns a reference to
  /// an internal buffer valid until the next encode of the same partition. `p` must be
  /// below the number of partitions; throws InvalidArgument when `grad` does not have
  /// `lengths[p]` floats.
  const Encoded& encode(std::size_t p, std::span<const float> grad, double density, std::uint64_t step);
  /// topk and dgc: the floats of partition p (indices into it, strictly ascending, each
  /// below lengths[p]) that every encode of p sends besides its top-k — the tensors below
  /// spec.min_compress_bytes. They take the method's accumulation as the others do and
  /// are zeroed once sent, so with dgc they follow momentum SGD exactly (their v equals
  /// their u when sent, so factor masking leaves their momentum). Replaces an earlier
  /// list; ignored by the other methods. Throws InvalidArgument for a bad p or list.
  void send_always(std::size_t p, std::vector<std::uint32_t> indices);
  /// powersgd: the matrices in each partition (lowrank_blocks; one list per partition).
  /// Until it is called every partition is sent in full. Throws InvalidArgument when a
  /// partition's blocks do not cover its length; ignored by the other methods.
  void set_lowrank_blocks(std::vector<std::vector<LowRankBlock>> blocks);
  /// powersgd's state (the warm-started Q of every matrix); null before set_lowrank_blocks.
  PowerSgdState* powersgd() { return powersgd_.get(); }

  /// The error-feedback accumulator v and DGC momentum u of partition p (empty when the
  /// method keeps none).
  std::span<const float> residual(std::size_t p) const { return v_[p]; }
  std::span<const float> velocity(std::size_t p) const { return u_[p]; }
  const CompressionSpec& spec() const { return spec_; }

 private:
  CompressionSpec spec_;
  std::vector<std::int64_t> lengths_;
  std::uint64_t seed_;
  std::vector<std::vector<float>> v_, u_;
  std::vector<Encoded> out_;
  TopkScratch scratch_;
  std::unique_ptr<PowerSgdState> powersgd_;
  void add_always_sent(std::size_t p);  // idx_ (ascending) ∪ always_[p]

  std::vector<std::uint32_t> idx_, merged_;
  std::vector<std::vector<std::uint32_t>> always_;  // per partition: send_always's indices
};

}  // namespace dltrain::compress
