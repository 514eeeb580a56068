#include "ps/exchange.h"

#include <chrono>

#include "common/errors.h"

namespace dltrain::ps {

std::vector<std::vector<compress::LowRankBlock>> matrix_blocks(const compress::CompressionSpec& spec,
                                                              const ps::PartitionLayout& layout,
                                                              std::span<const std::int64_t> tensor_sizes,
                                                              std::span<const std::int64_t> tensor_rows) {
  if (tensor_rows.size() != tensor_sizes.size() || tensor_sizes.empty()) {
    throw InvalidArgument("powersgd needs every tensor's size and rows (" + std::to_string(tensor_sizes.size()) +
                          " sizes, " + std::to_string(tensor_rows.size()) + " rows)");
  }
  std::vector<compress::TensorRows> tensors;
  for (std::size_t t = 0; t < tensor_sizes.size(); ++t) tensors.push_back({tensor_sizes[t], tensor_rows[t]});
  std::vector<std::int64_t> lengths;
  for (const auto& p : layout.partitions) lengths.push_back(p.length);
  return compress::lowrank_blocks(tensors, lengths, spec.rank, spec.min_compress_bytes);
}

std::vector<std::vector<std::uint32_t>> lowrank_pull_headers(const compress::CompressionSpec& spec,
                                                             const ps::PartitionLayout& layout,
                                                             std::span<const std::int64_t> tensor_sizes,
                                                             std::span<const std::int64_t> tensor_rows) {
  if (spec.method != compress::Method::kPowerSgd || spec.downlink_ratio != 0) return {};
  // Every partition pulls this way: one without a matrix is one full block, which the
  // shard sends whole (its difference since the last pull), as the uplink sends it.
  std::vector<std::vector<std::uint32_t>> out;
  for (const auto& bs : matrix_blocks(spec, layout, tensor_sizes, tensor_rows)) out.push_back(compress::lowrank_header(bs));
  return out;
}

PushEncoder::PushEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout, std::uint64_t seed,
                         std::span<const std::int64_t> tensor_sizes, std::span<const std::int64_t> tensor_rows)
    : layout_(layout),
      compressor_(spec,
                  [&] {
                    std::vector<std::int64_t> lengths;
                    for (const auto& p : layout.partitions) lengths.push_back(p.length);
                    return lengths;
                  }(),
                  seed),
      pushes_(layout.partitions.size()) {
  if (spec.method == compress::Method::kPowerSgd) {
    auto blocks = matrix_blocks(spec, layout, tensor_sizes, tensor_rows);
    for (const auto& bs : blocks) {
      for (const auto& b : bs) {
        if (b.rank == 0) always_sent_ += static_cast<std::int64_t>(b.floats());
      }
    }
    compressor_.set_lowrank_blocks(std::move(blocks));
    return;
  }
  const bool sparsifies = spec.method == compress::Method::kTopk || spec.method == compress::Method::kDgc;
  if (spec.min_compress_bytes <= 0 || !sparsifies || tensor_sizes.empty()) return;
  std::int64_t total = 0;
  for (const auto n : tensor_sizes) total += n;
  if (total != layout.total_floats) {
    throw InvalidArgument("push encoder: the tensors hold " + std::to_string(total) + " floats, the layout " +
                          std::to_string(layout.total_floats));
  }
  // The floats of the small tensors, as indices into the partitions that hold them
  // (partitions are contiguous and in offset order; a small tensor may straddle two).
  std::vector<std::vector<std::uint32_t>> always(layout.partitions.size());
  std::int64_t offset = 0;
  std::size_t p = 0;
  for (const auto n : tensor_sizes) {
    if (n * static_cast<std::int64_t>(sizeof(float)) < spec.min_compress_bytes) {
      for (std::int64_t i = offset; i < offset + n; ++i) {
        while (i >= layout.partitions[p].offset + layout.partitions[p].length) ++p;
        always[p].push_back(static_cast<std::uint32_t>(i - layout.partitions[p].offset));
      }
      always_sent_ += n;
    }
    offset += n;
  }
  for (std::size_t q = 0; q < always.size(); ++q) {
    if (!always[q].empty()) compressor_.send_always(q, std::move(always[q]));
  }
}

std::span<const ps::PartitionPush> PushEncoder::encode(std::span<float> grad, int num_workers, double density,
                                                       std::uint64_t step) {
  compressor_.clip(grad, num_workers);
  for (const auto& p : layout_.partitions) {
    encode_partition(
        p.key,
        std::span<const float>(grad).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length)),
        density, step);
  }
  return pushes_;
}

