// Low-rank gradient compression: PowerSGD's power iteration with error feedback (Vogels,
// Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization", NeurIPS 2019, Algorithm 1), adapted to a parameter server
// (docs/compression.md, "Low rank (PowerSGD)"). Plain C++ on flat buffers, no LibTorch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dltrain::compress {

/// The largest rank a low-rank block may have ([compression] rank, and what a PS decodes:
/// it bounds the PS's work per push at 64 multiply-adds per float of the partition).
inline constexpr std::uint32_t kMaxLowRank = 64;

/// One stretch of a partition as the low-rank method sends it: `rows` × `cols` floats of
/// the partition (row-major), sent as rank-`rank` factors P (rows × rank) and Q (cols ×
/// rank) whose product P·Qᵀ approximates them, or, with rank 0, sent in full. The blocks
/// of a partition tile it in order (their rows·cols add up to its length).
struct LowRankBlock {
  std::uint32_t rows = 1;  ///< >= 1
  std::uint32_t cols = 1;  ///< >= 1
  std::uint32_t rank = 0;  ///< 0 (sent in full) or in [1, min(rows, cols, kMaxLowRank)]
  /// Floats of the partition the block covers.
  std::uint64_t floats() const { return static_cast<std::uint64_t>(rows) * cols; }
  /// Floats the block puts on the wire: rows·cols in full, (rows + cols)·rank as factors.
  std::uint64_t sent_floats() const {
    return rank == 0 ? floats() : (static_cast<std::uint64_t>(rows) + cols) * rank;
  }
  bool operator==(const LowRankBlock&) const = default;
};

/// A parameter tensor as the low-rank method sees it: `numel` floats whose first
/// dimension is `rows` (1 for a vector). A weight of shape [out, in, kh, kw] is the
/// matrix out × (in·kh·kw), as PowerSGD reshapes it (Vogels et al. §3).
struct TensorRows {
  std::int64_t numel = 0;  ///< >= 1
  std::int64_t rows = 1;   ///< >= 1, divides numel
};

/// Cuts each partition (partition_lengths[p] floats, contiguous and in flat order, adding
/// up to the tensors' floats) into LowRankBlocks. The part of a tensor that a partition
/// holds is one rank-r block, r = min(rank, its rows, its cols), when the tensor has at
/// least two rows, at least min_compress_bytes bytes (4 per float), the part starts and
/// ends on row boundaries (a large tensor cut into partitions, ps/partition.h, is cut
/// between rows where its sizes allow), and (rows + cols)·r < rows·cols (the factors are
/// smaller than the matrix); everything else is sent in full, consecutive full stretches
/// merged into one block. Throws InvalidArgument when the sizes do not add up, a rank is
/// below 1, or a tensor's rows do not divide its floats.
std::vector<std::vector<LowRankBlock>> lowrank_blocks(std::span<const TensorRows> tensors,
                                                      std::span<const std::int64_t> partition_lengths, int rank,
                                                      std::int64_t min_compress_bytes);

/// The wire header of a partition tiled by `blocks`: [B, rows_0, cols_0, rank_0, ...].
std::vector<std::uint32_t> lowrank_header(std::span<const LowRankBlock> blocks);

/// Words of the wire header that describes `blocks` (docs/protocol.md, codec 7):
/// the block count, then rows, cols and rank of each block.
std::size_t lowrank_header_words(std::size_t blocks);

/// The blocks a wire header describes (`header` as lowrank_decode takes it) for a
/// partition of `length` floats. Throws InvalidArgument, naming the block and field, unless
/// B ≥ 1, the header has 1 + 3B words, every rows and cols is ≥ 1, every rank ≤ min(rows,
/// cols, kMaxLowRank) and the blocks cover exactly `length` floats.
std::vector<LowRankBlock> parse_lowrank_header(std::span<const std::uint32_t> header, std::uint64_t length);

/// Reconstructs a low-rank push into `out` (the partition: out.size() floats).
/// `header` = [B, rows_0, cols_0, rank_0, ..., rows_{B-1}, cols_{B-1}, rank_{B-1}];
/// `values` = for each block in order, rows·cols floats (rank 0) or P (rows × rank,
/// row-major) then Q (cols × rank, row-major); block b is written as P·Qᵀ. Checks
/// everything before it writes: B ≥ 1, the header's length, every rows and cols ≥ 1, every
/// rank ≤ min(rows, cols, kMaxLowRank), the blocks' floats adding up to out.size() and the values'
/// count to what the blocks need; throws InvalidArgument naming the block and field
/// otherwise (nothing written). O(Σ rows·cols·(rank or 1)); allocates only the block list.
void lowrank_decode(std::span<const std::uint32_t> header, std::span<const float> values, std::span<float> out);

/// PowerSGD's compressor state for one worker, per partition and block: the warm-started
/// Q of every low-rank block (Vogels et al. §4.1, "warm start": each step's power
/// iteration starts from the previous step's Q).
///
/// One step of partition p with accumulator M (the gradient plus the error fed back,
/// kept by the caller), per low-rank block (Algorithm 1 with one worker):
///   P = M·Q;  P̂ = orthonormalise(P) (Gram–Schmidt over columns);  Q = Mᵀ·P̂;
///   send P̂ and Q;  M ← M − P̂·Qᵀ   (what was not sent stays: error feedback).
/// Full blocks are sent as they are and zeroed. A column of P of norm below 1e-30 (M is
/// zero along it) is set to zero, so it and its Q column carry nothing, and that column of
/// the warm start stays what it was (a zero one would never leave zero).
///
/// Thread-safety: none; one per worker thread.
class PowerSgdState {
 public:
  /// `blocks[p]`: partition p's tiling (lowrank_blocks). Q starts as standard normal
  /// values drawn from `seed` (deterministic per worker).
  PowerSgdState(std::vector<std::vector<LowRankBlock>> blocks, std::uint64_t seed);

  /// Compresses partition p's accumulator `m` (its length floats) in place as above,
  /// writing the wire header into `header` and the factors into `values` (both resized).
  /// Throws InvalidArgument for a bad p or a length that is not the partition's.
  void compress(std::size_t p, std::span<float> m, std::vector<std::uint32_t>& header, std::vector<float>& values);

  /// Whether partition p has a low-rank block (otherwise it is sent in full).
  bool compresses(std::size_t p) const;
  /// Partition p's blocks.
  const std::vector<LowRankBlock>& blocks(std::size_t p) const { return blocks_.at(p); }
  /// The warm-start Q of block b of partition p (cols × rank, row-major; empty for a
  /// full block).
  std::span<const float> q(std::size_t p, std::size_t b) const { return q_.at(p).at(b); }
  /// Replaces that Q (a reference check, or a restored state); throws InvalidArgument
  /// when the size differs.
  void set_q(std::size_t p, std::size_t b, std::span<const float> q);

 private:
  std::vector<std::vector<LowRankBlock>> blocks_;
  std::vector<std::vector<std::vector<float>>> q_;
  std::vector<double> p_, q_scratch_;  // P and the new Q of the block being compressed
  std::vector<char> zero_;              // P̂'s columns that came out zero
};

}  // namespace dltrain::compress
