#include "compress/lowrank.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/errors.h"
#include "compress/topk.h"

namespace dltrain::compress {
namespace {

// Appends `floats` sent in full to partition `out`, merged with a full block before it.
void add_full(std::vector<LowRankBlock>& out, std::int64_t floats) {
  if (!out.empty() && out.back().rank == 0) {
    out.back().cols += static_cast<std::uint32_t>(floats);
    return;
  }
  out.push_back({1, static_cast<std::uint32_t>(floats), 0});
}

// Column k of a rows × r row-major matrix, orthonormalised against columns 0..k-1 by
// modified Gram–Schmidt (the order torch's powerSGD_hook uses); a column of norm below
// 1e-30 becomes zero and is marked in `zero`.
void orthonormalise(std::vector<double>& p, std::size_t rows, std::size_t r, std::vector<char>& zero) {
  zero.assign(r, 0);
  for (std::size_t k = 0; k < r; ++k) {
    double sq = 0;
    for (std::size_t i = 0; i < rows; ++i) sq += p[i * r + k] * p[i * r + k];
    const double norm = std::sqrt(sq);
    zero[k] = norm < 1e-30;
    const double inv = zero[k] ? 0.0 : 1.0 / norm;
    for (std::size_t i = 0; i < rows; ++i) p[i * r + k] *= inv;
    for (std::size_t j = k + 1; j < r; ++j) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += p[i * r + k] * p[i * r + j];
      for (std::size_t i = 0; i < rows; ++i) p[i * r + j] -= dot * p[i * r + k];
    }
  }
}

std::string block_name(std::size_t b) { return "low-rank block " + std::to_string(b); }

// Element (i, j) of P·Qᵀ: row i of P and row j of Q, r floats each. The worker's error
// feedback and the PS's decoding both use it, so the PS applies exactly what the worker
// took out of its accumulator.
inline float factor_product(const float* pi, const float* qj, std::size_t r) {
  float s = 0;
  for (std::size_t k = 0; k < r; ++k) s += pi[k] * qj[k];
  return s;
}

}  // namespace

std::vector<std::vector<LowRankBlock>> lowrank_blocks(std::span<const TensorRows> tensors,
                                                      std::span<const std::int64_t> partition_lengths, int rank,
                                                      std::int64_t min_compress_bytes) {
  if (rank < 1 || rank > static_cast<int>(kMaxLowRank)) {
    throw InvalidArgument("low-rank blocks: rank must be in [1, " + std::to_string(kMaxLowRank) + "], got " +
                          std::to_string(rank));
  }
  std::int64_t tensor_total = 0, partition_total = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& x = tensors[t];
    if (x.numel < 1 || x.rows < 1 || x.numel % x.rows != 0) {
      throw InvalidArgument("low-rank blocks: tensor " + std::to_string(t) + " has " + std::to_string(x.numel) +
                            " floats in " + std::to_string(x.rows) + " rows (rows must divide the floats)");
    }
    tensor_total += x.numel;
  }
  for (const auto n : partition_lengths) {
    if (n < 1 || n > std::int64_t{0xFFFFFFFF}) {
      throw InvalidArgument("low-rank blocks: a partition of " + std::to_string(n) + " floats");
    }
    partition_total += n;
  }
  if (tensor_total != partition_total) {
    throw InvalidArgument("low-rank blocks: the tensors hold " + std::to_string(tensor_total) +
                          " floats, the partitions " + std::to_string(partition_total));
  }
  std::vector<std::vector<LowRankBlock>> out(partition_lengths.size());
  std::size_t t = 0;
  std::int64_t in_tensor = 0;  // floats of tensor t already placed
  for (std::size_t p = 0; p < partition_lengths.size(); ++p) {
    for (std::int64_t left = partition_lengths[p]; left > 0;) {
      const auto& x = tensors[t];
      const std::int64_t take = std::min(left, x.numel - in_tensor);
      const std::int64_t cols = x.numel / x.rows;
      const bool whole_rows = in_tensor % cols == 0 && take % cols == 0;
      const std::int64_t rows = take / cols;
      const std::int64_t r = std::min<std::int64_t>({rank, rows, cols});
      if (x.rows >= 2 && x.numel * 4 >= min_compress_bytes && whole_rows && (rows + cols) * r < rows * cols) {
        out[p].push_back({static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(cols),
                          static_cast<std::uint32_t>(r)});
      } else {
        add_full(out[p], take);
      }
      left -= take;
      in_tensor += take;
      if (in_tensor == x.numel) {
        ++t;
        in_tensor = 0;
      }
    }
  }
  return out;
}

