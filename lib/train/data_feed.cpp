#include "train/data_feed.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "common/errors.h"
#include "data/cifar10.h"
#include "data/export.h"
#include "data/imagefolder.h"
#include "data/loader.h"
#include "data/shard_reader.h"
#include "data/sharding.h"
#include "data/idx.h"
#include "train/tensors.h"

namespace dltrain::train {
namespace {

constexpr std::int64_t kMeanStdSample = 512;        // images mean/std are estimated on
constexpr std::int64_t kRecalibrationBytes = 64 << 20;  // bound on the BatchNorm sample
constexpr std::size_t kSkipMessages = 20;           // skipped_image events per worker


// The class names of the data sets whose labels are numbers, by label: Fashion-MNIST's
// (Xiao et al. 2017, Table 1, file-system safe as `dltrain dataset from-idx` writes them),
// MNIST's digits, CIFAR-10's (its batches.meta.txt).
std::vector<std::string> published_class_names(DatasetKind dataset) {
  if (dataset == DatasetKind::kFashionMnist) return data::fashion_mnist_classes();
  if (dataset == DatasetKind::kMnist) return {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  if (dataset == DatasetKind::kCifar10) {
    return {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  }
  return {};
}

/// An elastic job's order: the chunks it claims (train/chunk_claims.h), each a run of B
/// positions of its epoch's permutation of the whole training set (data::epoch_permutation,
/// the same on every worker).
class ElasticOrder {
 public:
  ElasticOrder(const ClaimsFactory& make, std::int64_t n, int batch, std::uint64_t seed, std::uint32_t ahead)
      : n_(n), batch_(batch), seed_(seed),
        claims_(make(static_cast<std::uint32_t>((n + batch - 1) / batch), ahead)) {}
  ChunkClaims& claims() { return *claims_; }
  /// The examples of chunk `c` (at most B; fewer in the epoch's last chunk).
  std::vector<std::int64_t> examples(const ps::Chunk& c) {
    auto it = perms_.find(c.epoch);
    if (it == perms_.end()) {
      if (perms_.size() >= 2) perms_.erase(perms_.begin());  // a worker spans at most two epochs at once
      it = perms_.emplace(c.epoch, data::epoch_permutation(n_, seed_, c.epoch)).first;
    }
    const std::int64_t lo = std::min<std::int64_t>(n_, static_cast<std::int64_t>(c.index) * batch_);
    const std::int64_t hi = std::min<std::int64_t>(n_, lo + batch_);
    return {it->second.begin() + lo, it->second.begin() + hi};
  }
  double position(const ps::Chunk& c) const {
    return c.epoch + static_cast<double>(c.index) / static_cast<double>(claims_->chunks_per_epoch());
  }

 private:
  std::int64_t n_;
  int batch_;
  std::uint64_t seed_;
  std::unique_ptr<ChunkClaims> claims_;
  std::map<std::uint32_t, std::vector<std::int64_t>> perms_;
};

/// The original path: the IDX training shard and test set as tensors, a fixed shard
/// (i ≡ rank mod workers) shuffled every epoch by the worker's generator.
class TensorFeed final : public DataFeed {
 public:
  TensorFeed(JobSpec spec, int rank, torch::Generator gen, const ClaimsFactory& claims)
      : spec_(std::move(spec)), rank_(rank), gen_(std::move(gen)), base_seed_(gen_.current_seed()) {
    data::Split train = data::load_split(spec_.data_dir, "train", spec_.train_samples);
    train_total_ = train.images.count;
    std::tie(x_, y_) = to_tensors(train, spec_.dataset);
    if (claims) {
      // Elastic: the whole set, read in the chunks this worker claims.
      elastic_.emplace(claims, x_.size(0), spec_.batch_size, static_cast<std::uint64_t>(spec_.seed), 2);
    } else {
      auto idx = torch::tensor(data::shard_indices(x_.size(0), rank, spec_.workers), torch::kInt64);
      x_ = x_.index_select(0, idx).contiguous();
      y_ = y_.index_select(0, idx).contiguous();
    }
    if (rank == 0) {
      data::Split test = data::load_split(spec_.data_dir, "test", spec_.test_samples);
      std::tie(test_x_, test_y_) = to_tensors(test, spec_.dataset);
    }
  }
  std::int64_t shard_examples() const override {
    return elastic_ ? (x_.size(0) + spec_.workers - 1) / spec_.workers : x_.size(0);
  }
  std::int64_t classes() const override { return 10; }
  double position() const override { return position_; }
  void release_chunks() override {
    if (elastic_) elastic_->claims().release();
  }
  wire::events::DataInfo info() const override {
    wire::events::DataInfo d;
    d.rank = rank_;
    d.dataset = enum_name(spec_.dataset);
    d.classes = 10;
    d.train_images = train_total_;
    d.test_images = test_x_.defined() ? test_x_.size(0) : 0;
    d.image_size = 28;
    d.channels = 1;
    d.mean = {idx_mean(spec_.dataset)};
    d.std = {idx_std(spec_.dataset)};
    d.normalization = "published";
    d.class_names = published_class_names(spec_.dataset);
    return d;
  }
  // Each epoch's order is a function of the job's seed, the rank and the epoch alone (the
  // first epoch's is the generator's own): a worker that starts at a later epoch (a
  // restart, `dltrain resume`) sees the order an uninterrupted run saw there.
  void start_epoch(int epoch) override {
    epoch_ = epoch;
    if (elastic_) return;
    {
      std::lock_guard<std::mutex> lock(gen_.mutex());
      gen_.set_current_seed(base_seed_ + static_cast<std::uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL);
    }
    perm_ = torch::randperm(x_.size(0), gen_, torch::kInt64);
    pos_ = 0;
  }
  bool next(torch::Tensor& x, torch::Tensor& y) override {
    if (elastic_) {
      auto& claims = elastic_->claims();
      const auto chunk = claims.hand(static_cast<std::uint32_t>(epoch_));
      if (!chunk) {
        claims.epoch_ends();
        return false;
      }
      claims.batch_begins();
      auto examples = elastic_->examples(*chunk);
      const auto idx = torch::tensor(examples, torch::kInt64);
      x = x_.index_select(0, idx);
      y = y_.index_select(0, idx);
      position_ = elastic_->position(*chunk);
      return true;
    }
    const std::int64_t n = x_.size(0);
    if (pos_ >= n) return false;
    const std::int64_t hi = std::min(n, pos_ + spec_.batch_size);
    const auto idx = perm_.slice(0, pos_, hi);
    x = x_.index_select(0, idx);
    y = y_.index_select(0, idx);
    pos_ = hi;
    return true;
  }
  const torch::Tensor& recalibration_inputs() override { return x_; }
  double evaluate(torch::nn::Module& m, const Model& model) override {
    return train::evaluate(m, model, test_x_, test_y_, spec_.eval_batch_size);
  }

 private:
  const JobSpec spec_;  // with apply_data_defaults applied
  int rank_;
  torch::Generator gen_;
  std::uint64_t base_seed_;  ///< gen_'s seed as given: the first epoch's
  std::int64_t train_total_ = 0;
  torch::Tensor x_, y_, test_x_, test_y_, perm_;
  std::int64_t pos_ = 0;
  std::optional<ElasticOrder> elastic_;  ///< an elastic job's chunks, else empty
  int epoch_ = 0;
  double position_ = -1.0;
};

// The first `limit` examples (train_samples/test_samples): for an ImageFolder, whose
// list is sorted by class, a seeded sample instead, so that every class keeps its share.
std::vector<data::ImageFile> limit_files(std::vector<data::ImageFile> files, std::int64_t limit, std::uint64_t seed) {
  if (limit <= 0 || limit >= static_cast<std::int64_t>(files.size())) return files;
  auto pick = data::epoch_permutation(static_cast<std::int64_t>(files.size()), seed, -2);
  pick.resize(static_cast<std::size_t>(limit));
  std::sort(pick.begin(), pick.end());
  std::vector<data::ImageFile> out;
  out.reserve(pick.size());
  for (const auto i : pick) out.push_back(std::move(files[static_cast<std::size_t>(i)]));
  return out;
}

torch::Tensor images_tensor(data::Batch& b, int c, int s) {
  return torch::from_blob(b.images.data(), {b.size, c, s, s}, torch::kFloat32).clone();
}

/// CIFAR-10, ImageFolder, and IDX when it needs the loader: a new shard of the whole
/// training set every epoch (data::epoch_shard), streamed through data::StreamingLoader.
/// A sharded data set: the worker's run of samples each epoch in windows of shards
/// (data::ShardReader), each window streamed through its own StreamingLoader.
class StreamFeed final : public DataFeed {
 public:
  StreamFeed(JobSpec spec, int rank, int threads, std::unique_ptr<data::ShardReader> shards = nullptr,
             const ClaimsFactory& claims = nullptr)
      : spec_(std::move(spec)), rank_(rank), shards_(std::move(shards)) {
    threads_ = spec_.loader_threads > 0 ? spec_.loader_threads : std::max(1, threads);
    load_sources();
    if (claims) {
      // Elastic: windows of the chunks this worker claims, one loader each.
      window_chunks_ = static_cast<std::uint32_t>(std::clamp(spec_.loader_queue > 0 ? spec_.loader_queue : 2 * threads_, 2, 16));
      elastic_.emplace(claims, train_->size(), spec_.batch_size, static_cast<std::uint64_t>(spec_.seed), window_chunks_);
    }
    transform_.image_size = spec_.image_size;
    transform_.channels = spec_.channels;
    set_normalization();
    transform_.augment = spec_.augment;
  }

  std::int64_t shard_examples() const override {
    if (elastic_) return (train_->size() + spec_.workers - 1) / spec_.workers;
    return shards_ ? shards_->epoch_samples() : data::shard_size(train_->size(), rank_, spec_.workers);
  }
  double position() const override { return position_; }
  void release_chunks() override {
    if (elastic_) elastic_->claims().release();
  }
  std::int64_t classes() const override { return classes_; }
  bool streaming() const override { return true; }
  double wait_seconds() const override { return wait_seconds_; }
  std::int64_t skipped_images() const override { return train_skipped_ + test_skipped_; }
  std::vector<std::string> take_skip_messages() override { return std::exchange(messages_, {}); }

  wire::events::DataInfo info() const override {
    wire::events::DataInfo d;
    d.rank = rank_;
    d.dataset = enum_name(spec_.dataset);
    d.classes = classes_;
    d.train_images = shards_ ? shards_->manifest().train.samples : train_->size();
    d.test_images = shards_ ? (rank_ == 0 ? shards_->manifest().test.samples : 0) : test_ ? test_->size() : 0;
    d.image_size = spec_.image_size;
    d.channels = spec_.channels;
    d.mean.assign(transform_.mean.begin(), transform_.mean.end());
    d.std.assign(transform_.std.begin(), transform_.std.end());
    d.normalization = normalization_;
    d.class_names = class_names_.empty() ? published_class_names(spec_.dataset) : class_names_;
    if (sample_images_ > 0) d.sample_images = sample_images_;
    d.loader_threads = threads_;
    d.loader_queue = spec_.loader_queue > 0 ? spec_.loader_queue : std::max(2, 2 * threads_);
    return d;
  }

  void start_epoch(int epoch) override {
    loader_.reset();  // joins the previous epoch's threads
    train_skipped_ = 0;
    if (elastic_) {
      epoch_ = epoch;
      window_.clear();
      return;
    }
    if (shards_) {
      epoch_ = epoch;
      shards_->start_epoch(epoch);
      return;
    }
    auto order = data::epoch_shard(train_->size(), rank_, spec_.workers, static_cast<std::uint64_t>(spec_.seed), epoch);
    auto t = transform_;
    t.train = true;
    loader_ = std::make_unique<data::StreamingLoader>(train_, std::move(order), t, options(epoch));
  }

  bool next(torch::Tensor& x, torch::Tensor& y) override {
    const auto t0 = std::chrono::steady_clock::now();
    data::Batch b;
    bool got = loader_ && loader_->next(b);
    if (elastic_ && !got) got = next_window(b);
    while (!got && shards_) {  // the next window of shards, if any
      std::shared_ptr<const data::ExampleSource> window;
      std::vector<std::int64_t> order;
      loader_.reset();
      if (!shards_->next_window(window, order)) break;
      auto t = transform_;
      t.train = true;
      auto o = options(epoch_);
      o.seed ^= data::mix64(static_cast<std::uint64_t>(++window_count_));
      loader_ = std::make_unique<data::StreamingLoader>(std::move(window), std::move(order), t, o);
      got = loader_->next(b);
    }
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!got) return false;
    if (elastic_) {
      // Batch k of a window is its k-th chunk (only an epoch's last chunk is short, and
      // it ends its window).
      elastic_->claims().batch_begins();
      position_ = elastic_->position(window_.front());
      window_.pop_front();
    }
    note_skips(b, train_skipped_);
    x = images_tensor(b, spec_.channels, spec_.image_size);
    y = torch::tensor(b.labels, torch::kInt64);
    return true;
  }

  const torch::Tensor& recalibration_inputs() override {
    if (recal_.defined()) return recal_;
    const std::int64_t per = static_cast<std::int64_t>(spec_.channels) * spec_.image_size * spec_.image_size * 4;
    const std::int64_t want = std::clamp<std::int64_t>(kRecalibrationBytes / per, 64, 2000);
    auto source = shards_ ? shards_->sample(want) : train_;
    auto order = shards_ ? all_of(*source)
                         : data::epoch_shard(train_->size(), rank_, spec_.workers, static_cast<std::uint64_t>(spec_.seed), 0);
    if (static_cast<std::int64_t>(order.size()) > want) order.resize(static_cast<std::size_t>(want));
    std::vector<torch::Tensor> parts;
    std::int64_t ignored = 0;  // met again in the epochs
    run_loader(source, std::move(order), ignored, [&](torch::Tensor x, torch::Tensor) { parts.push_back(std::move(x)); });
    recal_ = torch::cat(parts, 0);
    return recal_;
  }

  double evaluate(torch::nn::Module& m, const Model& model) override {
    torch::NoGradGuard ng;
    m.eval();
    if (shards_ && !test_) test_ = std::const_pointer_cast<data::ExampleSource>(shards_->test_set());
    auto all = all_of(*test_);
    std::int64_t correct = 0, total = 0;
    test_skipped_ = 0;
    run_loader(test_, std::move(all), test_skipped_, [&](const torch::Tensor& x, const torch::Tensor& y) {
      correct += model.forward(x).argmax(1).eq(y).sum().item<std::int64_t>();
      total += x.size(0);
    });
    m.train(true);
    if (total == 0) throw Error("none of the " + std::to_string(test_->size()) + " test images could be read");
    return static_cast<double>(correct) / static_cast<double>(total);
  }

 private:
  // Elastic: the next window of claimed chunks as a loader, and its first batch; false
  // once the epoch has no chunk left.
  bool next_window(data::Batch& b) {
    auto& claims = elastic_->claims();
    for (;;) {
      loader_.reset();
      window_.clear();
      std::vector<std::int64_t> order;
      while (window_.size() < window_chunks_) {
        const auto chunk = claims.hand(static_cast<std::uint32_t>(epoch_));
        if (!chunk) break;
        window_.push_back(*chunk);
        const auto ex = elastic_->examples(*chunk);
        order.insert(order.end(), ex.begin(), ex.end());
        if (static_cast<int>(ex.size()) < spec_.batch_size) break;  // a short chunk ends its window
      }
      if (window_.empty()) {
        claims.epoch_ends();
        return false;
      }
      auto t = transform_;
      t.train = true;
      auto o = options(epoch_);
      o.seed ^= data::mix64(static_cast<std::uint64_t>(++window_count_));
      loader_ = std::make_unique<data::StreamingLoader>(train_, std::move(order), t, o);
      if (loader_->next(b)) return true;
    }
  }

  static std::vector<std::int64_t> all_of(const data::ExampleSource& s) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(s.size()));
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
    return all;
  }

