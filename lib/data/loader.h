// The streaming data loader: decoding and augmentation of a worker's examples on a pool
// of background threads into a bounded queue of ready batches, so that memory does not
// grow with the data set and the training step does not wait when the pool keeps up.
// Plain C++ (float buffers), no LibTorch: the worker wraps a batch in a tensor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/augment.h"
#include "data/cifar10.h"
#include "data/idx.h"
#include "data/image.h"
#include "data/imagefolder.h"

namespace dltrain::data {

/// Examples a loader can read: a count, a label each, and the decoded image of each.
/// Implementations are immutable after construction; load() is called from several
/// loader threads at once and must be thread-safe.
class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  /// Examples, >= 0.
  virtual std::int64_t size() const = 0;
  /// Class index of example i, [0, classes).
  virtual int label(std::int64_t i) const = 0;
  /// Example i decoded with `channels` channels (1 or 3) at its own size. Throws
  /// CorruptImage (or IoError) for an example that cannot be read: the loader skips and
  /// counts it.
  virtual Image load(std::int64_t i, int channels) const = 0;
  /// A name for messages (the file path, or "record i").
  virtual std::string name(std::int64_t i) const = 0;
};

/// An IDX split (28×28 gray, labels 0–9) as InMemoryImages: 1 channel, its pixels
/// copied, its labels widened. Pure; never throws but for allocation.
InMemoryImages idx_as_in_memory(const Split& s);

/// Images already in memory (IDX, CIFAR-10).
class InMemorySource final : public ExampleSource {
 public:
  explicit InMemorySource(InMemoryImages images) : images_(std::move(images)) {}
  std::int64_t size() const override { return images_.count; }
  int label(std::int64_t i) const override { return images_.labels[static_cast<std::size_t>(i)]; }
  Image load(std::int64_t i, int channels) const override;
  std::string name(std::int64_t i) const override { return "record " + std::to_string(i); }
  const InMemoryImages& images() const { return images_; }

 private:
  InMemoryImages images_;
};

/// Image files (an ImageFolder split), read and decoded on load(). With a cache budget,
/// the decoded pixels of each image are kept after its first load, until the budget
/// (bytes of pixels) is spent; later loads of a kept image copy it instead of reading and
/// decoding the file again. Memory: at most cache_bytes of pixels, plus one pointer per
/// file and one Image header and allocation per kept image. Unreadable files are never kept (each load
/// fails again, and is counted again). Thread-safe: load() from any number of threads.
class ImageFileSource final : public ExampleSource {
 public:
  /// `cache_bytes` >= 0; 0 = decode on every load.
  explicit ImageFileSource(std::vector<ImageFile> files, std::int64_t cache_bytes = 0);
  ~ImageFileSource() override;
  ImageFileSource(const ImageFileSource&) = delete;
  ImageFileSource& operator=(const ImageFileSource&) = delete;
  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  int label(std::int64_t i) const override { return files_[static_cast<std::size_t>(i)].label; }
  Image load(std::int64_t i, int channels) const override;
  std::string name(std::int64_t i) const override { return files_[static_cast<std::size_t>(i)].path; }
  /// Images kept decoded so far, and the bytes of pixels they hold (<= cache_bytes).
  std::int64_t cached_images() const { return cached_.load(std::memory_order_relaxed); }
  std::int64_t cached_bytes() const { return cache_used_.load(std::memory_order_relaxed); }

 private:
  std::vector<ImageFile> files_;
  const std::int64_t cache_bytes_;
  // One slot per file: null, or the decoded image (published once with release order,
  // read with acquire; never replaced or freed before the destructor).
  mutable std::vector<std::atomic<const Image*>> slots_;
  mutable std::atomic<std::int64_t> cache_used_{0};
  mutable std::atomic<std::int64_t> cached_{0};
};

/// How each example becomes a network input.
struct Transform {
  int image_size = 32;          ///< output height and width, pixels
  int channels = 3;             ///< 1 or 3
  std::vector<float> mean{0.0f, 0.0f, 0.0f};  ///< per channel, of pixel/255
  std::vector<float> std{1.0f, 1.0f, 1.0f};   ///< per channel, > 0
  bool train = false;           ///< apply `augment` (else the test transform)
  AugmentSpec augment;
};

