#include "compress/compressor.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "common/errors.h"
#include "compress/fp16.h"

namespace dltrain::compress {

GradientCompressor::GradientCompressor(CompressionSpec spec, std::vector<std::int64_t> lengths, std::uint64_t seed)
    : spec_(spec), lengths_(std::move(lengths)), seed_(seed) {
  const bool accumulates = spec_.method != Method::kNone;
  v_.resize(lengths_.size());
  u_.resize(lengths_.size());
  out_.resize(lengths_.size());
  always_.resize(lengths_.size());
  for (std::size_t p = 0; p < lengths_.size(); ++p) {
    const auto n = static_cast<std::size_t>(lengths_[p]);
    if (accumulates) v_[p].assign(n, 0.0f);
    if (spec_.method == Method::kDgc) u_[p].assign(n, 0.0f);
  }
}

void GradientCompressor::send_always(std::size_t p, std::vector<std::uint32_t> indices) {
  if (p >= lengths_.size()) {
    throw InvalidArgument("compressor: partition " + std::to_string(p) + " of " + std::to_string(lengths_.size()));
  }
  for (std::size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] >= static_cast<std::uint64_t>(lengths_[p]) || (j > 0 && indices[j] <= indices[j - 1])) {
      throw InvalidArgument("compressor: the always-sent indices of partition " + std::to_string(p) +
                            " must ascend strictly below " + std::to_string(lengths_[p]) + " (index " +
                            std::to_string(j) + " is " + std::to_string(indices[j]) + ")");
    }
  }
  always_[p] = std::move(indices);
}

void GradientCompressor::set_lowrank_blocks(std::vector<std::vector<LowRankBlock>> blocks) {
  if (spec_.method != Method::kPowerSgd) return;
  if (blocks.size() != lengths_.size()) {
    throw InvalidArgument("compressor: low-rank blocks for " + std::to_string(blocks.size()) + " partitions, the model has " +
                          std::to_string(lengths_.size()));
  }
  for (std::size_t p = 0; p < blocks.size(); ++p) {
    std::uint64_t n = 0;
    for (const auto& b : blocks[p]) n += b.floats();
    if (n != static_cast<std::uint64_t>(lengths_[p])) {
      throw InvalidArgument("compressor: the low-rank blocks of partition " + std::to_string(p) + " cover " +
                            std::to_string(n) + " floats, it has " + std::to_string(lengths_[p]));
    }
  }
  powersgd_ = std::make_unique<PowerSgdState>(std::move(blocks), splitmix64(seed_ ^ 0x5057u));
}

double GradientCompressor::clip(std::span<float> grad, int num_workers) const {
  double sq = 0;
  for (float g : grad) sq += static_cast<double>(g) * g;
  const double norm = std::sqrt(sq);
  if (spec_.clip_norm > 0) {
    const double limit = spec_.clip_norm / std::sqrt(static_cast<double>(std::max(1, num_workers)));
    if (norm > limit) {
      const auto s = static_cast<float>(limit / norm);
      for (float& g : grad) g *= s;
    }
  }
  return norm;
}

void GradientCompressor::add_always_sent(std::size_t p) {
  if (always_[p].empty()) return;
  merged_.clear();
  std::set_union(idx_.begin(), idx_.end(), always_[p].begin(), always_[p].end(), std::back_inserter(merged_));
  idx_.swap(merged_);
}

const Encoded& GradientCompressor::encode(std::size_t p, std::span<const float> g, double density, std::uint64_t step) {
  Encoded& e = out_[p];
  const std::size_t n = g.size();
  if (static_cast<std::int64_t>(n) != lengths_[p]) {
    throw InvalidArgument("compressor: partition " + std::to_string(p) + " has " + std::to_string(lengths_[p]) +
                " floats, got " + std::to_string(n));
  }
  const std::uint64_t step_seed = splitmix64(seed_ ^ splitmix64(step * 0x100000001B3ull + p));
  switch (spec_.method) {
    case Method::kNone:
      e.encoding = Encoding::kDense;
      e.values.assign(g.begin(), g.end());
      return e;
    case Method::kFp16: {
      auto& v = v_[p];
      e.encoding = Encoding::kDenseF16;
      e.half.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        v[i] += g[i];
        e.half[i] = float_to_half(v[i]);
        v[i] -= half_to_float(e.half[i]);
      }
      return e;
    }
    case Method::kPowerSgd: {
      auto& v = v_[p];
      for (std::size_t i = 0; i < n; ++i) v[i] += g[i];
      if (density < 1.0 && powersgd_ && powersgd_->compresses(p)) {
        e.encoding = Encoding::kLowRank;
        powersgd_->compress(p, v, e.indices, e.values);
        return e;
      }
      e.encoding = Encoding::kDense;
      e.values.assign(v.begin(), v.end());
      std::fill(v.begin(), v.end(), 0.0f);
      e.indices.clear();
      return e;
    }
    case Method::kTopk:
    case Method::kRandomk:
    case Method::kDgc:
      break;
  }
  auto& v = v_[p];
  const std::size_t k = k_for(n, density);
  if (spec_.method == Method::kDgc) {
    auto& u = u_[p];
    const auto m = static_cast<float>(spec_.momentum);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      v[i] += u[i];
    }
    topk_sampled(v, k, spec_.sample_ratio, step_seed, idx_, scratch_);
    add_always_sent(p);
    e.encoding = idx_.size() == n ? Encoding::kDense : Encoding::kSparse;
    e.values.resize(idx_.size());
    for (std::size_t j = 0; j < idx_.size(); ++j) {
      const std::uint32_t i = idx_[j];
      e.values[j] = v[i];
      if (v[i] != u[i]) u[i] = 0.0f;  // held back before this step: mask its momentum
      v[i] = 0.0f;
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) v[i] += g[i];
    if (spec_.method == Method::kTopk) {
      topk_exact(v, k, idx_, scratch_);
      add_always_sent(p);
      e.encoding = idx_.size() == n ? Encoding::kDense : Encoding::kSparse;
    } else {
      randomk_indices(n, k, step_seed, idx_);
      e.encoding = k == n ? Encoding::kDense : Encoding::kSeeded;
      e.seed = step_seed;
    }
    e.values.resize(idx_.size());
    for (std::size_t j = 0; j < idx_.size(); ++j) {
      e.values[j] = v[idx_[j]];
      v[idx_[j]] = 0.0f;
    }
  }
  if (e.encoding == Encoding::kSparse) {
    e.indices.assign(idx_.begin(), idx_.end());
  } else {
    e.indices.clear();
  }
  return e;
}

}  // namespace dltrain::compress
