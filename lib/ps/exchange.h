// The worker's side of one exchange with the PS shards, without LibTorch: how the
// compressor's output becomes push frames, what the exchange cost on the wire beside what
// it would have cost dense, and how a worker carries on when a shard goes away. The step
// loop (train/worker_loop.h) uses them so that it reads as the paper's algorithm.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/compression_spec.h"
#include "compress/compressor.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "wire/task_events.h"

namespace dltrain::ps {

/// The matrices of each partition as powersgd sends them (compress::lowrank_blocks with
/// the spec's rank and min_compress_bytes): `tensor_sizes` floats per parameter tensor
/// and `tensor_rows` their first dimensions, in flat order. Throws InvalidArgument when
/// either is missing or they do not add up to the layout.
std::vector<std::vector<compress::LowRankBlock>> matrix_blocks(const compress::CompressionSpec& spec,
                                                              const ps::PartitionLayout& layout,
                                                              std::span<const std::int64_t> tensor_sizes,
                                                              std::span<const std::int64_t> tensor_rows);

/// The low-rank downlink's block headers (PsClientOptions::lowrank_downlink), one per
/// partition: with powersgd and the "auto" downlink (downlink_ratio 0), the tiling of
/// matrix_blocks (a partition without a matrix: one full block, its difference sent
/// whole); otherwise none (an empty list). Throws as matrix_blocks.
std::vector<std::vector<std::uint32_t>> lowrank_pull_headers(const compress::CompressionSpec& spec,
                                                             const ps::PartitionLayout& layout,
                                                             std::span<const std::int64_t> tensor_sizes,
                                                             std::span<const std::int64_t> tensor_rows);

/// Encodes each partition's gradient with the worker's compressor (error feedback, DGC
/// momentum correction and masking, top-k; compress/compressor.h) and maps the result to
/// the frame that carries it: dense fp32, dense fp16, sparse (indices, values) or seeded
/// random-k (values only). Thread-safety: none; one per worker.
class PushEncoder {
 public:
  /// `seed` makes sampling and random-k deterministic per worker. `tensor_sizes`: floats
  /// per parameter tensor in flat order (adding up to layout.total_floats), for
  /// spec.min_compress_bytes: the tensors below it are sent in full every step
  /// (compress::GradientCompressor::send_always). `tensor_rows`: each tensor's first
  /// dimension (1 for a vector), which powersgd needs to see its matrices
  /// (compress::lowrank_blocks). Throws InvalidArgument when they do not add up, or with
  /// powersgd when either is missing.
  PushEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout, std::uint64_t seed,
              std::span<const std::int64_t> tensor_sizes = {}, std::span<const std::int64_t> tensor_rows = {});
  /// The floats sent in full every step (the tensors below min_compress_bytes; with
  /// powersgd, everything that is not compressed as a matrix).
  std::int64_t always_sent_floats() const { return always_sent_; }

  /// Local gradient clipping of the whole flat gradient (DGC §3.4), then one push per
  /// partition of `grad` (layout.total_floats floats) at `density` for global step `step`.
  /// The pushes point into buffers owned by this encoder, valid until the next call.
  std::span<const ps::PartitionPush> encode(std::span<float> grad, int num_workers, double density,
                                            std::uint64_t step);
  /// Encodes partition `key` only (its `grad`, layout length floats), without clipping:
  /// a worker that pushes each partition as soon as backward produced it (overlap).
  /// Returns every partition's push, `key`'s updated; the others keep what they held.
  std::span<const ps::PartitionPush> encode_partition(std::uint32_t key, std::span<const float> grad, double density,
                                                      std::uint64_t step);

 private:
  const ps::PartitionLayout& layout_;
  compress::GradientCompressor compressor_;
  std::vector<ps::PartitionPush> pushes_;
  std::int64_t always_sent_ = 0;
};

/// Bytes a worker's exchanges cost at its sockets, beside what a dense fp32 exchange of
/// the same model costs (a push frame — header plus n floats — and a pull request header
/// per partition up, a dense pull reply per partition down), over the whole run and after
/// the compression warm-up. Gives the achieved compression ratio of the summary.
class TrafficMeter {
 public:
  /// `header_bytes`: wire::kHeaderSize.
  TrafficMeter(const ps::PartitionLayout& layout, std::uint64_t header_bytes);
  /// One step's exchange: `up` / `down` bytes at the sockets, at training progress
  /// `epoch_pos` (fractional epochs; steps before `warmup_epochs` count only in total()).
  void add_step(std::uint64_t up, std::uint64_t down, double epoch_pos, double warmup_epochs);
  /// Bytes of the step counted last that arrived after it was (a pipelined pull's
  /// replies, awaited at the end of an epoch): counted without another step's dense cost.
  void add_bytes(std::uint64_t up, std::uint64_t down, double epoch_pos, double warmup_epochs);
  /// Bytes over every step so far.
  const wire::events::Traffic& total() const { return total_; }
  /// Bytes over the steps after the compression warm-up.
  const wire::events::Traffic& after_warmup() const { return after_warmup_; }
  /// Bytes one dense fp32 exchange of the model costs, up (pushes and pull requests) and
  /// down (pull replies).
  std::uint64_t dense_up_per_step() const { return dense_up_; }
  std::uint64_t dense_down_per_step() const { return dense_down_; }

 private:
  std::uint64_t dense_up_ = 0, dense_down_ = 0;
  wire::events::Traffic total_, after_warmup_;
};

/// Carries a worker on when a PS shard goes away (its process died and its agent restarts
/// it on the same port from its latest checkpoint): reconnect, offer the worker's replica
/// as init, take the shard's parameters with a dense pull (PsClient::resync) and report a
/// ps_resync event. The step whose exchange failed is lost. Bounded: each resync by the
/// client's reconnect timeout, and resyncs in a row without a successful call by
/// `max_in_a_row`. Thread-safety: none; the worker's thread.
class PsResyncer {
 public:
  /// `on_params` is called after a resync: `params` then hold the PS's values.
  PsResyncer(ps::PsClient& client, std::span<float> params, int rank, std::function<void()> on_params,
             std::function<void(const nlohmann::json&)> sink, int max_in_a_row = 10);

  /// Runs `call` until it completes without losing a connection, resyncing after each
  /// loss. Throws IoError when the shards cannot be reached again or after max_in_a_row
  /// losses in a row, and whatever `call` throws other than PsConnectionLost.
  void run(const std::function<void()>& call);
  /// After a call that completed: the count of losses in a row starts again.
  void succeeded() { in_a_row_ = 0; }
  /// Set once this worker told the shards it is done: a shard that restarted without a
  /// checkpoint has forgotten it, so every resync then says it again.
  void set_done_sent() { done_sent_ = true; }
  /// Resyncs so far (this process).
  int resyncs() const { return resyncs_; }
  /// Recovers from `lost` (the call it broke is not repeated).
  void recover(const ps::PsConnectionLost& lost);

 private:
  ps::PsClient& client_;
  std::span<float> params_;
  int rank_;
  std::function<void()> on_params_;
  std::function<void(const nlohmann::json&)> sink_;
  int max_in_a_row_;
  int in_a_row_ = 0;
  int resyncs_ = 0;
  bool done_sent_ = false;
};

}  // namespace dltrain::ps
