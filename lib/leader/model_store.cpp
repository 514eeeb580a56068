#include "leader/model_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "job/job_spec.h"

namespace dltrain::leader {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kStaging = ".staging";

template <typename T>
T field(const json& j, const char* key) {
  if (!j.contains(key)) throw ProtocolError(std::string("model manifest: \"") + key + "\" is missing");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw ProtocolError(std::string("model manifest: \"") + key + "\": " + e.what());
  }
}

}  // namespace

json ModelManifest::to_json() const {
  json files_json = json::array();
  for (const auto& f : files) files_json.push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  json j{{"job", job},         {"checkpoint", checkpoint}, {"model", model},   {"dataset", dataset},
         {"epochs", epochs},   {"created_unix", created_unix}, {"agent", agent}, {"files", files_json},
         {"bytes", bytes()}};
  if (test_accuracy) j["test_accuracy"] = *test_accuracy;
  return j;
}

ModelManifest ModelManifest::from_json(const json& j) {
  if (!j.is_object()) throw ProtocolError("model manifest: expected an object");
  ModelManifest m;
  m.job = field<std::string>(j, "job");
  m.checkpoint = field<std::string>(j, "checkpoint");
  m.model = field<std::string>(j, "model");
  m.dataset = field<std::string>(j, "dataset");
  m.epochs = field<int>(j, "epochs");
  m.created_unix = field<double>(j, "created_unix");
  m.agent = j.value("agent", std::string());
  if (j.contains("test_accuracy") && j["test_accuracy"].is_number()) m.test_accuracy = j["test_accuracy"].get<double>();
  for (const auto& f : field<json>(j, "files")) {
    m.files.push_back({field<std::string>(f, "name"), field<std::int64_t>(f, "bytes"), field<std::string>(f, "sha256")});
  }
  return m;
}

std::int64_t ModelManifest::bytes() const {
  std::int64_t n = 0;
  for (const auto& f : files) n += f.bytes;
  return n;
}

std::string ModelManifest::key() const {
  std::string joined;
  for (const auto& f : files) joined += f.name + ":" + f.sha256 + ";";
  return job + "/" + checkpoint + "/" +
         sha256_hex({reinterpret_cast<const std::uint8_t*>(joined.data()), joined.size()});
}

ModelStore::ModelStore(std::string root, int retention) : root_(std::move(root)), retention_(std::max(1, retention)) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw IoError("cannot create the model store " + root_ + ": " + ec.message());
  fs::remove_all(fs::path(root_) / kStaging, ec);  // interrupted collections
  for (const auto& job_dir : fs::directory_iterator(root_, ec)) {
    if (!job_dir.is_directory() || job_dir.path().filename() == kStaging) continue;
    for (const auto& cp : fs::directory_iterator(job_dir.path(), ec)) {
      try {
        std::ifstream in(cp.path() / kManifest);
        if (!in) throw ProtocolError("no " + std::string(kManifest));
        models_.push_back(ModelManifest::from_json(json::parse(in)));
      } catch (const std::exception& e) {
        spdlog::warn("model store: removing {}: {}", cp.path().string(), e.what());
        fs::remove_all(cp.path(), ec);
      }
    }
    if (fs::is_empty(job_dir.path(), ec)) fs::remove(job_dir.path(), ec);
  }
  std::sort(models_.begin(), models_.end(),
            [](const ModelManifest& a, const ModelManifest& b) { return a.created_unix > b.created_unix; });
}

std::string ModelStore::staging_dir(const std::string& job, const std::string& checkpoint) const {
  const fs::path dir = fs::path(root_) / kStaging / (job + "-" + checkpoint);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create " + dir.string() + ": " + ec.message());
  return dir.string();
}

