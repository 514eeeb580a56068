// The agent's shard cache as its workers reach it (docs/data.md, "The cache";
// docs/protocol.md, "Shard cache socket"): HTTP/1.1 with JSON bodies on a Unix socket in
// the agent's state directory (mode 0600: only the agent's user, whose tasks these are).
//   POST /v1/manifest {"url"}                   → 200, the manifest's text
//   POST /v1/acquire  {"url", "sha256", "bytes"} → 200 {"path", "hit"}; blocks until cached
//   POST /v1/release  {"sha256"}                → 204
//   POST /v1/prefetch {"shards": [{"url", "sha256", "bytes"}, …]} → 202
//   GET  /v1/stats                              → 200, ShardCacheStats as JSON
// A failure is 4xx/5xx with {"error": message}: 400 for a malformed request, 502 when the
// source failed (the message names the URL and the cause), 507 when the cache has no room.
// A connection's holds are dropped when it closes, so a worker that dies holds nothing.
// Each connection is served by its own thread (a machine runs a handful of workers).
#pragma once

#include <memory>
#include <string>

#include "agent/shard_cache.h"

namespace dltrain::agent {

/// See the file comment. Thread-safety: constructed and destroyed by one thread; serves
/// from its own threads.
class ShardCacheServer {
 public:
  /// Listens on `socket_path` (an old socket file there is replaced; the path must be
  /// under 108 bytes). Throws IoError when it cannot listen.
  ShardCacheServer(const std::string& socket_path, ShardCache& cache);
  /// Closes the socket and every connection, joins the threads, removes the socket file.
  ~ShardCacheServer();
  ShardCacheServer(const ShardCacheServer&) = delete;
  ShardCacheServer& operator=(const ShardCacheServer&) = delete;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::agent
