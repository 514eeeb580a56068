// The [compression] settings of a job: which method and at what density. Declared here,
// in common/, so that the job specification (job/job_spec.h) does not depend on the
// compression code above it; the names stay in namespace compress, where every user of
// them (compress/, the worker, the leader) looks for them.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "common/enum_names.h"

namespace dltrain::compress {

/// Compression methods of the [compression] section of a job file.
enum class Method {
  kNone,     ///< dense fp32, no state
  kTopk,     ///< exact top-k of the error-feedback accumulator; momentum stays at the PS
  kDgc,      ///< Deep Gradient Compression: momentum correction + masking + sampled top-k
  kRandomk,  ///< k random coordinates (shared seed, indices not sent) with error feedback
  kFp16,     ///< dense binary16 with error feedback of the rounding
  kPowerSgd, ///< low-rank factors by PowerSGD's power iteration with error feedback
             ///< (compress/lowrank.h); momentum stays at the PS
};

/// How the sparse methods' warm-up lowers the density (density_at).
enum class WarmupSchedule {
  kPerEpoch,  ///< "per_epoch": one stage per warm-up epoch
  kStages,    ///< "stages": DGC's four stages spread evenly over the warm-up
};

}  // namespace dltrain::compress

namespace dltrain {
template <>
struct EnumNames<compress::Method> {
  static constexpr std::array<EnumName<compress::Method>, 6> kNames{{{compress::Method::kNone, "none"},
                                                                     {compress::Method::kTopk, "topk"},
                                                                     {compress::Method::kDgc, "dgc"},
                                                                     {compress::Method::kRandomk, "randomk"},
                                                                     {compress::Method::kFp16, "fp16"},
                                                                     {compress::Method::kPowerSgd, "powersgd"}}};
};
template <>
struct EnumNames<compress::WarmupSchedule> {
  static constexpr std::array<EnumName<compress::WarmupSchedule>, 2> kNames{
      {{compress::WarmupSchedule::kPerEpoch, "per_epoch"}, {compress::WarmupSchedule::kStages, "stages"}}};
};
}  // namespace dltrain