void ModelStore::commit(const ModelManifest& m) {
  const fs::path staging = fs::path(root_) / kStaging / (m.job + "-" + m.checkpoint);
  const fs::path dest = fs::path(root_) / m.job / m.checkpoint;
  std::error_code ec;
  try {
    {
      std::ofstream out(staging / kManifest);
      out << m.to_json().dump(1) << "\n";
      if (!out) throw IoError("cannot write " + (staging / kManifest).string());
    }
    fs::create_directories(dest.parent_path(), ec);
    if (ec) throw IoError("cannot create " + dest.parent_path().string() + ": " + ec.message());
    fs::remove_all(dest, ec);
    fs::rename(staging, dest, ec);
    if (ec) throw IoError("cannot rename " + staging.string() + " to " + dest.string() + ": " + ec.message());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  std::erase_if(models_, [&](const ModelManifest& x) { return x.job == m.job && x.checkpoint == m.checkpoint; });
  // Newest first by when the leader stored it (a standby commits copies in any order; the
  // retention must rank them as the leader does).
  const auto at = std::find_if(models_.begin(), models_.end(),
                               [&](const ModelManifest& x) { return x.created_unix < m.created_unix; });
  models_.insert(at, m);
  prune();
}

std::vector<ModelManifest> ModelStore::list(const std::optional<std::string>& job) const {
  std::vector<ModelManifest> out;
  for (const auto& m : models_) {
    if (!job || m.job == *job) out.push_back(m);
  }
  return out;
}

std::optional<ModelManifest> ModelStore::find(const std::string& job, const std::string& checkpoint) const {
  for (const auto& m : models_) {
    if (m.job == job && m.checkpoint == checkpoint) return m;
  }
  return std::nullopt;
}

std::string ModelStore::file_path(const std::string& job, const std::string& checkpoint, const std::string& file) const {
  return (fs::path(root_) / job / checkpoint / file).string();
}

void ModelStore::remove_job(const std::string& job) {
  std::error_code ec;
  fs::remove_all(fs::path(root_) / job, ec);
  if (ec) spdlog::warn("model store: cannot remove {}: {}", (fs::path(root_) / job).string(), ec.message());
  std::erase_if(models_, [&](const ModelManifest& x) { return x.job == job; });
}

void ModelStore::remove(const std::string& job, const std::string& checkpoint) {
  std::error_code ec;
  fs::remove_all(fs::path(root_) / job / checkpoint, ec);
  if (ec) spdlog::warn("model store: cannot remove {}/{}: {}", job, checkpoint, ec.message());
  if (fs::is_empty(fs::path(root_) / job, ec)) fs::remove(fs::path(root_) / job, ec);
  std::erase_if(models_, [&](const ModelManifest& x) { return x.job == job && x.checkpoint == checkpoint; });
}

// The jobs ranked by their newest model; those beyond the retention lose every model.
void ModelStore::prune() {
  std::vector<std::string> jobs;
  std::set<std::string> seen;
  for (const auto& m : models_) {
    if (seen.insert(m.job).second) jobs.push_back(m.job);
  }
  for (std::size_t i = static_cast<std::size_t>(retention_); i < jobs.size(); ++i) {
    spdlog::info("model store: removing the models of {} (model_retention = {} jobs)", jobs[i], retention_);
    remove_job(jobs[i]);
  }
}

struct UploadStore::InFlight {
  ChunkedFileWriter writer;
  std::chrono::steady_clock::time_point last;
  InFlight(const std::string& path, std::int64_t size, const std::string& sha256)
      : writer(path, size, sha256, static_cast<std::int64_t>(kMaxModelFileBytes)), last(std::chrono::steady_clock::now()) {}
};

UploadStore::UploadStore(std::string root, int retention) : files_(std::move(root), retention) { files_.open(); }

UploadStore::~UploadStore() = default;

std::int64_t UploadStore::put(const std::string& sha256, std::int64_t size, std::int64_t offset,
                              std::span<const std::uint8_t> bytes, const std::set<std::string>& keep) {
  if (files_.find(sha256)) return size;
  auto it = in_flight_.find(sha256);
  if (offset == 0 && bytes.empty()) {
    if (it != in_flight_.end()) {
      it->second->last = std::chrono::steady_clock::now();
      return it->second->writer.offset();  // another client's upload of the same content: go on with it
    }
    if (in_flight_.size() >= kMaxInFlight) {
      throw ProtocolError("the leader takes " + std::to_string(kMaxInFlight) +
                          " model uploads at once; try again when one has finished");
    }
    in_flight_[sha256] = std::make_unique<InFlight>(files_.path(sha256), size, sha256);
    return 0;
  }
  if (it == in_flight_.end()) {
    throw ProtocolError("no upload of " + sha256 + " is in progress (it was dropped after a pause; start again)");
  }
  auto& f = *it->second;
  f.last = std::chrono::steady_clock::now();
  if (offset != f.writer.offset()) return f.writer.offset();  // not the window the upload is at
  try {
    f.writer.append(offset, bytes);
    if (!f.writer.complete()) return f.writer.offset();
    f.writer.finish();
  } catch (...) {
    in_flight_.erase(sha256);
    throw;
  }
  in_flight_.erase(sha256);
  files_.touch(sha256);
  auto pinned = keep;
  pinned.insert(sha256);
  files_.prune(pinned);
  return size;
}

std::string UploadStore::adopt(const std::string& path, const std::string& sha256) {
  if (auto p = files_.find(sha256)) return *p;
  const fs::path dst = files_.path(sha256);
  const fs::path part = dst.string() + ".part";
  std::error_code ec;
  fs::copy_file(path, part, fs::copy_options::overwrite_existing, ec);
  if (ec) throw IoError("cannot copy " + path + " to " + part.string() + ": " + ec.message());
  if (sha256_file_hex(part.string()) != sha256) {
    fs::remove(part, ec);
    throw ProtocolError(path + " does not match its SHA-256 " + sha256);
  }
  fs::rename(part, dst, ec);
  if (ec) throw IoError("cannot rename " + part.string() + ": " + ec.message());
  files_.touch(sha256);
  return dst.string();
}

std::unique_ptr<ChunkedFileWriter> UploadStore::receive(const std::string& sha256, std::int64_t size) {
  return std::make_unique<ChunkedFileWriter>(files_.path(sha256), size, sha256,
                                             static_cast<std::int64_t>(kMaxModelFileBytes));
}

void UploadStore::stored(const std::string& sha256) { files_.touch(sha256); }

void UploadStore::remove(const std::string& sha256) {
  std::error_code ec;
  if (is_sha256_hex(sha256)) fs::remove(files_.path(sha256), ec);
}

void UploadStore::expire(std::chrono::seconds idle) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(in_flight_, [&](const auto& kv) { return now - kv.second->last > idle; });
}

}  // namespace dltrain::leader
