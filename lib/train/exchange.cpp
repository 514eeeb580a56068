#include "train/exchange.h"

#include <chrono>

#include "common/errors.h"

namespace dltrain::train {

PushEncoder::PushEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout, std::uint64_t seed)
    : layout_(layout),
      compressor_(spec,
                  [&] {
                    std::vector<std::int64_t> lengths;
                    for (const auto& p : layout.partitions) lengths.push_back(p.length);
                    return lengths;
                  }(),
                  seed),
      pushes_(layout.partitions.size()) {}

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

}  // namespace dltrain::train
