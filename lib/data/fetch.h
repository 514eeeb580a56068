// Reading a sharded data set from where it lives (docs/data.md, "Sources"): a local or
// shared path (or file://), any web server over http(s):// (whole-object GETs, resumed
// with a Range request after a broken transfer), or an S3-compatible object store as
// s3://bucket/prefix (path-style requests signed with AWS Signature Version 4 by
// libcurl's CURLOPT_AWS_SIGV4). Used by the agent's shard cache and the leader's manifest
// check; never by a worker (which asks its agent). Thread-safety: the free functions are
// thread-safe (one curl easy handle per call; curl_global_init runs once).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "common/errors.h"
#include "data/shards.h"  // join_url, is_local_url, check_data_url

namespace dltrain::data {

/// A fetch that failed for good: the URL, and the cause (HTTP status, curl's message, a
/// missing credential). `permanent()` is true for causes a retry cannot cure (404, 403,
/// a missing credential, a malformed URL).
class FetchError : public IoError {
 public:
  FetchError(const std::string& what, bool permanent) : IoError(what), permanent_(permanent) {}
  bool permanent() const { return permanent_; }

 private:
  bool permanent_;
};

/// Where s3:// URLs go and who signs them.
struct S3Settings {
  /// Base URL of the store (e.g. "http://127.0.0.1:7480"); empty = AWS_ENDPOINT_URL from
  /// the environment, else "https://s3.<region>.amazonaws.com".
  std::string endpoint;
  /// Signing region; empty = AWS_REGION or AWS_DEFAULT_REGION, else "us-east-1".
  std::string region;
  /// An AWS shared-credentials file ([default] aws_access_key_id = …,
  /// aws_secret_access_key = …); empty = the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
  /// environment variables. Never a job file's business.
  std::string credentials_file;
  /// The section of credentials_file to read; empty = AWS_PROFILE, else "default".
  std::string profile;
};

/// How fetches retry and time out.
struct FetchOptions {
  int attempts = 5;                 ///< tries per fetch, >= 1 (permanent failures are not retried)
  double first_backoff_s = 0.5;     ///< wait before the second try; doubled after each, up to max_backoff_s
  double max_backoff_s = 8.0;
  double connect_timeout_s = 10.0;  ///< per try
  double stall_timeout_s = 30.0;    ///< a try that moves under 1 KiB/s for this long fails
  S3Settings s3;
  /// Called with one line per retry ("GET URL failed (cause); retry 2 of 5 in 1.0 s").
  std::function<void(const std::string&)> log;
  /// When set and true, a transfer under way is aborted and no retry is made (the agent
  /// is stopping); the fetch then throws FetchError("… cancelled").
  const std::atomic<bool>* cancel = nullptr;
};

/// Fetches `url` into the file `path` (created or replaced), at most `max_bytes` bytes.
/// Transient failures (connection refused or reset, timeouts, HTTP 5xx and 429) are retried
/// with exponential back-off up to options.attempts tries, each retry logged; a broken
/// transfer resumes with a Range request when the server honours it. Returns the bytes
/// written. Throws FetchError naming the URL and the cause (the HTTP status and what it
/// means, curl's error, the setting a missing credential lives in), IoError when `path`
/// cannot be written (the message says whether the disk is full).
std::int64_t fetch_to_file(const std::string& url, const std::string& path, std::int64_t max_bytes,
                           const FetchOptions& options);

/// The contents of `url` as text, at most `max_bytes` bytes (retried as fetch_to_file).
std::string fetch_text(const std::string& url, std::int64_t max_bytes, const FetchOptions& options);

}  // namespace dltrain::data