std::span<const ps::PartitionPush> PushEncoder::encode_partition(std::uint32_t key, std::span<const float> grad,
                                                                 double density, std::uint64_t step) {
  const auto& e = compressor_.encode(key, grad, density, step);
  auto& pp = pushes_[key];
  pp.count = static_cast<std::uint32_t>(e.count());
  pp.second = {};
  pp.seed = e.seed;
  switch (e.encoding) {
    case compress::Encoding::kDense:
      pp.codec = wire::Codec::kDenseF32;
      pp.first = std::as_bytes(std::span<const float>(e.values));
      break;
    case compress::Encoding::kDenseF16:
      pp.codec = wire::Codec::kDenseF16;
      pp.first = std::as_bytes(std::span<const std::uint16_t>(e.half));
      break;
    case compress::Encoding::kSparse:
      pp.codec = wire::Codec::kSparseF32;
      pp.first = std::as_bytes(std::span<const std::uint32_t>(e.indices));
      pp.second = std::as_bytes(std::span<const float>(e.values));
      break;
    case compress::Encoding::kSeeded:
      pp.codec = wire::Codec::kSeededF32;
      pp.first = std::as_bytes(std::span<const float>(e.values));
      break;
    case compress::Encoding::kLowRank:
      pp.codec = wire::Codec::kLowRankF32;
      pp.first = std::as_bytes(std::span<const std::uint32_t>(e.indices));
      pp.second = std::as_bytes(std::span<const float>(e.values));
      break;
  }
  return pushes_;
}

TrafficMeter::TrafficMeter(const ps::PartitionLayout& layout, std::uint64_t header_bytes) {
  for (const auto& p : layout.partitions) {
    dense_up_ += 2 * header_bytes + 4 * static_cast<std::uint64_t>(p.length);
    dense_down_ += header_bytes + 4 * static_cast<std::uint64_t>(p.length);
  }
}

void TrafficMeter::add_step(std::uint64_t up, std::uint64_t down, double epoch_pos, double warmup_epochs) {
  for (auto* t : {&total_, &after_warmup_}) {
    if (t == &after_warmup_ && epoch_pos < warmup_epochs) continue;
    t->up += up;
    t->down += down;
    t->dense_up += dense_up_;
    t->dense_down += dense_down_;
  }
}

void TrafficMeter::add_bytes(std::uint64_t up, std::uint64_t down, double epoch_pos, double warmup_epochs) {
  for (auto* t : {&total_, &after_warmup_}) {
    if (t == &after_warmup_ && epoch_pos < warmup_epochs) continue;
    t->up += up;
    t->down += down;
  }
}

PsResyncer::PsResyncer(ps::PsClient& client, std::span<float> params, int rank, std::function<void()> on_params,
                       std::function<void(const nlohmann::json&)> sink, int max_in_a_row)
    : client_(client),
      params_(params),
      rank_(rank),
      on_params_(std::move(on_params)),
      sink_(std::move(sink)),
      max_in_a_row_(max_in_a_row) {}

void PsResyncer::run(const std::function<void()>& call) {
  for (;;) {
    try {
      call();
      return;
    } catch (const ps::PsConnectionLost& lost) {
      recover(lost);
    }
  }
}

void PsResyncer::recover(const ps::PsConnectionLost& lost) {
  std::string reason = lost.what();
  std::size_t shard = lost.shard();
  for (;;) {
    if (++in_a_row_ > max_in_a_row_) {
      throw IoError("worker " + std::to_string(rank_) + ": lost the PS connection " + std::to_string(max_in_a_row_) +
                    " times in a row without a successful step; last: " + reason);
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      client_.resync(params_);
      // A shard that restarted without a checkpoint has forgotten who finished.
      if (done_sent_) client_.done();
    } catch (const ps::PsConnectionLost& again) {
      reason = again.what();
      shard = again.shard();
      continue;
    } catch (const IoError& e) {
      throw IoError("worker " + std::to_string(rank_) + ": PS shard " + std::to_string(shard) + " went away (" +
                    reason + ") and " + e.what());
    }
    on_params_();
    ++resyncs_;
    wire::events::PsResync ev;
    ev.rank = rank_;
    ev.shard = static_cast<int>(shard);
    ev.reason = reason;
    ev.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ev.resyncs = resyncs_;
    sink_(ev.to_json());
    return;
  }
}

}  // namespace dltrain::ps
