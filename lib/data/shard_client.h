// A worker's side of its agent's shard cache (agent/shard_cache_server.h): one kept-alive
// HTTP connection to the Unix socket the agent names in DLTRAIN_SHARD_CACHE. Plain C++
// (Boost.Beast, header-only), no LibTorch. Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shards.h"

namespace dltrain::data {

/// The environment variable in which an agent gives its tasks the cache's socket path.
inline constexpr const char* kShardCacheEnv = "DLTRAIN_SHARD_CACHE";

/// A shard as the worker asks for it.
struct ShardRequest {
  std::string url;
  std::string sha256;
  std::int64_t bytes = 0;
};

/// See the file comment.
class ShardCacheClient {
 public:
  /// Connects to `socket_path`. Throws IoError naming it when nothing listens there.
  explicit ShardCacheClient(const std::string& socket_path);
  ~ShardCacheClient();
  ShardCacheClient(const ShardCacheClient&) = delete;
  ShardCacheClient& operator=(const ShardCacheClient&) = delete;

  /// The manifest text at `url`, read by the agent. Throws IoError with the agent's message.
  std::string manifest(const std::string& url);
  /// The local path of the shard, once the agent has it (waits); held until release().
  /// Sets `hit` to whether it was cached already. Throws IoError with the agent's message
  /// (the URL and the cause) when it cannot be had.
  std::string acquire(const ShardRequest& shard, bool* hit = nullptr);
  /// Lets go of a shard acquire() returned.
  void release(const std::string& sha256);
  /// Asks the agent to fetch these next, in order, in the background.
  void prefetch(const std::vector<ShardRequest>& shards);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::data
