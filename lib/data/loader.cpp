#include "data/loader.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "data/sharding.h"

namespace dltrain::data {

InMemoryImages idx_as_in_memory(const Split& s) {
  InMemoryImages m;
  m.count = s.images.count;
  m.height = static_cast<int>(s.images.rows);
  m.width = static_cast<int>(s.images.cols);
  m.channels = 1;
  m.pixels = s.images.pixels;
  m.labels.assign(s.labels.begin(), s.labels.end());
  return m;
}

Image InMemorySource::load(std::int64_t i, int channels) const {
  Image img;
  img.height = images_.height;
  img.width = images_.width;
  img.channels = images_.channels;
  const std::size_t n = static_cast<std::size_t>(img.height) * img.width * img.channels;
  const auto* p = images_.pixels.data() + static_cast<std::size_t>(i) * n;
  img.pixels.assign(p, p + n);
  return convert_channels(std::move(img), channels);
}

ImageFileSource::ImageFileSource(std::vector<ImageFile> files, std::int64_t cache_bytes)
    : files_(std::move(files)), cache_bytes_(std::max<std::int64_t>(0, cache_bytes)),
      slots_(cache_bytes_ > 0 ? files_.size() : 0) {}

ImageFileSource::~ImageFileSource() {
  for (auto& s : slots_) delete s.load(std::memory_order_acquire);
}

Image ImageFileSource::load(std::int64_t i, int channels) const {
  const auto k = static_cast<std::size_t>(i);
  if (!slots_.empty()) {
    if (const Image* kept = slots_[k].load(std::memory_order_acquire); kept && kept->channels == channels) {
      return *kept;
    }
  }
  const auto& path = files_[k].path;
  const auto bytes = read_file_bytes(path, std::int64_t{256} << 20);
  Image img = decode_image(bytes, channels, path);
  if (!slots_.empty() && !slots_[k].load(std::memory_order_relaxed)) {
    // Reserve the bytes first, so that concurrent loads never overspend the budget.
    const auto n = static_cast<std::int64_t>(img.pixels.size());
    if (cache_used_.fetch_add(n, std::memory_order_relaxed) + n <= cache_bytes_) {
      auto* kept = new Image(img);
      const Image* expected = nullptr;
      if (slots_[k].compare_exchange_strong(expected, kept, std::memory_order_release, std::memory_order_relaxed)) {
        cached_.fetch_add(1, std::memory_order_relaxed);
      } else {
        delete kept;  // another thread kept this image first
        cache_used_.fetch_sub(n, std::memory_order_relaxed);
      }
    } else {
      cache_used_.fetch_sub(n, std::memory_order_relaxed);
    }
  }
  return img;
}

StreamingLoader::StreamingLoader(std::shared_ptr<const ExampleSource> source, std::vector<std::int64_t> order,
                                 Transform transform, LoaderOptions options)
    : source_(std::move(source)), order_(std::move(order)), transform_(std::move(transform)), options_(options) {
  if (options_.batch_size < 1 || options_.threads < 1) {
    throw InvalidArgument("StreamingLoader: batch_size and threads must be >= 1, got " +
                          std::to_string(options_.batch_size) + " and " + std::to_string(options_.threads));
  }
  const auto c = static_cast<std::size_t>(transform_.channels);
  if ((c != 1 && c != 3) || transform_.mean.size() != c || transform_.std.size() != c || transform_.image_size < 1) {
    throw InvalidArgument("StreamingLoader: channels must be 1 or 3 with one mean and std each, and image_size >= 1");
  }
  for (const auto i : order_) {
    if (i < 0 || i >= source_->size()) {
      throw InvalidArgument("StreamingLoader: index " + std::to_string(i) + " outside the source's " +
                            std::to_string(source_->size()) + " examples");
    }
  }
  batches_ = (static_cast<std::int64_t>(order_.size()) + options_.batch_size - 1) / options_.batch_size;
  bound_ = options_.queue_batches > 0 ? options_.queue_batches : std::max(2, 2 * options_.threads);
  threads_.reserve(static_cast<std::size_t>(options_.threads));
  for (int t = 0; t < options_.threads; ++t) threads_.emplace_back([this] { run_thread(); });
}

StreamingLoader::~StreamingLoader() {
  stop();
  for (auto& t : threads_) t.join();
}

void StreamingLoader::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  ready_cv_.notify_all();
  space_cv_.notify_all();
}

std::int64_t StreamingLoader::max_in_flight() const {
  std::lock_guard lk(mu_);
  return max_in_flight_;
}

bool StreamingLoader::next(Batch& out) {
  std::unique_lock lk(mu_);
  if (next_out_ >= batches_) return false;
  ready_cv_.wait(lk, [&] { return stop_ || error_ || ready_.count(next_out_) != 0; });
  if (error_) std::rethrow_exception(error_);
  if (stop_) return false;
  auto it = ready_.find(next_out_);
  out = std::move(it->second);
  ready_.erase(it);
  ++next_out_;
  lk.unlock();
  space_cv_.notify_all();
  return true;
}

