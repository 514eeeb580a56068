#include "agent/model_fetch.h"

#include <algorithm>
#include <filesystem>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "wire/control_bodies.h"

namespace dltrain::agent {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ModelFetcher::ModelFetcher(boost::asio::io_context& io, std::string cache_dir, Send send, int keep_files,
                           std::chrono::milliseconds reply_timeout)
    : io_(io), dir_(std::move(cache_dir)), send_(std::move(send)), keep_(std::max(1, keep_files)),
      timeout_(reply_timeout), timer_(io) {}

std::optional<std::string> ModelFetcher::cached(const std::string& sha256) const {
  const auto path = (fs::path(dir_) / (sha256 + ".pt")).string();
  std::error_code ec;
  if (!wire::is_sha256_hex(sha256) || !fs::is_regular_file(path, ec)) return std::nullopt;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
  return path;
}

// The least recently fetched or used files beyond keep_ go.
void ModelFetcher::prune() {
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() == ".pt") files.emplace_back(e.last_write_time(ec), e.path());
  }
  if (files.size() <= static_cast<std::size_t>(keep_)) return;
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = static_cast<std::size_t>(keep_); i < files.size(); ++i) fs::remove(files[i].second, ec);
}

void ModelFetcher::fetch(const std::string& sha256, Done done) {
  if (!wire::is_sha256_hex(sha256)) return done("", "model_sha256 \"" + sha256 + "\" is not 64 hex digits");
  if (auto p = cached(sha256)) return done(*p, "");
  auto it = fetches_.find(sha256);
  if (it != fetches_.end()) {
    it->second.waiting.push_back(std::move(done));
    return;
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return done("", "cannot create " + dir_ + ": " + ec.message());
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
  if (!send_(wire::make_request(f.req_id, "model_download", b.to_json()))) {
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
      f.writer = std::make_unique<ChunkedFileWriter>((fs::path(dir_) / (sha256 + ".pt")).string(), chunk.size, sha256,
                                                     wire::ModelUploadBody::kMaxFileBytes);
    }
    const auto bytes = base64_decode(chunk.data);
    if (bytes.empty() && !f.writer->complete()) throw ProtocolError("the leader sent no bytes at offset " + std::to_string(chunk.offset));
    f.writer->append(chunk.offset, bytes);
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
  const std::string path = error.empty() ? (fs::path(dir_) / (sha256 + ".pt")).string() : "";
  if (error.empty()) {
    spdlog::info("model file {} fetched", sha256);
    prune();
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
