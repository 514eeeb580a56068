#include "gpu/device_push_encoder.h"

namespace dltrain::gpu {

bool DevicePushEncoder::handles(const compress::CompressionSpec& spec) {
  // min_compress_bytes (tensors sent in full) is the host encoder's only.
  return (spec.method == compress::Method::kTopk || spec.method == compress::Method::kDgc) &&
         spec.min_compress_bytes == 0;
}

DevicePushEncoder::DevicePushEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout,
                                     std::uint64_t seed)
    : layout_(layout),
      indices_(layout.partitions.size()),
      values_(layout.partitions.size()),
      pushes_(layout.partitions.size()) {
  if (!handles(spec)) throw InvalidArgument("device push encoder: method must be topk or dgc");
  // One selection for all partitions: they encode one after the other, so one set of
  // n-sized candidate buffers (the largest partition's) serves them all.
  auto topk = std::make_shared<DeviceTopk>();
  for (const auto& p : layout.partitions) {
    compressors_.push_back(
        std::make_unique<DeviceCompressor>(spec, static_cast<std::size_t>(p.length), seed, p.key, topk));
  }
}

std::span<const ps::PartitionPush> DevicePushEncoder::encode(const float* grad, double density, std::uint64_t step) {
  bytes_to_host_ = 0;
  for (const auto& p : layout_.partitions) {
    auto& idx = indices_[p.key];
    auto& val = values_[p.key];
    auto& c = *compressors_[p.key];
    c.encode(grad + p.offset, density, step, idx, val);
    bytes_to_host_ += c.bytes_to_host();
    auto& pp = pushes_[p.key];
    pp.count = static_cast<std::uint32_t>(val.size());
    pp.seed = 0;
    if (static_cast<std::int64_t>(val.size()) == p.length) {
      // k = n: every coordinate, in index order (GradientCompressor's dense encoding).
      pp.codec = wire::Codec::kDenseF32;
      pp.first = std::as_bytes(std::span<const float>(val));
      pp.second = {};
    } else {
      pp.codec = wire::Codec::kSparseF32;
      pp.first = std::as_bytes(std::span<const std::uint32_t>(idx));
      pp.second = std::as_bytes(std::span<const float>(val));
    }
  }
  return pushes_;
}

}  // namespace dltrain::gpu