  void load_sources() {
    const auto seed = static_cast<std::uint64_t>(spec_.seed);
    if (shards_) {
      classes_ = static_cast<std::int64_t>(shards_->manifest().classes.size());
      class_names_ = shards_->manifest().classes;
      return;
    }
    if (spec_.dataset == DatasetKind::kImageFolder) {
      auto idx = data::scan_image_folder(spec_.data_dir);
      classes_ = static_cast<std::int64_t>(idx.classes.size());
      class_names_ = idx.classes;
      const std::int64_t cache = spec_.loader_cache_mb << 20;
      train_ = std::make_shared<data::ImageFileSource>(limit_files(std::move(idx.train), spec_.train_samples, seed),
                                                       cache);
      if (rank_ == 0) {
        test_ = std::make_shared<data::ImageFileSource>(limit_files(std::move(idx.test), spec_.test_samples, seed),
                                                        cache);
      }
    } else if (spec_.dataset == DatasetKind::kCifar10) {
      train_ = std::make_shared<data::InMemorySource>(data::load_cifar10(spec_.data_dir, "train", spec_.train_samples));
      if (rank_ == 0) {
        test_ = std::make_shared<data::InMemorySource>(data::load_cifar10(spec_.data_dir, "test", spec_.test_samples));
      }
    } else {
      train_ = std::make_shared<data::InMemorySource>(data::idx_as_in_memory(data::load_split(spec_.data_dir, "train", spec_.train_samples)));
      if (rank_ == 0) {
        test_ = std::make_shared<data::InMemorySource>(data::idx_as_in_memory(data::load_split(spec_.data_dir, "test", spec_.test_samples)));
      }
    }
    if (train_->size() < spec_.workers) {
      throw ConfigError("train_samples", std::to_string(train_->size()) + " training images cannot feed " +
                                             std::to_string(spec_.workers) + " workers");
    }
  }

