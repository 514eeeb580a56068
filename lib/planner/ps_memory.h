// What one PS shard of a job holds in memory, computed from the job alone (no LibTorch),
// so that the leader can refuse at submit a job whose shard could not fit on any agent
// (docs/compression.md, "Memory per PS shard").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/job_spec.h"

namespace dltrain::planner {

/// Element counts of the parameter tensors of dltrain's built-in models, in the order of
/// their `parameters()` (train/models.cpp, which builds them): cnn (SmallCnn), mlp,
/// mlp-large, resnet20 (CifarResNet, option-A shortcuts) and resnet18 (projection
/// shortcuts, 7×7 stem). BatchNorm running statistics are buffers, not parameters, and
/// never reach the PS. `channels` in {1, 3}, `classes` >= 1, `image_size` >= 1 (the cnn
/// needs >= 8). Throws ConfigError naming "model" for a TorchScript model (whose tensors
/// only its workers know) and "image_size" for a cnn input below 8 pixels. Pure; thread-safe.
std::vector<std::int64_t> model_tensor_sizes(ModelKind model, int channels, int classes, int image_size);

/// Classes of the job's data set: 10 for fashion-mnist, mnist and cifar10; for an
/// ImageFolder the class folders of data_dir/train (names not starting with '.'), as
/// data/imagefolder.h counts them. Throws ConfigError("data_dir", …) when an ImageFolder's
/// train/ cannot be listed or holds no class folder.
int dataset_classes(const JobSpec& spec);

/// The parameter state of the job's largest PS shard.
struct PsShardMemory {
  std::int64_t model_floats = 0;   ///< parameters of the model, all shards together
  std::int64_t shard_floats = 0;   ///< n: floats on the largest shard (ps::make_layout, LPT)
  bool momentum_buffer = false;    ///< the shard keeps a momentum buffer (ps_momentum > 0)
  bool step_accumulator = false;   ///< sync = "sync": BSP stages a step's pushes in one more copy
  int sparse_workers = 0;          ///< workers that keep an x_seen there (all, with compress::keeps_x_seen)
  /// ShardState::state_bytes(): 4·n·(1 + [momentum > 0] + [sync = "sync"] + sparse_workers) bytes.
  std::uint64_t state_bytes = 0;
  std::int64_t largest_partition = 0;  ///< floats of the shard's largest partition
  /// Every worker's connection keeps a receive and a reply buffer as large as the largest
  /// frame it carried (an init or dense pull of the largest partition):
  /// workers · 2 · 4 · largest_partition bytes (measured by bench/psload/run.py), and with
  /// the binary16 downlink (compress::half_downlink) the reply's binary16 values besides:
  /// workers · 2 · largest_partition bytes more.
  std::uint64_t connection_bytes = 0;
  /// state_bytes + connection_bytes + the shard's pull_diff scratch (4·n bytes, once any
  /// sparse pull ran): what the shard process holds beyond its code and libraries.
  std::uint64_t total_bytes = 0;
};

/// Partitions of `spec`'s built-in model with `classes` classes as its workers lay them
/// out (ps::make_layout of model_tensor_sizes with partition_size; with
/// partition_size_auto, with the least size the leader may choose,
/// kMinAutoPartitionFloats): the most PS shards that each hold some. Throws ConfigError
/// as model_tensor_sizes (a TorchScript model, whose tensors only its workers know, is an
/// unknown model here). Pure; thread-safe.
int model_partitions(const JobSpec& spec, int classes);

/// The least partition `[ps] partition_size = "auto"` cuts, in floats (64 KiB): the
/// CNN's spread shards used it in the comparison (docs/benchmarks/comparison.md, run 6);
/// smaller ones would cost a frame header and an apply per partition for a balance
/// already near even.
inline constexpr std::int64_t kMinAutoPartitionFloats = 16384;

/// The busiest shard's load that counts as even: at most this × an even share (total / shards).
inline constexpr double kEvenShardSlack = 1.15;

/// The partition size of a job with `[ps] partition_size = "auto"` on `shards` shards
/// (>= 1): of the candidates `preferred` (the job's partition_size, 262,144 by default),
/// ⌈total / shards⌉ and ⌈total / (2·shards)⌉ (these two raised to at least
/// kMinAutoPartitionFloats; none above `preferred`), taken largest first, the first whose
/// layout under ps::make_layout (LPT over the packed partitions) has a partition on every
/// shard and a busiest shard of at most kEvenShardSlack × an even share; if none does,
/// the one whose busiest shard holds least (the larger on a tie). Larger partitions mean
/// fewer frame headers and applies per step, so the default stays whenever it
/// already balances (mlp-large on 4 shards); a model smaller than one default partition
/// (the CNN, 60,986 floats) is cut so that every shard holds some. `tensor_sizes` as
/// model_tensor_sizes returns them (each >= 1). Throws ConfigError as ps::make_layout.
/// Pure; thread-safe.
std::int64_t balanced_partition_size(const std::vector<std::int64_t>& tensor_sizes, int shards,
                                     std::int64_t preferred);

/// balanced_partition_size for `spec`'s built-in model with `classes` classes on its
/// spec.ps_shards shards, from spec.partition_size. Throws ConfigError as
/// model_tensor_sizes (a TorchScript model is an unknown model here). Pure; thread-safe.
std::int64_t auto_partition_size(const JobSpec& spec, int classes);

/// The state of the largest shard of `spec` with `classes` classes: its model, its
/// partitions (partition_size) spread over ps_shards shards as the workers lay them out,
/// the PS momentum (0 with dgc), BSP's step accumulator (sync = "sync") and, when
/// compression.downlink_ratio < 1 or method fp16 (compress::keeps_x_seen), one x_seen per worker. Throws ConfigError as model_tensor_sizes.
PsShardMemory ps_shard_memory(const JobSpec& spec, int classes);

/// The refusal of a job whose largest PS shard would need more than `limit_bytes`
/// (the most memory any agent offers), or nullopt when it fits. The message names the
/// fields that change it (workers, ps_shards, compression.downlink_ratio) and the worker
/// count that would fit. Pure; thread-safe.
std::optional<std::string> ps_memory_refusal(const JobSpec& spec, const PsShardMemory& m, std::uint64_t limit_bytes);

}  // namespace dltrain::planner
