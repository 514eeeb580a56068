#include "agent/task_files.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "agent/task_logs.h"
#include "common/file_transfer.h"
#include "wire/control.h"

namespace dltrain::agent {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The SHA-256 of a model file: the one its worker wrote into metadata.json beside it
// (hashing a large state_dict again would hold up the agent's io thread), else computed.
std::string model_file_sha256(const std::string& path, const std::string& file) {
  if (file != "metadata.json") {
    try {
      std::ifstream in(fs::path(path).parent_path() / "metadata.json");
      const auto meta = json::parse(in);
      const auto sha = meta.at("sha256").at(file).get<std::string>();
      if (is_sha256_hex(sha)) return sha;
    } catch (const std::exception&) {
      // no usable checksum there: compute it
    }
  }
  return sha256_file_hex(path);
}

}  // namespace

wire::LogChunkBody read_task_log(const config::AgentOptions& opt, const wire::LogRequestBody& b,
                                 const TaskLaunch* running) {
  std::string path;
  if (b.file == wire::LogRequestBody::kTraceFile) {
    path = step_trace_path(opt, b.job, b.task, running ? running->generation : b.generation);
  } else {
    path = running ? running->process.log_path : task_log_path(opt, b.job, b.task, b.generation);
  }
  const auto w = read_log_window(path, b.offset, static_cast<std::size_t>(b.tail), static_cast<std::size_t>(b.max_bytes));
  wire::LogChunkBody c;
  c.job = b.job;
  c.task = b.task;
  c.agent = opt.name;
  c.text = w.text;
  c.offset = w.offset;
  c.next_offset = w.next_offset;
  c.size = w.size;
  c.rotated = w.rotated;
  c.exists = w.exists;
  c.running = running != nullptr;
  return c;
}

std::string model_file_reply(const config::AgentOptions& opt, const std::string& id,
                             const wire::ModelFileRequestBody& b) {
  const std::string path = model_file_path(opt, b.job, b.task, b.generation, b.checkpoint, b.file);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return wire::make_error(id, wire::error_code::kNotFound,
                            b.task + " of " + b.job + " left no " + b.file + " of its model \"" + b.checkpoint +
                                "\" on agent " + opt.name,
                            "file");
  }
  const auto w = read_file_window(path, b.offset, b.max_bytes);
  wire::ModelFileChunkBody c;
  c.job = b.job;
  c.file = b.file;
  c.offset = w.offset;
  c.size = w.size;
  c.data = base64_encode(w.bytes);
  if (b.offset == 0) c.sha256 = model_file_sha256(path, b.file);
  return wire::make_reply(id, c.to_json());
}

}  // namespace dltrain::agent
