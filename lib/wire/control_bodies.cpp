#include "wire/control_bodies.h"

#include <cmath>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/file_transfer.h"
#include "common/host_port.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "wire/task_kind.h"

namespace dltrain::wire {
namespace {

// `s` as a JSON string, so that a message holding a peer's text stays one printable line
// (bytes that are not UTF-8 become U+FFFD).
std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

constexpr std::int64_t kNoUpperBound = std::numeric_limits<std::int64_t>::max();

// Throws BodyError(field) naming the range unless lo <= value <= hi (kNoUpperBound: no
// upper bound); `unit` ("lines", "bytes", ...) follows an upper bound in the message.
void check_range(const std::string& type, const char* field, std::int64_t value, std::int64_t lo,
                 std::int64_t hi = kNoUpperBound, const char* unit = "") {
  if (value >= lo && value <= hi) return;
  const std::string range = hi == kNoUpperBound ? ">= " + std::to_string(lo)
                                                : std::to_string(lo) + " to " + std::to_string(hi) +
                                                      (*unit != '\0' ? std::string(" ") + unit : std::string());
  throw BodyError(field, type + " field \"" + field + "\": expected " + range + ", got " + std::to_string(value));
}

}  // namespace

void check_path_name(const std::string& name, const std::string& field, const std::string& what) {
  if (name.empty() || name.size() > kMaxNameLength) {
    throw BodyError(field, what + " field \"" + field + "\": expected 1 to " + std::to_string(kMaxNameLength) +
                               " characters, got " + std::to_string(name.size()));
  }
  const bool dots = name == "." || name == "..";
  const bool bad_char = name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
                        std::string::npos;
  if (dots || bad_char) {
    throw BodyError(field, what + " field \"" + field + "\": " + quoted(name) + " is not a valid name (letters, digits, '-', '_' and '.'; not \".\" or \"..\")");
  }
}

void LinkReportBody::check(const std::string& type) const {
  if (!(std::isfinite(bytes_per_sec) && bytes_per_sec > 0)) {
    throw BodyError("bytes_per_sec", type + " field \"bytes_per_sec\" must be a finite number > 0");
  }
  if (rtt_seconds && !(std::isfinite(*rtt_seconds) && *rtt_seconds >= 0)) {
    throw BodyError("rtt_seconds", type + " field \"rtt_seconds\" must be a finite number >= 0");
  }
}

void RegisterBody::check(const std::string& type) const {
  if (name.empty()) throw BodyError("name", type + " needs a name");
  if (name.size() > kMaxNameLength) {
    throw BodyError("name", type + " field \"name\": at most " + std::to_string(kMaxNameLength) + " characters, got " +
                                std::to_string(name.size()));
  }
  if (cores < 1) throw BodyError("cores", "cores must be >= 1, got " + std::to_string(cores));
  if (memory_mb < 0) throw BodyError("memory_mb", "memory_mb must be >= 0, got " + std::to_string(memory_mb));
  if (shard_cache_bytes && *shard_cache_bytes < 0) {
    throw BodyError("shard_cache_bytes", "shard_cache_bytes must be >= 0, got " + std::to_string(*shard_cache_bytes));
  }
  if (gpus.size() > kMaxGpus) {
    throw BodyError("gpus", type + " field \"gpus\": at most " + std::to_string(kMaxGpus) + " GPUs, got " +
                                std::to_string(gpus.size()));
  }
  std::uint64_t seen = 0;
  for (const auto& g : gpus) {
    const std::string what = type + " field \"gpus\": GPU " + std::to_string(g.index);
    if (g.index < 0 || g.index >= static_cast<int>(kMaxGpus)) {
      throw BodyError("gpus", type + " field \"gpus\": index must be in [0, " + std::to_string(kMaxGpus - 1) +
                                  "], got " + std::to_string(g.index));
    }
    if (seen & (std::uint64_t{1} << g.index)) throw BodyError("gpus", what + " is listed twice");
    seen |= std::uint64_t{1} << g.index;
    if (g.name.size() > kMaxNameLength || g.uuid.size() > kMaxNameLength) {
      throw BodyError("gpus", what + ": name and uuid may have at most " + std::to_string(kMaxNameLength) + " bytes");
    }
    if (g.memory_mb < 0) throw BodyError("gpus", what + ": memory_mb must be >= 0, got " + std::to_string(g.memory_mb));
  }
}

void ListBody::check(const std::string& type) const {
  check_range(type, "limit", limit, 1, kMaxLimit);
}

TaskRefBody TaskRefBody::lenient(const nlohmann::json& body) noexcept {
  TaskRefBody r;
  if (!body.is_object()) return r;
  const auto str = [&](const char* key) {
    const auto it = body.find(key);
    return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  r.job = str("job");
  r.task = str("task");
  const auto g = body.find("generation");
  if (g != body.end() && g->is_number_unsigned() && g->get<std::uint64_t>() <= UINT32_MAX) {
    r.generation = static_cast<std::uint32_t>(g->get<std::uint64_t>());
  }
  return r;
}

void TaskEventBody::check(const std::string& type) const {
  if (!event.is_object()) {
    throw BodyError("event", type + " field \"event\": expected an object, got " + std::string(event.type_name()));
  }
}

void SubmitBody::check(const std::string& type) const {
  if (!job_toml) throw BodyError("job_toml", type + " needs \"job_toml\" (string)");
  for (const auto& [name, sha] : {std::pair{"model_sha256", &model_sha256}, std::pair{"init_sha256", &init_sha256}}) {
    if (*sha && !is_sha256_hex(**sha)) {
      throw BodyError(name, type + " field \"" + name + "\": expected 64 lowercase hex digits, got " + quoted(**sha));
    }
  }
}

void LogRequestBody::check(const std::string& type) const {
  check_path_name(job, "job", type);
  check_path_name(task, "task", type);
  if (offset) check_range(type, "offset", *offset, 0);
  check_range(type, "tail", tail, 0, kMaxTail, "lines");
  check_range(type, "max_bytes", max_bytes, 1, kMaxBytes);
  if (file != kLogFile && file != kTraceFile) {
    throw BodyError("file", type + " field \"file\": expected log or trace, got " + quoted(file));
  }
}

bool is_model_file(const std::string& name) {
  for (const char* f : kModelFiles) {
    if (name == f) return true;
  }
  return false;
}

void ModelFileRequestBody::check(const std::string& type) const {
  check_path_name(job, "job", type);
  check_path_name(task, "task", type);
  check_path_name(checkpoint, "checkpoint", type);
  if (!is_model_file(file)) {
    throw BodyError("file", type + " field \"file\": expected metadata.json, state_dict.pt or model.pt, got " + quoted(file));
  }
  check_range(type, "offset", offset, 0);
  check_range(type, "max_bytes", max_bytes, 1, kMaxBytes);
}

void ModelUploadBody::check(const std::string& type) const {
  if (!is_sha256_hex(sha256)) {
    throw BodyError("sha256", type + " field \"sha256\": expected 64 lowercase hex digits, got " + quoted(sha256));
  }
  check_range(type, "size", size, 1, kMaxFileBytes, "bytes");
  if (offset < 0 || offset > size) {
    throw BodyError("offset", type + " field \"offset\": expected 0 to size (" + std::to_string(size) + "), got " +
                                  std::to_string(offset));
  }
  if (static_cast<std::int64_t>(data.size()) > 4 * ((kMaxBytes + 2) / 3)) {
    throw BodyError("data", type + " field \"data\": more than " + std::to_string(kMaxBytes) + " bytes in one window");
  }
}

void ModelDownloadBody::check(const std::string& type) const {
  if (!is_sha256_hex(sha256)) {
    throw BodyError("sha256", type + " field \"sha256\": expected 64 lowercase hex digits, got " + quoted(sha256));
  }
  check_range(type, "offset", offset, 0);
  check_range(type, "max_bytes", max_bytes, 1, ModelFileRequestBody::kMaxBytes);
}

void ReplicateBody::check(const std::string& type) const {
  if (candidate.empty()) throw BodyError("candidate", type + " needs \"candidate\" (the standby's name)");
  if (models.size() > kMaxItems) throw BodyError("models", type + " field \"models\": more than 100000 entries");
  if (uploads.size() > kMaxItems) throw BodyError("uploads", type + " field \"uploads\": more than 100000 entries");
  for (const auto& u : uploads) {
    if (!is_sha256_hex(u)) {
      throw BodyError("uploads", type + " field \"uploads\": expected 64 lowercase hex digits, got " + quoted(u));
    }
  }
}

void EventsBody::check(const std::string& type) const {
  if (job.empty()) throw BodyError("job", type + " needs \"job\" (a job id such as \"job-1\")");
  check_range(type, "limit", limit, 1, kMaxLimit, "events");
}

void StartTaskBody::check(const std::string& type) const {
  check_path_name(job, "job", type);
  check_path_name(task, "task", type);
  if (job_num == 0) throw BodyError("job_num", type + " field \"job_num\": expected a job number >= 1, got 0");
  check_range(type, "index", index, 0);
  check_range(type, "threads", threads, 1);
  check_range(type, "resume_epoch", resume_epoch, 0);
  try {
    job_secret_from_hex(secret, "secret");  // its message never shows the secret
  } catch (const ConfigError& e) {
    throw BodyError("secret", type + " for " + job + "/" + task + ": " + e.what());
  }
  std::vector<int> seen;
  for (const int g : gpus) {
    if (g < 0 || g > 63 || std::find(seen.begin(), seen.end(), g) != seen.end()) {
      throw BodyError("gpus", type + " field \"gpus\": expected distinct GPU indices in [0, 63], got " +
                                  std::to_string(g) + (g >= 0 && g <= 63 ? " twice" : ""));
    }
    seen.push_back(g);
  }
  if (kind == TaskKind::kWorker) {
    if (spec.device == Device::kCuda && static_cast<int>(gpus.size()) != spec.gpus_per_worker) {
      throw BodyError("gpus", type + " field \"gpus\": a worker of a cuda job with gpus_per_worker = " +
                                  std::to_string(spec.gpus_per_worker) + " needs as many GPUs, got " +
                                  std::to_string(gpus.size()));
    }
  }
  if (local_group) {
    const auto& g = *local_group;
    const int size = static_cast<int>(g.members.size());
    if (size < 1 || size > kMaxLocalGroup) {
      throw BodyError("local_group", type + " field \"local_group.members\": expected 1 to " +
                                         std::to_string(kMaxLocalGroup) + " members, got " + std::to_string(size));
    }
    if (g.rank < 0 || g.rank >= size) {
      throw BodyError("local_group", type + " field \"local_group.rank\": expected [0, " + std::to_string(size) +
                                         "), got " + std::to_string(g.rank));
    }
    for (const auto& m : g.members) check_path_name(m, "local_group", type);
    if (g.members[static_cast<std::size_t>(g.rank)] != task) {
      throw BodyError("local_group", type + " field \"local_group\": member " + std::to_string(g.rank) + " is " +
                                         quoted(g.members[static_cast<std::size_t>(g.rank)]) + ", not this task " +
                                         quoted(task));
    }
  }
  if (kind == TaskKind::kWorker) {
    for (const auto& e : ps) {
      // A worker's command line joins them with ','.
      if (e.find(',') != std::string::npos) {
        throw BodyError("ps", type + " field \"ps\": " + quoted(e) + " holds a ','; expected HOST:PORT");
      }
      try {
        parse_host_port(e, "ps");
      } catch (const ConfigError& err) {
        throw BodyError("ps", type + " field " + err.what());
      }
    }
  }
}

}  // namespace dltrain::wire