  void set_normalization() {
    const auto c = static_cast<std::size_t>(spec_.channels);
    if (!spec_.mean.empty()) {
      transform_.mean.assign(spec_.mean.begin(), spec_.mean.end());
      transform_.std.assign(spec_.std.begin(), spec_.std.end());
      normalization_ = "job";
    } else if (shards_) {
      // The manifest's statistics, in the job's channel count.
      const auto& m = shards_->manifest();
      const auto mean = [](const std::vector<float>& v) {
        float t = 0;
        for (float x : v) t += x;
        return t / static_cast<float>(v.size());
      };
      transform_.mean = c == m.mean.size() ? m.mean : std::vector<float>(c, mean(m.mean));
      transform_.std = c == m.std.size() ? m.std : std::vector<float>(c, mean(m.std));
      normalization_ = "manifest";
    } else if (is_idx_dataset(spec_.dataset)) {
      transform_.mean.assign(c, static_cast<float>(idx_mean(spec_.dataset)));
      transform_.std.assign(c, static_cast<float>(idx_std(spec_.dataset)));
      normalization_ = "published";
    } else {
      const auto st = data::estimate_mean_std(train_, spec_.image_size, spec_.channels, kMeanStdSample,
                                              static_cast<std::uint64_t>(spec_.seed), threads_);
      transform_.mean = st.mean;
      transform_.std = st.std;
      normalization_ = "sample";
      sample_images_ = st.images;
    }
  }

