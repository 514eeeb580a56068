// Where a worker's batches come from (LibTorch side of lib/data): the IDX data sets as
// in-memory tensors (the original path, unchanged), or CIFAR-10 and ImageFolder (and IDX
// with augmentation or another size) through data::StreamingLoader, a bounded queue of
// batches decoded and augmented on background threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "job/job_spec.h"
#include "train/chunk_claims.h"
#include "train/models.h"
#include "wire/task_events.h"

namespace dltrain::train {

/// One worker's training shard, the test set (rank 0) and the BatchNorm recalibration
/// sample. Used from the training thread only.
class DataFeed {
 public:
  virtual ~DataFeed() = default;
  /// Examples in this worker's shard in every epoch.
  virtual std::int64_t shard_examples() const = 0;
  /// Classes of the data set (the model's outputs).
  virtual std::int64_t classes() const = 0;
  /// What the worker reports in its "data" event.
  virtual wire::events::DataInfo info() const = 0;
  /// Begins `epoch` (0-based): this worker's examples in this epoch's order.
  virtual void start_epoch(int epoch) = 0;
  /// The next batch of the epoch into (x [B, C, S, S] float, y [B] int64); false at the
  /// epoch's end. B may be smaller than the batch size (the last batch; unreadable images
  /// left out) and is 0 for a batch of only unreadable images.
  virtual bool next(torch::Tensor& x, torch::Tensor& y) = 0;
  /// Inputs for BatchNorm re-estimation (a fixed sample of this worker's shard, the test
  /// transform), [M, C, S, S].
  virtual const torch::Tensor& recalibration_inputs() = 0;
  /// Top-1 accuracy in [0, 1] of `model` on the test set (eval mode, no gradients;
  /// leaves the module in train mode). Rank 0 only.
  virtual double evaluate(torch::nn::Module& m, const Model& model) = 0;
  /// Seconds next() spent waiting for the loader so far (0 for in-memory tensors).
  virtual double wait_seconds() const { return 0.0; }
  /// Unreadable images met in the current epoch's training batches plus those of the
  /// latest evaluation (test set): over the workers of one epoch, the number of
  /// unreadable files.
  virtual std::int64_t skipped_images() const { return 0; }
  /// True when batches come from the streaming loader.
  virtual bool streaming() const { return false; }
  /// The skip messages not yet taken (each at most once).
  virtual std::vector<std::string> take_skip_messages() { return {}; }
  /// Elastic jobs: the training position, in epochs, of the batch next() gave last (its
  /// chunk's epoch + chunk / chunks per epoch); -1 for a fixed-size job.
  virtual double position() const { return -1.0; }
  /// Elastic jobs: the worker leaves or finishes (ChunkClaims::release). No-op otherwise.
  virtual void release_chunks() {}
};

/// Makes an elastic job's claims (train/chunk_claims.h) once the feed knows how many
/// chunks an epoch has and how many it wants ahead.
using ClaimsFactory = std::function<std::unique_ptr<ChunkClaims>(std::uint32_t chunks_per_epoch, std::uint32_t ahead)>;

/// The feed of worker `rank` of spec.workers for `spec` (threads: the task's cores, the
/// default of spec.loader_threads). `gen` shuffles the in-memory IDX path (as before).
/// An elastic job's feed (`claims` given) reads the whole training set in the chunks it
/// claims instead of a fixed shard (docs/training.md, "Elastic jobs").
/// Throws ConfigError, ProtocolError or IoError from the readers.
std::unique_ptr<DataFeed> make_data_feed(const JobSpec& spec, int rank, int threads, torch::Generator gen,
                                         const ClaimsFactory& claims = nullptr);

}  // namespace dltrain::train