/// Loader settings.
struct LoaderOptions {
  int batch_size = 64;     ///< examples per batch, >= 1 (the last batch may be smaller)
  int threads = 1;         ///< decoding threads, >= 1
  int queue_batches = 0;   ///< bound on batches ready or being built; 0 = 2 × threads (>= 2)
  std::uint64_t seed = 0;  ///< augmentation seed; example e draws from mix64(seed ^ mix64(e))
};

/// One ready batch: `size` examples as floats [size, channels, image_size, image_size]
/// (CHW per example), normalised (pixel/255 − mean[c]) / std[c], and their labels.
/// Examples that could not be read are left out (size shrinks) and counted in `skipped`.
struct Batch {
  std::int64_t index = 0;              ///< 0-based batch number in the order
  int size = 0;                        ///< examples kept
  std::vector<float> images;           ///< size·channels·image_size²
  std::vector<std::int64_t> labels;    ///< size
  int skipped = 0;                     ///< unreadable examples left out
  std::vector<std::string> skipped_messages;  ///< why, one per skipped example
};

/// Produces the batches of `order` (indices into the source, batch b = order[b·B …
/// (b+1)·B)) in order, built by `threads` background threads. At most
/// `queue_batches` batches are ready or being built at any time, so memory is bounded by
/// queue_batches × batch bytes plus one decoded image per thread, whatever the data set's
/// size. The output is a function of (source, order, transform, batch_size, seed) only,
/// not of the thread count or timing. Thread-safety: one consumer thread calls next();
/// stop() may be called from any thread.
class StreamingLoader {
 public:
  /// Starts the threads. Throws InvalidArgument for a batch_size or threads < 1, a
  /// mean/std whose size is not channels, or an index outside the source.
  StreamingLoader(std::shared_ptr<const ExampleSource> source, std::vector<std::int64_t> order, Transform transform,
                  LoaderOptions options);
  /// Stops and joins the threads (within one example's decoding time).
  ~StreamingLoader();
  StreamingLoader(const StreamingLoader&) = delete;
  StreamingLoader& operator=(const StreamingLoader&) = delete;

  /// Waits for the next batch and moves it into `out`. Returns false after the last one
  /// or once stopped. Rethrows an unexpected error of a loader thread (anything but
  /// CorruptImage or IoError, which skip the example).
  bool next(Batch& out);
  /// Asks the threads to stop; next() then returns false. Idempotent.
  void stop();
  /// Batches in the order: ⌈order.size() / batch_size⌉.
  std::int64_t batches() const { return batches_; }
  /// The most batches that were ready or being built at once (<= the queue bound).
  std::int64_t max_in_flight() const;
  /// The queue bound in effect (options.queue_batches or its default).
  int queue_bound() const { return bound_; }

 private:
  struct StopRequestedInBuild {};  // unwinds a thread's build() after stop()
  void run_thread();
  Batch build(std::int64_t b) const;

  std::shared_ptr<const ExampleSource> source_;
  std::vector<std::int64_t> order_;
  Transform transform_;
  LoaderOptions options_;
  std::int64_t batches_ = 0;
  int bound_ = 2;

  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::map<std::int64_t, Batch> ready_;
  std::int64_t next_claim_ = 0, next_out_ = 0, max_in_flight_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

/// Per-channel mean and standard deviation of pixel/255 over up to `samples` examples
/// of `source` (the first `samples` of epoch_permutation(size, seed, -1), so every
/// worker of a job computes the same figures), after the test transform at
/// `image_size`. Unreadable examples are skipped. Uses `threads` loader threads.
/// Throws InvalidArgument when no example could be read.
struct ChannelStats {
  std::vector<float> mean, std;
  std::int64_t images = 0;  ///< examples the figures are computed on
};
ChannelStats estimate_mean_std(std::shared_ptr<const ExampleSource> source, int image_size, int channels,
                               std::int64_t samples, std::uint64_t seed, int threads);

}  // namespace dltrain::data