  data::LoaderOptions options(int epoch) const {
    data::LoaderOptions o;
    o.batch_size = spec_.batch_size;
    o.threads = threads_;
    o.queue_batches = spec_.loader_queue;
    o.seed = data::mix64(static_cast<std::uint64_t>(spec_.seed) * 31 + static_cast<std::uint64_t>(rank_)) ^
             data::mix64(static_cast<std::uint64_t>(epoch));
    return o;
  }

  // Streams `order` of `source` with the test transform into `f(x, y)`.
  template <typename F>
  void run_loader(std::shared_ptr<const data::ExampleSource> source, std::vector<std::int64_t> order,
                  std::int64_t& skipped, F&& f) {
    data::LoaderOptions o;
    o.batch_size = spec_.eval_batch_size;
    o.threads = threads_;
    data::StreamingLoader loader(std::move(source), std::move(order), transform_, o);
    data::Batch b;
    while (loader.next(b)) {
      note_skips(b, skipped);
      if (b.size == 0) continue;
      f(images_tensor(b, spec_.channels, spec_.image_size), torch::tensor(b.labels, torch::kInt64));
    }
  }

  // Counted per epoch (and per evaluation): every training file is read exactly once an
  // epoch by one worker, so the workers' counts add up to the number of unreadable files.
  // Each distinct file is reported once.
  void note_skips(data::Batch& b, std::int64_t& count) {
    count += b.skipped;
    for (auto& m : b.skipped_messages) {
      if (seen_.insert(m).second && seen_.size() <= kSkipMessages) messages_.push_back(m);
    }
  }

