#include "agent/model_fetch.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "job/job_spec.h"
#include "wire/control_bodies.h"

namespace dltrain::agent {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ModelFetcher::ModelFetcher(boost::asio::io_context& io, std::string cache_dir, Send send, int keep_files,
                           std::chrono::milliseconds reply_timeout)
    : io_(io), cache_(std::move(cache_dir), keep_files), send_(std::move(send)), timeout_(reply_timeout), timer_(io) {}

void ModelFetcher::unpin(const std::string& sha256) {
  const auto it = pins_.find(sha256);
  if (it != pins_.end() && --it->second <= 0) pins_.erase(it);
}

void ModelFetcher::fetch(const std::string& sha256, Done done) {
  if (!is_sha256_hex(sha256)) return done("", "\"" + sha256 + "\" is not 64 hex digits");
  if (auto p = cache_.find(sha256)) return done(*p, "");
  auto it = fetches_.find(sha256);
  if (it != fetches_.end()) {
    it->second.waiting.push_back(std::move(done));
    return;
  }
  if (fetches_.empty()) {
    try {
      cache_.open();
    } catch (const std::exception& e) {
      return done("", e.what());
    }
  }
  auto& f = fetches_[sha256];
  f.waiting.push_back(std::move(done));
  spdlog::info("fetching the model file {} from the leader", sha256);
  request(sha256, f, 0);
  arm_timer();
}

void ModelFetcher::request(const std::string& sha256, Fetch& f, std::int64_t offset) {
  wire::ModelDownloadBody b;
  b.sha256 = sha256;
  b.offset = offset;
  f.req_id = "fetch-" + std::to_string(next_++);
  f.deadline = Clock::now() + timeout_;
  if (!send_(wire::make_request(f.req_id, wire::ControlType::kModelDownload, b.to_json()))) {
    // Asynchronously: the caller may be iterating over fetches_.
    boost::asio::post(io_, [this, sha256] { finish(sha256, "the leader is not connected"); });
  }
}

bool ModelFetcher::on_reply(const wire::Envelope& env) {
  auto it = fetches_.begin();
  while (it != fetches_.end() && it->second.req_id != env.id) ++it;
  if (it == fetches_.end()) return false;
  const std::string sha256 = it->first;
  Fetch& f = it->second;
  if (!env.ok) {
    finish(sha256, "the leader: " + env.error.value("message", std::string("?")));
    return true;
  }
  try {
    const auto chunk = wire::parse_body<wire::ModelFileChunkBody>(env);
    if (!f.writer) {
      if (chunk.sha256 != sha256) throw ProtocolError("the leader sent " + chunk.sha256 + " for " + sha256);
      f.writer = std::make_unique<ChunkedFileWriter>(cache_.path(sha256), chunk.size, sha256,
                                                     static_cast<std::int64_t>(kMaxModelFileBytes));
    }
    f.writer->append(chunk.offset, base64_decode(chunk.data));
    if (!f.writer->complete()) {
      request(sha256, f, f.writer->offset());
      return true;
    }
    f.writer->finish();
    finish(sha256, "");
  } catch (const std::exception& e) {
    finish(sha256, e.what());
  }
  return true;
}

void ModelFetcher::finish(const std::string& sha256, const std::string& error) {
  const auto it = fetches_.find(sha256);
  if (it == fetches_.end()) return;
  auto waiting = std::move(it->second.waiting);
  fetches_.erase(it);  // an unfinished writer removes its part file
  const std::string path = error.empty() ? cache_.path(sha256) : "";
  if (error.empty()) {
    spdlog::info("model file {} fetched", sha256);
    cache_.touch(sha256);
    std::set<std::string> pinned;
    for (const auto& [sha, n] : pins_) pinned.insert(sha);
    pinned.insert(sha256);
    cache_.prune(pinned);
  } else {
    spdlog::error("cannot fetch the model file {}: {}", sha256, error);
  }
  for (auto& done : waiting) done(path, error);
}

void ModelFetcher::fail_all(const std::string& why) {
  std::vector<std::string> all;
  for (const auto& [sha, f] : fetches_) all.push_back(sha);
  for (const auto& sha : all) finish(sha, why);
}

// One timer for every fetch in flight: a reply that does not come within the bound
// fails its fetch (and the tasks waiting for it), instead of leaving them waiting.
void ModelFetcher::arm_timer() {
  timer_.expires_after(std::chrono::seconds(1));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    const auto now = Clock::now();
    std::vector<std::string> late;
    for (const auto& [sha, f] : fetches_) {
      if (f.deadline <= now) late.push_back(sha);
    }
    for (const auto& sha : late) {
      finish(sha, "the leader did not answer within " + std::to_string(timeout_.count() / 1000) + " s");
    }
    if (!fetches_.empty()) arm_timer();
  });
}

}  // namespace dltrain::agent
