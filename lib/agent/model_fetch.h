// The model files that clients upload with their jobs (JobSpec::model_sha256), fetched by
// an agent from the leader before it starts a worker that trains one: no shared file
// system. One copy per content in <state_dir>/model-files/<sha256>.pt, fetched once
// however many workers need it, in windows of at most 1 MiB, each request answered within
// a bound, the whole checked against its SHA-256 before it is used.
// Thread-safety: none (the agent's io thread only).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/file_transfer.h"
#include "wire/control.h"

namespace dltrain::agent {

/// Fetches uploaded model files from the leader into a local cache.
class ModelFetcher {
 public:
  /// Sends one request (its text) to the leader; false when there is no link now.
  using Send = std::function<bool(std::string text)>;
  /// Called once per fetch(): the cached file's path, or "" and why it failed.
  using Done = std::function<void(const std::string& path, const std::string& error)>;

  /// `cache_dir` is created when the first file is fetched; it keeps the `keep_files`
  /// most recently fetched or used files besides the pinned ones (a worker's own link to
  /// its file outlives the cache's). `reply_timeout`: how long each window may take.
  ModelFetcher(boost::asio::io_context& io, std::string cache_dir, Send send, int keep_files,
               std::chrono::milliseconds reply_timeout = std::chrono::seconds(30));

  /// Gets `sha256` from the leader (unless it is cached: then `done` runs at once) and
  /// calls `done`. A fetch of the same content already running takes `done` too. A
  /// sha256 that is not 64 hex digits fails at once.
  void fetch(const std::string& sha256, Done done);

  /// Keeps `sha256`'s cached file from being pruned until as many unpin() calls (a task
  /// that waits for several files needs the first until the last has come).
  void pin(const std::string& sha256) { ++pins_[sha256]; }
  void unpin(const std::string& sha256);

  /// A reply from the leader: true when it answered one of this fetcher's requests.
  bool on_reply(const wire::Envelope& env);

  /// Fails every fetch in flight with `why` (the link to the leader was lost).
  void fail_all(const std::string& why);

 private:
  struct Fetch {
    std::string req_id;
    std::unique_ptr<ChunkedFileWriter> writer;
    std::vector<Done> waiting;
    std::chrono::steady_clock::time_point deadline;
  };
  void request(const std::string& sha256, Fetch& f, std::int64_t offset);
  void finish(const std::string& sha256, const std::string& error);
  void arm_timer();

  boost::asio::io_context& io_;
  ContentStore cache_;
  Send send_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, int> pins_;
  boost::asio::steady_timer timer_;
  std::map<std::string, Fetch> fetches_;  ///< by sha256
  std::uint64_t next_ = 1;
};

}  // namespace dltrain::agent
