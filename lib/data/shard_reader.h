// What a worker reads of a sharded data set (docs/data.md, "How workers read shards"):
// each epoch its run of samples (deal_shards) in windows of a few shards whose samples are
// shuffled together, each window's shards asked of the agent's cache (data/shard_client.h),
// read into memory as encoded images and let go; the next window is read in the background
// while the current one trains, and the agent is asked at the epoch's start to prefetch
// every shard of the epoch. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard_client.h"
#include "data/shards.h"

namespace dltrain::data {

/// Encoded images held in memory (a window of shard samples, or a test split), decoded on
/// load(). Immutable; thread-safe.
class EncodedSource final : public ExampleSource {
 public:
  explicit EncodedSource(std::vector<ShardSample> samples, std::string origin)
      : samples_(std::move(samples)), origin_(std::move(origin)) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(samples_.size()); }
  int label(std::int64_t i) const override { return samples_[static_cast<std::size_t>(i)].label; }
  /// Throws CorruptImage naming the sample.
  Image load(std::int64_t i, int channels) const override;
  /// "<shard URL> sample KEY".
  std::string name(std::int64_t i) const override;

 private:
  std::vector<ShardSample> samples_;
  std::string origin_;  // the data set's URL
};

/// How a ShardReader reads: who it is in the job and how it windows.
struct ShardReaderOptions {
  std::string data;       ///< the data set's location (JobSpec::data)
  int rank = 0;           ///< this worker, [0, workers)
  int workers = 1;        ///< >= 1
  std::uint64_t seed = 0; ///< the job's seed
  std::int64_t window = 4;  ///< shards shuffled together, >= 1
  /// The batch size: every window but the epoch's last hands out a whole number of
  /// batches (the samples left over join the next window), so that only the epoch's last
  /// batch is short, as with one loader over the whole epoch. >= 1.
  std::int64_t batch = 1;
};

/// Counters of what a reader asked its agent's cache.
struct ShardReadStats {
  std::int64_t shards = 0;        ///< shards read (acquired)
  std::int64_t hits = 0;          ///< of them, already in the cache
  std::int64_t bytes = 0;         ///< bytes read from the cache
  double wait_seconds = 0;        ///< time acquire() waited in all
};

/// See the file comment. Thread-safety: one thread calls the members; the reader's own
/// background thread shares only the client, under a mutex.
class ShardReader {
 public:
  /// Reads the manifest through `client` (data + "/manifest.json") and checks it. Throws
  /// ConfigError("data", …) for a bad manifest or a data set with fewer training samples
  /// than workers; IoError with the agent's message when it cannot be read.
  ShardReader(std::shared_ptr<ShardCacheClient> client, ShardReaderOptions options);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const Manifest& manifest() const { return manifest_; }
  /// Training samples this worker reads each epoch (shard_size of the split's total).
  std::int64_t epoch_samples() const;

  /// Begins `epoch`: asks the agent to prefetch this epoch's shards, starts reading the
  /// first window in the background. A window still being read is waited for first.
  void start_epoch(std::int64_t epoch);
  /// The next window of the epoch: its samples and their shuffled order (a function of
  /// seed, epoch, rank and window), a whole number of batches but for the last window (the
  /// remainder is carried into the next). Waits for it; starts reading the one after.
  /// Returns false after the last one. Throws what reading a shard throws (IoError with the
  /// agent's message naming the shard and URL, ProtocolError for a malformed shard).
  bool next_window(std::shared_ptr<const ExampleSource>& source, std::vector<std::int64_t>& order);
  /// Every sample of the test split (read once, then kept).
  std::shared_ptr<const ExampleSource> test_set();
  /// Up to `max` samples of this worker's first window of epoch 0 (BatchNorm
  /// recalibration).
  std::shared_ptr<const ExampleSource> sample(std::int64_t max);
  /// The counters so far.
  ShardReadStats stats() const;

 private:
  std::vector<ShardSample> read_slices(const ShardSplit& split, const std::vector<ShardSlice>& slices);
  std::vector<ShardSample> read_window(std::size_t w);

  std::shared_ptr<ShardCacheClient> client_;
  ShardReaderOptions o_;
  Manifest manifest_;
  std::int64_t epoch_ = -1;
  std::vector<ShardSlice> slices_;                // this epoch's
  std::vector<std::int64_t> windows_;             // slices per window
  std::size_t next_ = 0;                          // the next window to hand out
  std::future<std::vector<ShardSample>> pending_;  // window next_, being read
  std::vector<ShardSample> carry_;                 // samples left over from the last window
  std::shared_ptr<const ExampleSource> test_;
  mutable std::mutex mu_;  // the client, stats_
  ShardReadStats stats_;
};

}  // namespace dltrain::data
