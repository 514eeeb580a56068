// The compression dimension of the planner (docs/planner.md, "Choosing the compression"):
// the methods `[compression] method = "auto"` chooses among, the bytes each puts on a
// worker's link per step, and the seconds those bytes take over a measured link. Plain
// functions of numbers; nothing here touches a socket or the history. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/compression_spec.h"

namespace dltrain::planner {

/// A compression method and its setting, as a planner candidate and a history row name
/// it. `setting`: the uplink density after warm-up of the sparse methods (topk, dgc,
/// randomk), in (0, 1]; the rank of powersgd, [1, 64]; 1 for none and fp16.
struct MethodOption {
  compress::Method method = compress::Method::kNone;
  double setting = 1.0;
  bool operator==(const MethodOption&) const = default;
};

/// The setting a job's [compression] gives its method (MethodOption::setting).
MethodOption method_option(const compress::CompressionSpec& spec);

/// "none", "fp16", "dgc 1%", "dgc 0.1%", "topk 5%", "powersgd rank 4": what plans,
/// events and `dltrain plan` print.
std::string method_label(const MethodOption& m);

/// The candidates of `method = "auto"` (issue and docs/planner.md): dense fp32, dense
/// binary16, and DGC (Lin et al., ICLR 2018) at densities 1 % and 0.1 %, each with its
/// recipe's defaults (compress::apply_method_defaults). PowerSGD joins them where the
/// history has measured it (its bytes depend on the matrices' shapes, which the leader
/// does not know before a worker builds the model).
std::vector<MethodOption> auto_method_options();

/// The fraction of coordinates a method keeps, in (0, 1], the axis along which final
/// accuracy is modelled as non-decreasing: 1 for none and fp16 (every coordinate, fp16
/// rounding's error fed back), the setting for the sparse methods; nullopt for
/// powersgd, whose accuracy is modelled on its own.
std::optional<double> method_density(const MethodOption& m);

/// Payload bytes one worker's link carries per step under `m`, push plus pull, frame
/// headers left out (docs/protocol.md: dense fp32 4 bytes a coordinate, dense fp16 2,
/// sparse fp32 8 — a u32 index and an fp32 value):
///  - none: 4P up, 4P down; fp16: 2P up, 2P down (its binary16 "auto" downlink);
///  - topk/dgc/randomk at density d: 8·d·P_c + 4·P_s up, where P_s are the floats of the
///    tensors under `min_compress_bytes` (sent in full) and P_c the rest; down, the "auto"
///    downlink's density q = min(1, workers·(d + P_s/P)) at 8 bytes a coordinate, or 4P
///    when that is less (compress::downlink_density);
///  - powersgd: nullopt (shapes unknown here).
/// `tensor_sizes`: element counts of the model's parameter tensors (ps_memory.h's
/// model_tensor_sizes), non-empty; `workers` >= 1; `min_compress_bytes` in bytes (4 a
/// float), >= 0. Nullopt also for an empty list.
std::optional<double> wire_bytes_per_step(const MethodOption& m, const std::vector<std::int64_t>& tensor_sizes,
                                          int workers, std::int64_t min_compress_bytes);

/// The min_compress_bytes a method's recipe sends in full (16 KiB for dgc,
/// compress::apply_method_defaults; 0 otherwise).
std::int64_t default_min_compress_bytes(const MethodOption& m);

/// Seconds of communication per training image (all workers together) when the workers
/// exchange `bytes_per_image` (push + pull, all workers, per image trained) with
/// `shards` PS shards over links of `link_bytes_per_sec` bytes/s each way (full duplex): half
/// the bytes go each way, and they cross min(workers, shards) links in parallel — every
/// worker's when there are as many shards as workers, else the shards' (each shard's
/// link carries workers/shards workers' share). So bytes_per_image / (2·B·min(w, S)).
/// An additive model: a step's communication does not overlap its computation
/// (docs/planner.md says where that is wrong). 0 when the link is unknown
/// (`link_bytes_per_sec` <= 0). `workers`, `shards` >= 1.
double comm_seconds_per_image(double bytes_per_image, int workers, int shards, double link_bytes_per_sec);

}  // namespace dltrain::planner