  const JobSpec spec_;  // with apply_data_defaults applied
  int rank_;
  int threads_ = 1;
  std::int64_t classes_ = 10;
  std::vector<std::string> class_names_;  ///< ImageFolder's class folders, by label
  std::shared_ptr<data::ExampleSource> train_, test_;
  data::Transform transform_;
  std::string normalization_;
  std::int64_t sample_images_ = 0;
  std::unique_ptr<data::ShardReader> shards_;  ///< a sharded data set's reader, else null
  int epoch_ = 0;
  std::int64_t window_count_ = 0;
  std::unique_ptr<data::StreamingLoader> loader_;
  torch::Tensor recal_;
  double wait_seconds_ = 0;
  std::int64_t train_skipped_ = 0, test_skipped_ = 0;
  std::set<std::string> seen_;
  std::vector<std::string> messages_;
  std::optional<ElasticOrder> elastic_;  ///< an elastic job's chunks, else empty
  std::uint32_t window_chunks_ = 0;      ///< elastic: chunks a loader window holds
  std::deque<ps::Chunk> window_;         ///< elastic: the current window's chunks not yet batched
  double position_ = -1.0;
};

}  // namespace

std::unique_ptr<DataFeed> make_data_feed(const JobSpec& job, int rank, int threads, torch::Generator gen,
                                         const ClaimsFactory& claims) {
  JobSpec spec = job;
  if (spec.dataset == DatasetKind::kShards) {
    // Read through the agent's shard cache; image size and channels default to the manifest's.
    const char* socket = std::getenv(data::kShardCacheEnv);
    if (socket == nullptr || *socket == '\0') {
      throw ConfigError("data", std::string("a sharded data set is read through the agent's shard cache, and ") +
                                    data::kShardCacheEnv + " is not set (is cache_bytes 0 in the agent's configuration?)");
    }
    data::ShardReaderOptions o;
    o.data = spec.data;
    o.rank = rank;
    o.workers = spec.workers;
    o.seed = static_cast<std::uint64_t>(spec.seed);
    o.batch = spec.batch_size;
    auto reader = std::make_unique<data::ShardReader>(std::make_shared<data::ShardCacheClient>(socket), o);
    if (spec.image_size == 0) spec.image_size = std::clamp(reader->manifest().image_size, 8, 1024);
    if (spec.channels == 0) spec.channels = reader->manifest().channels;
    apply_data_defaults(spec);
    return std::make_unique<StreamFeed>(std::move(spec), rank, threads, std::move(reader));
  }
  apply_data_defaults(spec);  // a JobSpec built in code has image_size and channels 0
  const bool tensors = is_idx_dataset(spec.dataset) && spec.image_size == 28 && spec.channels == 1 &&
                       !spec.augment.any() && spec.mean.empty();
  if (tensors) return std::make_unique<TensorFeed>(std::move(spec), rank, std::move(gen), claims);
  return std::make_unique<StreamFeed>(std::move(spec), rank, threads, nullptr, claims);
}

}  // namespace dltrain::train