std::size_t lowrank_header_words(std::size_t blocks) { return 1 + 3 * blocks; }

std::vector<std::uint32_t> lowrank_header(std::span<const LowRankBlock> blocks) {
  std::vector<std::uint32_t> h{static_cast<std::uint32_t>(blocks.size())};
  for (const auto& b : blocks) h.insert(h.end(), {b.rows, b.cols, b.rank});
  return h;
}

std::vector<LowRankBlock> parse_lowrank_header(std::span<const std::uint32_t> header, std::uint64_t length) {
  if (header.empty() || header[0] == 0) throw InvalidArgument("no blocks");
  const std::size_t nb = header[0];
  if (header.size() != lowrank_header_words(nb)) {
    throw InvalidArgument(std::to_string(nb) + " blocks need " +
                          std::to_string(lowrank_header_words(nb)) + " header words, got " +
                          std::to_string(header.size()));
  }
  std::vector<LowRankBlock> blocks;
  blocks.reserve(nb);
  std::uint64_t floats = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const LowRankBlock blk{header[1 + 3 * b], header[2 + 3 * b], header[3 + 3 * b]};
    if (blk.rows == 0 || blk.cols == 0) {
      throw InvalidArgument(block_name(b) + ": rows " + std::to_string(blk.rows) + " and cols " +
                            std::to_string(blk.cols) + " must be at least 1");
    }
    if (blk.rank > std::min({blk.rows, blk.cols, kMaxLowRank})) {
      throw InvalidArgument(block_name(b) + ": rank " + std::to_string(blk.rank) + " exceeds min(rows " +
                            std::to_string(blk.rows) + ", cols " + std::to_string(blk.cols) + ", " +
                            std::to_string(kMaxLowRank) + ")");
    }
    floats += blk.floats();
    if (floats > length) {
      throw InvalidArgument(block_name(b) + ": the blocks cover more than the partition's " + std::to_string(length) +
                            " floats");
    }
    blocks.push_back(blk);
  }
  if (floats != length) {
    throw InvalidArgument("the blocks cover " + std::to_string(floats) + " floats, the partition has " +
                          std::to_string(length));
  }
  return blocks;
}

void lowrank_decode(std::span<const std::uint32_t> header, std::span<const float> values, std::span<float> out) {
  // Every check first: nothing is written for a push that fails one.
  const auto blocks = parse_lowrank_header(header, out.size());
  std::uint64_t sent = 0;
  for (const auto& b : blocks) sent += b.sent_floats();
  if (sent != values.size()) {
    throw InvalidArgument("the blocks need " + std::to_string(sent) + " values, the frame has " +
                          std::to_string(values.size()));
  }
  std::size_t off = 0, at = 0;
  for (const auto& blk : blocks) {
    const std::size_t rows = blk.rows, cols = blk.cols, r = blk.rank;
    if (r == 0) {
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), rows * cols, out.begin() + static_cast<std::ptrdiff_t>(off));
      at += rows * cols;
    } else {
      const float* pm = values.data() + at;
      const float* qm = pm + rows * r;
      for (std::size_t i = 0; i < rows; ++i) {
        float* row = out.data() + off + i * cols;
        const float* pi = pm + i * r;
        for (std::size_t j = 0; j < cols; ++j) row[j] = factor_product(pi, qm + j * r, r);
      }
      at += (rows + cols) * r;
    }
    off += rows * cols;
  }
}

PowerSgdState::PowerSgdState(std::vector<std::vector<LowRankBlock>> blocks, std::uint64_t seed)
    : blocks_(std::move(blocks)), q_(blocks_.size()) {
  for (std::size_t p = 0; p < blocks_.size(); ++p) {
    q_[p].resize(blocks_[p].size());
    for (std::size_t b = 0; b < blocks_[p].size(); ++b) {
      const auto& blk = blocks_[p][b];
      if (blk.rank == 0) continue;
      std::mt19937_64 gen(splitmix64(seed ^ splitmix64((static_cast<std::uint64_t>(p) << 32) + b)));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      auto& q = q_[p][b];
      q.resize(static_cast<std::size_t>(blk.cols) * blk.rank);
      for (auto& x : q) x = normal(gen);
    }
  }
}