void StreamingLoader::run_thread() {
  for (;;) {
    std::int64_t b = 0;
    {
      std::unique_lock lk(mu_);
      // A batch may be started only while fewer than bound_ are ready or being built.
      space_cv_.wait(lk, [&] { return stop_ || next_claim_ >= batches_ || next_claim_ < next_out_ + bound_; });
      if (stop_ || next_claim_ >= batches_) return;
      b = next_claim_++;
      max_in_flight_ = std::max(max_in_flight_, next_claim_ - next_out_);
    }
    try {
      Batch batch = build(b);
      {
        std::lock_guard lk(mu_);
        ready_.emplace(b, std::move(batch));
      }
      ready_cv_.notify_all();
    } catch (const StopRequestedInBuild&) {
      return;
    } catch (...) {
      {
        std::lock_guard lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      ready_cv_.notify_all();
      return;
    }
  }
}

Batch StreamingLoader::build(std::int64_t b) const {
  const int c = transform_.channels, s = transform_.image_size;
  const std::size_t per = static_cast<std::size_t>(c) * s * s;
  const auto lo = static_cast<std::size_t>(b) * options_.batch_size;
  const auto hi = std::min(order_.size(), lo + static_cast<std::size_t>(options_.batch_size));
  Batch out;
  out.index = b;
  out.images.resize((hi - lo) * per);
  out.labels.reserve(hi - lo);
  std::vector<float> scale(c), shift(c);
  for (int ch = 0; ch < c; ++ch) {
    scale[ch] = 1.0f / (255.0f * transform_.std[ch]);
    shift[ch] = -transform_.mean[ch] / transform_.std[ch];
  }
  for (std::size_t k = lo; k < hi; ++k) {
    {
      std::lock_guard lk(mu_);
      if (stop_) throw StopRequestedInBuild();
    }
    const std::int64_t e = order_[k];
    Image img;
    try {
      Image decoded = source_->load(e, c);
      if (transform_.train && transform_.augment.any()) {
        std::mt19937_64 rng(mix64(options_.seed ^ mix64(static_cast<std::uint64_t>(e))));
        img = train_transform(decoded, s, transform_.augment, rng);
      } else {
        img = test_transform(decoded, s);
      }
    } catch (const CorruptImage& err) {
      ++out.skipped;
      out.skipped_messages.emplace_back(err.what());
      continue;
    } catch (const IoError& err) {
      ++out.skipped;
      out.skipped_messages.emplace_back(err.what());
      continue;
    }
    float* dst = out.images.data() + static_cast<std::size_t>(out.size) * per;
    const std::size_t plane = static_cast<std::size_t>(s) * s;
    for (std::size_t p = 0; p < plane; ++p) {
      for (int ch = 0; ch < c; ++ch) dst[ch * plane + p] = img.pixels[p * c + ch] * scale[ch] + shift[ch];
    }
    out.labels.push_back(source_->label(e));
    ++out.size;
  }
  out.images.resize(static_cast<std::size_t>(out.size) * per);
  return out;
}

ChannelStats estimate_mean_std(std::shared_ptr<const ExampleSource> source, int image_size, int channels,
                               std::int64_t samples, std::uint64_t seed, int threads) {
  auto order = epoch_permutation(source->size(), seed, -1);
  if (static_cast<std::int64_t>(order.size()) > samples) order.resize(static_cast<std::size_t>(samples));
  Transform t;
  t.image_size = image_size;
  t.channels = channels;
  t.mean.assign(static_cast<std::size_t>(channels), 0.0f);
  t.std.assign(static_cast<std::size_t>(channels), 1.0f);
  LoaderOptions o;
  o.batch_size = 64;
  o.threads = std::max(1, threads);
  StreamingLoader loader(std::move(source), std::move(order), t, o);
  std::vector<double> sum(static_cast<std::size_t>(channels), 0.0), sq(sum);
  std::int64_t images = 0;
  const std::size_t plane = static_cast<std::size_t>(image_size) * image_size;
  Batch b;
  while (loader.next(b)) {
    for (int i = 0; i < b.size; ++i) {
      for (int ch = 0; ch < channels; ++ch) {
        const float* p = b.images.data() + (static_cast<std::size_t>(i) * channels + ch) * plane;
        for (std::size_t k = 0; k < plane; ++k) {
          sum[ch] += p[k];
          sq[ch] += static_cast<double>(p[k]) * p[k];
        }
      }
    }
    images += b.size;
  }
  if (images == 0) throw InvalidArgument("estimate_mean_std: none of the sampled images could be read");
  ChannelStats st;
  st.images = images;
  const double n = static_cast<double>(images) * static_cast<double>(plane);
  for (int ch = 0; ch < channels; ++ch) {
    const double m = sum[ch] / n;
    st.mean.push_back(static_cast<float>(m));
    st.std.push_back(static_cast<float>(std::sqrt(std::max(1e-12, sq[ch] / n - m * m))));
  }
  return st;
}

}  // namespace dltrain::data
