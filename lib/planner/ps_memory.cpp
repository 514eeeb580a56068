#include "planner/ps_memory.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>
#include <system_error>

#include "common/errors.h"
#include "ps/partition.h"

namespace dltrain::planner {

namespace {

using Sizes = std::vector<std::int64_t>;

void conv(Sizes& s, std::int64_t in, std::int64_t out, std::int64_t k) { s.push_back(out * in * k * k); }
void batchnorm(Sizes& s, std::int64_t c) {
  s.push_back(c);  // weight (γ)
  s.push_back(c);  // bias (β)
}
void linear(Sizes& s, std::int64_t in, std::int64_t out) {
  s.push_back(out * in);
  s.push_back(out);
}

// train/models.cpp's BasicBlock: conv3x3, BN, conv3x3, BN, and with `projection` a 1×1
// convolution and a BN on the shortcut where the shape changes.
void basic_block(Sizes& s, std::int64_t in, std::int64_t out, std::int64_t stride, bool projection) {
  conv(s, in, out, 3);
  batchnorm(s, out);
  conv(s, out, out, 3);
  batchnorm(s, out);
  if (projection && (stride != 1 || in != out)) {
    conv(s, in, out, 1);
    batchnorm(s, out);
  }
}

void stages(Sizes& s, std::initializer_list<std::int64_t> widths, int blocks, bool projection) {
  std::int64_t in = *widths.begin();
  for (const std::int64_t width : widths) {
    for (int i = 0; i < blocks; ++i) {
      const std::int64_t stride = (i == 0 && width != *widths.begin()) ? 2 : 1;
      basic_block(s, in, width, stride, projection);
      in = width;
    }
  }
}

}  // namespace

std::vector<std::int64_t> model_tensor_sizes(ModelKind model, int channels, int classes, int image_size) {
  Sizes s;
  const std::int64_t c = channels, k = classes;
  if (model == ModelKind::kCnn) {
    if (image_size < 8) {
      throw ConfigError("image_size", "the cnn model needs at least 8 pixels, got " + std::to_string(image_size));
    }
    const std::int64_t side = image_size / 2 / 2 / 2;
    conv(s, c, 16, 3);
    batchnorm(s, 16);
    conv(s, 16, 32, 3);
    batchnorm(s, 32);
    conv(s, 32, 64, 3);
    batchnorm(s, 64);
    linear(s, 64 * side * side, 64);
    linear(s, 64, k);
  } else if (model == ModelKind::kMlp || model == ModelKind::kMlpLarge) {
    const std::int64_t in = c * image_size * image_size, h1 = model == ModelKind::kMlp ? 256 : 768;
    linear(s, in, h1);
    linear(s, h1, 128);
    linear(s, 128, k);
  } else if (model == ModelKind::kResnet20) {
    conv(s, c, 16, 3);
    batchnorm(s, 16);
    stages(s, {16, 32, 64}, 3, false);
    linear(s, 64, k);
  } else if (model == ModelKind::kResnet18) {
    conv(s, c, 64, 7);
    batchnorm(s, 64);
    stages(s, {64, 128, 256, 512}, 2, true);
    linear(s, 512, k);
  } else {
    throw ConfigError("model", "expected cnn, mlp, mlp-large, resnet20 or resnet18, got \"" +
                                  std::string(enum_name(model)) + "\"");
  }
  return s;
}

int dataset_classes(const JobSpec& spec) {
  if (spec.dataset != DatasetKind::kImageFolder) return 10;
  namespace fs = std::filesystem;
  const fs::path train = fs::path(spec.data_dir) / "train";
  std::error_code ec;
  int classes = 0;
  for (fs::directory_iterator it(train, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.empty() && name[0] != '.' && it->is_directory(ec)) ++classes;
  }
  if (ec) throw ConfigError("data_dir", "cannot list " + train.string() + ": " + ec.message());
  if (classes == 0) throw ConfigError("data_dir", train.string() + " holds no class folder");
  return classes;
}

int model_partitions(const JobSpec& spec, int classes) {
  const auto sizes = model_tensor_sizes(spec.model, spec.channels, classes, spec.image_size);
  const auto size = spec.partition_size_auto ? std::min(spec.partition_size, kMinAutoPartitionFloats)
                                             : spec.partition_size;
  return static_cast<int>(ps::make_layout(sizes, size, 1).partitions.size());
}

std::int64_t balanced_partition_size(const std::vector<std::int64_t>& tensor_sizes, int shards,
                                     std::int64_t preferred) {
  if (shards < 1) throw ConfigError("ps_shards", "expected >= 1, got " + std::to_string(shards));
  const std::int64_t total = std::accumulate(tensor_sizes.begin(), tensor_sizes.end(), std::int64_t{0});
  const std::int64_t n = shards;
  // Largest first (a cut above `preferred` is skipped; one raised to the floor may repeat
  // the one before, which changes nothing).
  const std::int64_t candidates[] = {preferred, std::max((total + n - 1) / n, kMinAutoPartitionFloats),
                                     std::max((total + 2 * n - 1) / (2 * n), kMinAutoPartitionFloats)};
  const double even = static_cast<double>(total) / static_cast<double>(shards);
  std::int64_t best = preferred;
  std::int64_t best_load = std::numeric_limits<std::int64_t>::max();
  for (const auto size : candidates) {
    if (size > preferred) continue;
    const auto layout = ps::make_layout(tensor_sizes, size, shards);
    std::int64_t load = 0;  // the busiest shard's floats
    for (int s = 0; s < shards; ++s) load = std::max(load, layout.shard_floats(s));
    // Even, and no shard left empty (LPT fills every shard once there are as many partitions).
    const bool every_shard = layout.partitions.size() >= static_cast<std::size_t>(shards);
    if (every_shard && static_cast<double>(load) <= kEvenShardSlack * even) return size;
    if (load < best_load) best = size, best_load = load;
  }
  return best;
}

std::int64_t auto_partition_size(const JobSpec& spec, int classes) {
  return balanced_partition_size(model_tensor_sizes(spec.model, spec.channels, classes, spec.image_size),
                                 spec.ps_shards, spec.partition_size);
}

PsShardMemory ps_shard_memory(const JobSpec& spec, int classes) {
  const auto sizes = model_tensor_sizes(spec.model, spec.channels, classes, spec.image_size);
  const auto layout = ps::make_layout(sizes, spec.partition_size, spec.ps_shards);
  PsShardMemory m;
  m.model_floats = layout.total_floats;
  int largest = 0;
  for (int s = 0; s < spec.ps_shards; ++s) {
    const auto f = layout.shard_floats(s);
    if (f > m.shard_floats) m.shard_floats = f, largest = s;
  }
  for (const auto& p : layout.for_shard(largest)) m.largest_partition = std::max(m.largest_partition, p.length);
  m.momentum_buffer = ps_momentum(spec) > 0;
  const bool sparse = compress::keeps_x_seen(spec.compression);
  m.sparse_workers = sparse ? spec.workers : 0;
  const auto n = static_cast<std::uint64_t>(m.shard_floats);
  // sync = "sync" (BSP through the PS) stages each step's pushes in an accumulator of the
  // partition's size (ShardState::state_bytes() on the branch that implements it).
  m.step_accumulator = spec.sync == ps::SyncMode::kBsp;
  m.state_bytes = 4 * n *
                  (1 + (m.momentum_buffer ? 1 : 0) + (m.step_accumulator ? 1 : 0) +
                   static_cast<std::uint64_t>(m.sparse_workers));
  const std::uint64_t per_float = compress::half_downlink(spec.compression) ? 8 + 2 : 8;
  m.connection_bytes = static_cast<std::uint64_t>(spec.workers) * per_float * static_cast<std::uint64_t>(m.largest_partition);
  m.total_bytes = m.state_bytes + m.connection_bytes + (sparse ? 4 * n : 0);
  return m;
}

namespace {

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::optional<std::string> ps_memory_refusal(const JobSpec& spec, const PsShardMemory& m, std::uint64_t limit_bytes) {
  if (m.total_bytes <= limit_bytes) return std::nullopt;
  const auto n = static_cast<std::uint64_t>(m.shard_floats);
  const std::uint64_t fixed =
      4 * n * (1 + (m.momentum_buffer ? 1 : 0) + (m.step_accumulator ? 1 : 0)) + (m.sparse_workers > 0 ? 4 * n : 0);
  std::string msg = "a PS shard of this job needs " + gib(m.total_bytes) + ": " + std::to_string(n) + " floats (of the " +
                    std::to_string(m.model_floats) + "-parameter " + std::string(enum_name(spec.model)) + ", on the largest of " +
                    std::to_string(spec.ps_shards) + " ps_shards) x 4 bytes x (1 parameters" +
                    (m.momentum_buffer ? " + 1 momentum buffer" : "") +
                    (m.step_accumulator ? " + 1 BSP step accumulator" : "") +
                    (m.sparse_workers ? " + " + std::to_string(m.sparse_workers) +
                                            (compress::half_downlink(spec.compression)
                                                 ? " x_seen, one per worker for method fp16's binary16 downlink, + 1 scratch"
                                                 : " x_seen, one per worker as compression.downlink_ratio < 1, + 1 scratch")
                                      : std::string()) +
                    "), plus " + std::to_string(spec.workers) + " workers' connection buffers of " +
                    (compress::half_downlink(spec.compression) ? "10" : "8") + " bytes x " +
                    std::to_string(m.largest_partition) + " floats (the largest partition); the largest agent offers " +
                    gib(limit_bytes) + " (its memory_mb)";
  if (m.sparse_workers > 0) {
    const std::uint64_t per = 4 * n + m.connection_bytes / static_cast<std::uint64_t>(std::max(1, spec.workers));
    const std::int64_t fit = limit_bytes > fixed ? static_cast<std::int64_t>((limit_bytes - fixed) / per) : 0;
    msg += "; with these ps_shards at most " + std::to_string(fit) +
           " workers fit, or add ps_shards, or set compression.downlink_ratio = 1 (dense pulls keep no x_seen)";
  } else {
    msg += "; add ps_shards";
  }
  return msg;
}

}  // namespace dltrain::planner