namespace dltrain::compress {

/// Settings, validated by the job-file parser.
struct CompressionSpec {
  Method method = Method::kNone;
  /// method = "auto": the leader's planner chooses the method and its setting
  /// (docs/planner.md, "Choosing the compression"); `method` stays kNone until it has.
  bool method_auto = false;
  double ratio = 0.001;          ///< uplink density after warm-up, (0, 1]
  /// PS → worker density, (0, 1]; 1 = dense pulls; 0 = "auto" (downlink_density): what
  /// the workers pushed since the pull before, the default of method = "dgc".
  double downlink_ratio = 1.0;
  double warmup_epochs = 0.0;    ///< epochs of exponentially decreasing density, [0, epochs)
  /// How the warm-up's density falls (density_at): "per_epoch", one step per warm-up epoch,
  /// or "stages", DGC's four steps spread evenly over warmup_epochs however long it is.
  WarmupSchedule warmup_schedule = WarmupSchedule::kPerEpoch;
  double momentum = 0.9;         ///< DGC's worker-side momentum m, [0, 1)
  double clip_norm = 0.0;        ///< local clipping threshold before scaling; 0 = off
  double sample_ratio = 0.01;    ///< DGC's sampled fraction, (0, 1]
  /// topk and dgc: a parameter tensor of fewer bytes (4 per float) is sent in full every
  /// step, besides the partition's top-k: biases and BatchNorm scales and shifts, a
  /// fraction of the floats that sparsification would starve (BytePS's
  /// min_compress_bytes; DGC's reference implementation compresses only tensors of more
  /// than one dimension). [0, 2^31]; 0 = every tensor is sparsified.
  std::int64_t min_compress_bytes = 0;
  /// powersgd: the rank of each matrix's approximation (Vogels et al. 2019), [1, 64]; a
  /// matrix is compressed to min(rank, rows, cols) columns.
  int rank = 4;
};

/// Density in effect at training progress `epoch_pos` (fractional epochs, ≥ 0), in
/// (0, 1]. DGC's warm-up (Lin et al. 2018, §3.4) raises sparsity exponentially — 75 %,
/// 93.75 %, 98.4375 %, 99.6 % — before the target: density 0.25^(k+1) in warm-up stage k
/// (0-based), never below `ratio`, and `ratio` once epoch_pos ≥ warmup_epochs.
/// warmup_schedule "per_epoch": stage k is warm-up epoch k, so a warm-up of 4 epochs is the
/// paper's and one of under an epoch is a single stage at 25 %. "stages": the warm-up is
/// four stages of warmup_epochs / 4 each, so a short warm-up still passes through all four
/// densities (a quarter-epoch warm-up averages 8.3 % density instead of 25 %).
/// powersgd has no density: 1 (dense pushes, PowerSGD's start_powerSGD_iter) during the
/// warm-up, `ratio` after it (any value below 1 means "low rank").
double density_at(const CompressionSpec& spec, double epoch_pos);

/// The downlink density a worker asks for at `epoch_pos`, in (0, 1]: downlink_ratio (with
/// the uplink's warm-up: density_at with ratio = downlink_ratio) or, with "auto" (0), the
/// fraction of coordinates the `workers` workers can have changed since this worker's last
/// pull, min(1, workers × (density_at(spec, epoch_pos) + always_sent_fraction)), where
/// always_sent_fraction ∈ [0, 1] is the share of floats sent in full every step
/// (min_compress_bytes). Under BSP, with the PS's momentum off (dgc), x − x_seen has at
/// most that many non-zero coordinates, so the sparse downlink then carries all of it.
/// powersgd's "auto" is its low-rank downlink: density_at(spec, epoch_pos) (1, dense
/// pulls, in the warm-up; below 1, low-rank pulls, after it); fp16's "auto" is 1, a full
/// pull, which the binary16 downlink carries (half_downlink).
double downlink_density(const CompressionSpec& spec, double epoch_pos, int workers, double always_sent_fraction);

/// Method fp16's "auto" downlink (its default): a step's pull carries all of x − x_seen in
/// binary16 (ps::ShardState::pull_half), half a dense pull's bytes, as DDP's
/// fp16_compress_hook halves both directions of its all-reduce. True for method fp16
/// with downlink_ratio "auto" (0); an explicit downlink_ratio = 1 keeps dense fp32 pulls.
bool half_downlink(const CompressionSpec& spec);

/// Whether the workers' step pulls are differences from what each PS shard records the
/// worker holds (x_seen, 4 bytes a float per worker on the shard): a downlink density
/// below 1 or "auto" (0) — the top-k, low-rank and binary16 downlinks.
bool keeps_x_seen(const CompressionSpec& spec);

/// The tensors method dgc's recipe sends in full: those under 16 KiB (4,096 floats).
inline constexpr std::int64_t kDgcMinCompressBytes = 16384;

/// DGC's recipe where a job file leaves it out (docs/compression.md, "Defaults"), for
/// method dgc: warm-up over min(1, epochs / 4) epochs in DGC's four stages, tensors under
/// 16 KiB (4,096 floats) sent in full, the "auto" downlink; for method powersgd the "auto" downlink
/// (low rank, at the uplink's rank), for method fp16 the "auto" downlink (binary16
/// differences, half_downlink). `given(key)` says whether the job's [compression]
/// table set `key`. Other methods keep their values, except that "auto" becomes 1 (dense
/// pulls) for none.
template <typename Given>
void apply_method_defaults(CompressionSpec& spec, int epochs, Given&& given) {
  if (spec.method == Method::kDgc) {
    if (!given("warmup_epochs")) spec.warmup_epochs = std::min(1.0, epochs / 4.0);
    if (!given("warmup_schedule")) spec.warmup_schedule = WarmupSchedule::kStages;
    if (!given("min_compress_bytes")) spec.min_compress_bytes = kDgcMinCompressBytes;
    if (!given("downlink_ratio")) spec.downlink_ratio = 0;
  }
  if ((spec.method == Method::kPowerSgd || spec.method == Method::kFp16) && !given("downlink_ratio")) {
    spec.downlink_ratio = 0;
  }
  if (spec.method == Method::kNone && spec.downlink_ratio == 0) spec.downlink_ratio = 1.0;
}

}  // namespace dltrain::compress
