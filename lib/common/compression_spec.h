// The [compression] settings of a job: which method and at what density. Declared here,
// in common/, so that the job specification (job/job_spec.h) does not depend on the
// compression code above it; the names stay in namespace compress, where every user of
// them (compress/, the worker, the leader) looks for them.
#pragma once

#include <cstdint>
#include <string>

namespace dltrain::compress {

/// Compression methods of the [compression] section of a job file.
enum class Method {
  kNone,     ///< dense fp32, no state
  kTopk,     ///< exact top-k of the error-feedback accumulator; momentum stays at the PS
  kDgc,      ///< Deep Gradient Compression: momentum correction + masking + sampled top-k
  kRandomk,  ///< k random coordinates (shared seed, indices not sent) with error feedback
  kFp16,     ///< dense binary16 with error feedback of the rounding
};

/// "none" | "topk" | "dgc" | "randomk" | "fp16"; throws ConfigError("compression.method").
Method parse_method(const std::string& name);
/// The job-file name of `m` ("none", "topk", ...).
std::string to_string(Method m);

/// Settings, validated by the job-file parser.
struct CompressionSpec {
  Method method = Method::kNone;
  double ratio = 0.001;          ///< uplink density after warm-up, (0, 1]
  double downlink_ratio = 1.0;   ///< PS → worker density, (0, 1]; 1 = dense pulls
  double warmup_epochs = 0.0;    ///< epochs of exponentially decreasing density, [0, epochs)
  /// How the warm-up's density falls (density_at): "per_epoch", one step per warm-up epoch,
  /// or "stages", DGC's four steps spread evenly over warmup_epochs however long it is.
  std::string warmup_schedule = "per_epoch";
  double momentum = 0.9;         ///< DGC's worker-side momentum m, [0, 1)
  double clip_norm = 0.0;        ///< local clipping threshold before scaling; 0 = off
  double sample_ratio = 0.01;    ///< DGC's sampled fraction, (0, 1]
  /// topk and dgc: a parameter tensor of fewer bytes (4 per float) is sent in full every
  /// step, besides the partition's top-k: biases and BatchNorm scales and shifts, a
  /// fraction of the floats that sparsification would starve (BytePS's
  /// min_compress_bytes; DGC's reference implementation compresses only tensors of more
  /// than one dimension). [0, 2^31]; 0 = every tensor is sparsified.
  std::int64_t min_compress_bytes = 0;
};

/// Density in effect at training progress `epoch_pos` (fractional epochs, ≥ 0), in
/// (0, 1]. DGC's warm-up (Lin et al. 2018, §3.4) raises sparsity exponentially — 75 %,
/// 93.75 %, 98.4375 %, 99.6 % — before the target: density 0.25^(k+1) in warm-up stage k
/// (0-based), never below `ratio`, and `ratio` once epoch_pos ≥ warmup_epochs.
/// warmup_schedule "per_epoch": stage k is warm-up epoch k, so a warm-up of 4 epochs is the
/// paper's and one of under an epoch is a single stage at 25 %. "stages": the warm-up is
/// four stages of warmup_epochs / 4 each, so a short warm-up still passes through all four
/// densities (a quarter-epoch warm-up averages 8.3 % density instead of 25 %).
double density_at(const CompressionSpec& spec, double epoch_pos);

}  // namespace dltrain::compress
