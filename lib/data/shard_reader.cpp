#include "data/shard_reader.h"

#include <chrono>

#include "common/errors.h"
#include "data/image.h"
#include "data/sharding.h"

namespace dltrain::data {

Image EncodedSource::load(std::int64_t i, int channels) const {
  const auto& s = samples_[static_cast<std::size_t>(i)];
  return decode_image(s.image, channels, name(i));
}

std::string EncodedSource::name(std::int64_t i) const {
  return origin_ + " sample " + samples_[static_cast<std::size_t>(i)].key;
}

ShardReader::ShardReader(std::shared_ptr<ShardCacheClient> client, ShardReaderOptions options)
    : client_(std::move(client)), o_(std::move(options)) {
  const auto url = join_url(o_.data, kManifestName);
  manifest_ = parse_manifest(client_->manifest(url), url);
  if (manifest_.train.samples < o_.workers) {
    throw ConfigError("data", url + ": " + std::to_string(manifest_.train.samples) + " training samples cannot feed " +
                                  std::to_string(o_.workers) + " workers");
  }
}

ShardReader::~ShardReader() {
  if (pending_.valid()) pending_.wait();
}

std::int64_t ShardReader::epoch_samples() const { return shard_size(manifest_.train.samples, o_.rank, o_.workers); }

std::vector<ShardSample> ShardReader::read_slices(const ShardSplit& split, const std::vector<ShardSlice>& slices) {
  std::vector<ShardSample> out;
  for (const auto& sl : slices) {
    const auto& info = split.shards[static_cast<std::size_t>(sl.shard)];
    const std::string url = join_url(o_.data, info.name);
    std::vector<ShardSample> samples;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto t0 = std::chrono::steady_clock::now();
      bool hit = false;
      const auto path = client_->acquire({url, info.sha256, info.bytes}, &hit);
      stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      try {
        const auto bytes = read_file_bytes(path, kMaxShardBytes);
        samples = read_shard_samples(bytes, static_cast<int>(manifest_.classes.size()), url);
      } catch (...) {
        client_->release(info.sha256);
        throw;
      }
      client_->release(info.sha256);
      ++stats_.shards;
      stats_.hits += hit ? 1 : 0;
      stats_.bytes += info.bytes;
    }
    if (static_cast<std::int64_t>(samples.size()) != info.samples) {
      throw ProtocolError(url + ": " + std::to_string(samples.size()) + " samples, the manifest says " +
                          std::to_string(info.samples));
    }
    for (std::int64_t k = sl.begin; k < sl.end; ++k) out.push_back(std::move(samples[static_cast<std::size_t>(k)]));
  }
  return out;
}

std::vector<ShardSample> ShardReader::read_window(std::size_t w) {
  std::size_t first = 0;
  for (std::size_t i = 0; i < w; ++i) first += static_cast<std::size_t>(windows_[i]);
  const std::vector<ShardSlice> part(slices_.begin() + static_cast<std::ptrdiff_t>(first),
                                     slices_.begin() + static_cast<std::ptrdiff_t>(first + static_cast<std::size_t>(windows_[w])));
  return read_slices(manifest_.train, part);
}

void ShardReader::start_epoch(std::int64_t epoch) {
  if (pending_.valid()) pending_.wait();
  pending_ = {};
  carry_.clear();
  epoch_ = epoch;
  std::vector<std::int64_t> counts;
  for (const auto& s : manifest_.train.shards) counts.push_back(s.samples);
  slices_ = deal_shards(counts, o_.rank, o_.workers, o_.seed, epoch);
  windows_ = shard_windows(static_cast<std::int64_t>(slices_.size()), o_.window);
  next_ = 0;
  std::vector<ShardRequest> want;
  for (const auto& s : slices_) {
    const auto& info = manifest_.train.shards[static_cast<std::size_t>(s.shard)];
    want.push_back({join_url(o_.data, info.name), info.sha256, info.bytes});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    client_->prefetch(want);
  }
  if (!windows_.empty()) pending_ = std::async(std::launch::async, [this] { return read_window(0); });
}

bool ShardReader::next_window(std::shared_ptr<const ExampleSource>& source, std::vector<std::int64_t>& order) {
  if (next_ >= windows_.size()) return false;
  if (!pending_.valid()) throw IoError(o_.data + ": an earlier read of this epoch failed");
  auto fresh = pending_.get();  // rethrows a read's error
  const std::size_t w = next_++;
  const bool last = next_ >= windows_.size();
  if (!last) pending_ = std::async(std::launch::async, [this, n = next_] { return read_window(n); });
  std::vector<ShardSample> samples = std::move(carry_);
  carry_.clear();
  for (auto& s : fresh) samples.push_back(std::move(s));
  const std::uint64_t mixed = mix64(o_.seed ^ mix64(static_cast<std::uint64_t>(o_.rank) + 1)) ^ mix64(w + 7);
  const auto perm = epoch_permutation(static_cast<std::int64_t>(samples.size()), mixed, epoch_);
  // All but the epoch's last window hand out whole batches; the rest waits for the next.
  const auto b = std::max<std::int64_t>(1, o_.batch);
  const auto keep = last ? static_cast<std::int64_t>(perm.size()) : static_cast<std::int64_t>(perm.size()) / b * b;
  std::vector<ShardSample> out;
  out.reserve(static_cast<std::size_t>(keep));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(perm.size()); ++i) {
    auto& s = samples[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
    (i < keep ? out : carry_).push_back(std::move(s));
  }
  order.resize(out.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  source = std::make_shared<EncodedSource>(std::move(out), o_.data);
  return true;
}

std::shared_ptr<const ExampleSource> ShardReader::test_set() {
  if (!test_) {
    std::vector<ShardSlice> all;
    for (std::size_t i = 0; i < manifest_.test.shards.size(); ++i) {
      all.push_back({static_cast<std::int64_t>(i), 0, manifest_.test.shards[i].samples});
    }
    test_ = std::make_shared<EncodedSource>(read_slices(manifest_.test, all), o_.data);
  }
  return test_;
}

std::shared_ptr<const ExampleSource> ShardReader::sample(std::int64_t max) {
  std::vector<std::int64_t> counts;
  for (const auto& s : manifest_.train.shards) counts.push_back(s.samples);
  auto slices = deal_shards(counts, o_.rank, o_.workers, o_.seed, 0);
  std::vector<ShardSlice> first;
  std::int64_t n = 0;
  for (auto s : slices) {
    if (n >= max) break;
    s.end = std::min(s.end, s.begin + (max - n));
    n += s.end - s.begin;
    first.push_back(s);
  }
  return std::make_shared<EncodedSource>(read_slices(manifest_.train, first), o_.data);
}

ShardReadStats ShardReader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dltrain::data
