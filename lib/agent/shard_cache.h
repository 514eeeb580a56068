// The agent's shard cache (docs/data.md, "The cache"): the shards of sharded data sets
// (data/shards.h) fetched from where they live (data/fetch.h) into the agent's state
// directory, shared by every worker on the machine, kept across jobs and agent restarts,
// bounded by `cache_bytes` with the least recently used shard out first. Shards are named
// by their SHA-256 (<dir>/<sha256>.tar), so one shard read under two URLs is stored once,
// and checked on arrival: a mismatch is fetched again once, then fails naming the shard
// and URL. A shard a worker holds (acquire … release) is never evicted. Each shard is
// fetched once however many workers ask for it at once. Thread-safe: every member may be
// called from any thread; acquire() blocks its caller until the shard is there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/fetch.h"

namespace dltrain::agent {

/// A shard to read: where it lives, and what it must be.
struct ShardRef {
  std::string url;     ///< data/fetch.h URL of the shard file
  std::string sha256;  ///< 64 lowercase hex digits (the manifest's)
  std::int64_t bytes = 0;  ///< its size, bytes (the manifest's)
};

/// Counters of a ShardCache since it was built (plus what its directory held).
struct ShardCacheStats {
  std::int64_t capacity_bytes = 0;  ///< cache_bytes
  std::int64_t bytes = 0;           ///< bytes of the shards held
  std::int64_t shards = 0;          ///< shards held
  std::int64_t pinned = 0;          ///< shards a worker holds now
  std::int64_t hits = 0;            ///< acquires served from the cache
  std::int64_t misses = 0;          ///< acquires that waited for a fetch
  std::int64_t fetches = 0;         ///< shards fetched (prefetches included)
  std::int64_t bytes_fetched = 0;   ///< their bytes
  std::int64_t evictions = 0;       ///< shards evicted to make room
  std::int64_t failures = 0;        ///< fetches that failed for good
};

/// See the file comment.
class ShardCache {
 public:
  /// Who holds a shard: the cache server's connection number; a worker's connection closes
  /// when it exits, however it exits, and the server then drops its holds.
  using Owner = int;

  struct Options {
    std::string dir;                   ///< the cache's directory (created)
    std::int64_t capacity_bytes = 0;   ///< >= 0; a shard larger than this cannot be cached
    int fetch_threads = 2;             ///< prefetching threads, >= 1
    data::FetchOptions fetch;          ///< retries, time-outs, S3 settings, the retry log
  };

  /// Opens the directory: shards of an earlier run are kept (their last use is their
  /// file's modification time), unfinished downloads (*.part) removed, shards beyond
  /// the capacity evicted. Throws IoError when the directory cannot be created or read.
  explicit ShardCache(Options options);
  /// stop(), then joins the prefetching threads.
  ~ShardCache();
  /// Makes every waiting and later acquire() throw IoError("the agent is stopping") and
  /// aborts the transfers under way. Idempotent; thread-safe.
  void stop();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  /// The local path of `ref`, fetched first when absent (waiting for a fetch already under
  /// way, including a prefetch), and held for `owner` until release(). Throws
  /// data::FetchError (unreachable after the retries, a 404/403, a missing credential, a
  /// checksum that did not match twice: the message names the shard and the URL) or
  /// IoError (no room: every shard held, or the disk full); the cache stays consistent.
  /// `hit`, when given, is set to whether the shard was there already.
  std::string acquire(const ShardRef& ref, Owner owner, bool* hit = nullptr);
  /// Lets `owner` go of one hold of shard `sha256`. Unknown holds are ignored.
  void release(const std::string& sha256, Owner owner);
  /// Drops every hold of `owner` (a worker that exited).
  void release_owner(Owner owner);
  /// Queues `refs` for fetching in the background, in order (those cached or under way
  /// are skipped), as long as the queue holds at most half the capacity (the rest is
  /// fetched when asked for); a failure is logged and counted, and met again by acquire().
  void prefetch(const std::vector<ShardRef>& refs);
  /// The counters now.
  ShardCacheStats stats() const;
  /// SHA-256s of the shards held now.
  std::vector<std::string> held() const;
  /// The contents of `url` (a manifest), fetched with the cache's fetch options, at most
  /// `max_bytes`; not cached. Throws what data::fetch_text throws.
  std::string read_text(const std::string& url, std::int64_t max_bytes) const;
  /// Where shard `sha256` lives when cached.
  std::string path_of(const std::string& sha256) const;

 private:
  // kFailed: the fetch its waiters waited for failed with `error` (they get it too
  // rather than each trying again); a later acquire tries afresh.
  enum class State { kFetching, kReady, kFailed };
  struct Entry {
    State state = State::kFetching;
    std::string error;
    bool permanent = false;
    std::int64_t bytes = 0;
    std::int64_t last_use = 0;              // a logical clock (file mtimes after a restart)
    std::map<Owner, int> pins;
  };
  /// Makes `ref` present (fetching it, or waiting for a fetch under way); true when it was
  /// there at once.
  bool ensure(const ShardRef& ref, std::unique_lock<std::mutex>& lock, bool for_acquire);
  void make_room(std::int64_t bytes, std::unique_lock<std::mutex>& lock, const ShardRef& ref);
  void fetch_verified(const ShardRef& ref);
  void evict(const std::string& sha256);
  void run_prefetch();

  Options o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;
  std::int64_t used_ = 0;      // bytes of entries (ready and fetching)
  std::int64_t clock_ = 0;
  ShardCacheStats counters_;
  std::deque<ShardRef> queue_;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};  // o_.fetch.cancel
  std::vector<std::thread> threads_;
};

}  // namespace dltrain::agent
