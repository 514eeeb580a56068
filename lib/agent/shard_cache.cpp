#include "agent/shard_cache.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "common/file_transfer.h"
#include <spdlog/spdlog.h>

namespace dltrain::agent {
namespace fs = std::filesystem;
namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string mib(std::int64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; }

}  // namespace

ShardCache::ShardCache(Options options) : o_(std::move(options)) {
  o_.fetch.cancel = &cancel_;
  std::error_code ec;
  fs::create_directories(o_.dir, ec);
  if (ec) throw IoError("cannot create the shard cache \"" + o_.dir + "\": " + ec.message());
  fs::directory_iterator it(o_.dir, ec), end;
  if (ec) throw IoError("cannot read the shard cache \"" + o_.dir + "\": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw IoError("cannot read the shard cache \"" + o_.dir + "\": " + ec.message());
    const auto p = it->path();
    std::error_code one;  // a file that cannot be looked at is left alone, not fatal
    if (p.extension() == ".part") {
      fs::remove(p, one);
      continue;
    }
    if (p.extension() != ".tar" || !is_sha256_hex(p.stem().string()) || !fs::is_regular_file(p, one)) continue;
    Entry en;
    en.state = State::kReady;
    en.bytes = static_cast<std::int64_t>(fs::file_size(p, one));
    if (one) continue;
    const auto mt = fs::last_write_time(p, one);
    if (one) continue;
    en.last_use = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::file_clock::to_sys(mt).time_since_epoch())
                      .count();
    used_ += en.bytes;
    entries_.emplace(p.stem().string(), en);
  }
  while (used_ > o_.capacity_bytes) {  // a smaller cache_bytes than last time
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    if (lru == entries_.end()) break;
    evict(lru->first);
  }
  counters_.evictions = 0;
  for (int i = 0; i < std::max(1, o_.fetch_threads); ++i) threads_.emplace_back([this] { run_prefetch(); });
}

void ShardCache::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cancel_ = true;
  cv_.notify_all();
}

ShardCache::~ShardCache() {
  stop();
  for (auto& t : threads_) t.join();
}

std::string ShardCache::path_of(const std::string& sha256) const { return (fs::path(o_.dir) / (sha256 + ".tar")).string(); }

void ShardCache::evict(const std::string& sha256) {
  const auto it = entries_.find(sha256);
  if (it == entries_.end()) return;
  std::error_code ec;
  fs::remove(path_of(sha256), ec);
  used_ -= it->second.bytes;
  entries_.erase(it);
  ++counters_.evictions;
}

void ShardCache::make_room(std::int64_t bytes, std::unique_lock<std::mutex>&, const ShardRef& ref) {
  if (bytes > o_.capacity_bytes) {
    throw IoError("shard " + ref.url + " (" + mib(bytes) + ") is larger than the whole shard cache (cache_bytes = " +
                  mib(o_.capacity_bytes) + "); raise cache_bytes in the agent's configuration");
  }
  while (used_ + bytes > o_.capacity_bytes) {
    auto lru = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      auto& e = it->second;
      if (e.state != State::kReady) continue;
      if (!e.pins.empty()) continue;
      if (lru == entries_.end() || e.last_use < lru->second.last_use) lru = it;
    }
    if (lru == entries_.end()) {
      throw IoError("the shard cache is full: " + mib(used_) + " of " + mib(o_.capacity_bytes) +
                    " held by running workers or being fetched, no room for " + ref.url + " (" + mib(bytes) +
                    "); raise cache_bytes in the agent's configuration");
    }
    spdlog::info("shard cache: evicting {} ({}), least recently used", lru->first.substr(0, 12), mib(lru->second.bytes));
    evict(lru->first);
  }
}

void ShardCache::fetch_verified(const ShardRef& ref) {
  const std::string part = (fs::path(o_.dir) / (ref.sha256 + ".part")).string();
  for (int attempt = 1;; ++attempt) {
    const auto n = data::fetch_to_file(ref.url, part, ref.bytes, o_.fetch);
    const std::string got = n == ref.bytes ? sha256_file_hex(part) : std::string();
    if (got == ref.sha256) break;
    const std::string why = n != ref.bytes ? std::to_string(n) + " bytes, the manifest says " + std::to_string(ref.bytes)
                                           : "SHA-256 " + got + ", the manifest says " + ref.sha256;
    std::error_code ec;
    fs::remove(part, ec);
    if (attempt == 2) throw data::FetchError("shard " + ref.url + " does not match its manifest twice (" + why + ")", true);
    spdlog::warn("shard cache: {} does not match its manifest ({}); fetching it again", ref.url, why);
  }
  std::error_code ec;
  fs::rename(part, path_of(ref.sha256), ec);
  if (ec) throw IoError("cannot rename \"" + part + "\": " + ec.message());
}