bool PowerSgdState::compresses(std::size_t p) const {
  const auto& bs = blocks_.at(p);
  return std::any_of(bs.begin(), bs.end(), [](const LowRankBlock& b) { return b.rank > 0; });
}

void PowerSgdState::set_q(std::size_t p, std::size_t b, std::span<const float> q) {
  auto& dst = q_.at(p).at(b);
  if (q.size() != dst.size()) {
    throw InvalidArgument("PowerSGD: Q of partition " + std::to_string(p) + " block " + std::to_string(b) + " has " +
                          std::to_string(dst.size()) + " floats, got " + std::to_string(q.size()));
  }
  std::copy(q.begin(), q.end(), dst.begin());
}

void PowerSgdState::compress(std::size_t p, std::span<float> m, std::vector<std::uint32_t>& header,
                             std::vector<float>& values) {
  if (p >= blocks_.size()) {
    throw InvalidArgument("PowerSGD: partition " + std::to_string(p) + " of " + std::to_string(blocks_.size()));
  }
  const auto& bs = blocks_[p];
  std::uint64_t total = 0, sent = 0;
  for (const auto& b : bs) total += b.floats(), sent += b.sent_floats();
  if (total != m.size()) {
    throw InvalidArgument("PowerSGD: partition " + std::to_string(p) + " has " + std::to_string(total) +
                          " floats, got " + std::to_string(m.size()));
  }
  header = lowrank_header(bs);
  values.resize(sent);
  std::size_t off = 0, at = 0;
  auto& pd = p_;
  auto& qd = q_scratch_;
  for (std::size_t b = 0; b < bs.size(); ++b) {
    const auto& blk = bs[b];
    const std::size_t rows = blk.rows, cols = blk.cols, r = blk.rank;
    float* mb = m.data() + off;
    if (r == 0) {
      std::copy_n(mb, rows * cols, values.begin() + static_cast<std::ptrdiff_t>(at));
      std::fill_n(mb, rows * cols, 0.0f);
      at += rows * cols, off += rows * cols;
      continue;
    }
    auto& q = q_[p][b];
    // P = M·Q (rows × r), in double: the columns are normalised next.
    pd.assign(rows * r, 0.0);
    for (std::size_t i = 0; i < rows; ++i) {
      const float* mi = mb + i * cols;
      double* pi = pd.data() + i * r;
      for (std::size_t j = 0; j < cols; ++j) {
        const double x = mi[j];
        const float* qj = q.data() + j * r;
        for (std::size_t k = 0; k < r; ++k) pi[k] += x * qj[k];
      }
    }
    orthonormalise(pd, rows, r, zero_);
    // Q = Mᵀ·P̂ (cols × r): the factor sent, and the next step's warm start.
    qd.assign(cols * r, 0.0);
    for (std::size_t i = 0; i < rows; ++i) {
      const float* mi = mb + i * cols;
      const double* pi = pd.data() + i * r;
      for (std::size_t j = 0; j < cols; ++j) {
        const double x = mi[j];
        double* qj = qd.data() + j * r;
        for (std::size_t k = 0; k < r; ++k) qj[k] += x * pi[k];
      }
    }
    float* pv = values.data() + at;
    float* qv = pv + rows * r;
    for (std::size_t i = 0; i < rows * r; ++i) pv[i] = static_cast<float>(pd[i]);
    // A zero column of P̂ (M is zero along Q's column) sends a zero column of Q, but the
    // warm start keeps its old column: a zero one would stay zero at every later step.
    for (std::size_t i = 0; i < cols * r; ++i) {
      qv[i] = static_cast<float>(qd[i]);
      if (!zero_[i % r]) q[i] = qv[i];
    }
    // Error feedback: what P̂·Qᵀ (as sent, in fp32) did not carry stays in M.
    for (std::size_t i = 0; i < rows; ++i) {
      float* mi = mb + i * cols;
      const float* pi = pv + i * r;
      for (std::size_t j = 0; j < cols; ++j) mi[j] -= factor_product(pi, qv + j * r, r);
    }
    at += (rows + cols) * r, off += rows * cols;
  }
}

}  // namespace dltrain::compress