bool ShardCache::ensure(const ShardRef& ref, std::unique_lock<std::mutex>& lock, bool for_acquire) {
  bool waited = false;
  for (;;) {
    if (stop_) throw IoError("the agent is stopping");
    auto it = entries_.find(ref.sha256);
    if (it != entries_.end() && it->second.state == State::kReady && it->second.bytes != ref.bytes) {
      // Not the size the manifest says (a file cut short before a crash, say): fetched again.
      spdlog::warn("shard cache: {} holds {} bytes, the manifest says {}; fetching it again", ref.sha256.substr(0, 12),
                   it->second.bytes, ref.bytes);
      if (!it->second.pins.empty()) throw IoError("shard " + ref.url + " in the cache does not have its manifest's size");
      evict(ref.sha256);
      --counters_.evictions;
      continue;
    }
    if (it != entries_.end() && it->second.state == State::kReady) {
      if (for_acquire) ++(waited ? counters_.misses : counters_.hits);
      return !waited;
    }
    if (it != entries_.end() && it->second.state == State::kFailed) {
      // The fetch this caller waited for failed: the same error, not another round of
      // retries. A caller that comes later tries afresh.
      if (waited) {
        if (for_acquire) ++counters_.misses;
        throw data::FetchError(it->second.error, it->second.permanent);
      }
      entries_.erase(it);
      continue;
    }
    if (it != entries_.end()) {  // a fetch under way: wait for it (or its failure)
      waited = true;
      cv_.wait(lock);
      continue;
    }
    make_room(ref.bytes, lock, ref);
    Entry fetching;
    fetching.bytes = ref.bytes;
    fetching.last_use = now_ns();
    entries_[ref.sha256] = std::move(fetching);
    used_ += ref.bytes;
    lock.unlock();
    try {
      fetch_verified(ref);
    } catch (const std::exception& e) {
      lock.lock();
      auto& failed = entries_[ref.sha256];
      failed.state = State::kFailed;
      failed.error = e.what();
      const auto* fe = dynamic_cast<const data::FetchError*>(&e);
      failed.permanent = fe == nullptr || fe->permanent();
      failed.bytes = 0;
      used_ -= ref.bytes;
      ++counters_.failures;
      if (for_acquire) ++counters_.misses;
      cv_.notify_all();
      throw;
    }
    lock.lock();
    auto& e = entries_[ref.sha256];
    e.state = State::kReady;
    e.last_use = now_ns();
    ++counters_.fetches;
    counters_.bytes_fetched += ref.bytes;
    if (for_acquire) ++counters_.misses;
    cv_.notify_all();
    return false;
  }
}

std::string ShardCache::acquire(const ShardRef& ref, Owner owner, bool* hit) {
  if (!is_sha256_hex(ref.sha256)) throw InvalidArgument("shard cache: \"" + ref.sha256 + "\" is not a SHA-256");
  std::unique_lock<std::mutex> lock(mu_);
  const bool there = ensure(ref, lock, true);
  if (hit) *hit = there;
  auto& e = entries_.at(ref.sha256);
  ++e.pins[owner];
  e.last_use = now_ns();
  const auto path = path_of(ref.sha256);
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // the LRU order survives a restart
  return path;
}

void ShardCache::release(const std::string& sha256, Owner owner) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(sha256);
  if (it == entries_.end()) return;
  auto p = it->second.pins.find(owner);
  if (p == it->second.pins.end()) return;
  if (--p->second <= 0) it->second.pins.erase(p);
}

void ShardCache::release_owner(Owner owner) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [sha, e] : entries_) e.pins.erase(owner);
}

void ShardCache::prefetch(const std::vector<ShardRef>& refs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // At most half the capacity ahead, so that prefetching never evicts shards it fetched
    // itself before they were read; the rest is fetched when asked for.
    std::int64_t ahead = 0;
    for (const auto& q : queue_) ahead += q.bytes;
    for (const auto& r : refs) {
      const auto it = entries_.find(r.sha256);
      if (!is_sha256_hex(r.sha256) || (it != entries_.end() && it->second.state != State::kFailed)) continue;
      if (ahead + r.bytes > o_.capacity_bytes / 2) break;
      ahead += r.bytes;
      if (std::any_of(queue_.begin(), queue_.end(), [&](const ShardRef& q) { return q.sha256 == r.sha256; })) continue;
      queue_.push_back(r);
    }
  }
  cv_.notify_all();
}

void ShardCache::run_prefetch() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const ShardRef ref = queue_.front();
    queue_.pop_front();
    try {
      ensure(ref, lock, false);
    } catch (const std::exception& e) {
      if (!lock.owns_lock()) lock.lock();
      if (!stop_) spdlog::warn("shard cache: prefetching {} failed: {}", ref.url, e.what());
    }
    if (!lock.owns_lock()) lock.lock();
  }
}

ShardCacheStats ShardCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ShardCacheStats s = counters_;
  s.capacity_bytes = o_.capacity_bytes;
  s.bytes = 0;
  s.shards = 0;
  s.pinned = 0;
  for (const auto& [sha, e] : entries_) {
    if (e.state != State::kReady) continue;
    s.bytes += e.bytes;
    ++s.shards;
    if (!e.pins.empty()) ++s.pinned;
  }
  return s;
}

std::vector<std::string> ShardCache::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [sha, e] : entries_) {
    if (e.state == State::kReady) out.push_back(sha);
  }
  return out;
}

}  // namespace dltrain::agent

namespace dltrain::agent {
std::string ShardCache::read_text(const std::string& url, std::int64_t max_bytes) const {
  return data::fetch_text(url, max_bytes, o_.fetch);
}
}  // namespace dltrain::agent
