#include "models.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <ctime>
#include <iostream>
#include <sstream>
#include <thread>

#include <toml++/toml.h>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "output.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace dltrain::client {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


std::string when(double unix_seconds) {
  const auto t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::ostringstream out;
  out << std::put_time(&tm, "%Y-%m-%d %H:%M:%S");
  return out.str();
}

// The job's stored models once `checkpoint` is among them or the leader collects none of
// them any more (a job that has just succeeded has its last model already, its other
// checkpoints may follow; one still running will not have it soon).
json stored_models(control::BlockingControlClient& c, const CommandOptions& opt, const std::string& checkpoint) {
  const auto deadline = std::chrono::steady_clock::now() + opt.timeout;
  bool said = false;
  for (;;) {
    json r = c.request("models", {{"job", opt.job_id}}, opt.timeout);
    const bool busy = !r.value("collecting", json::array()).empty();
    const auto listed = r.value("models", json::array());
    const bool there = std::any_of(listed.begin(), listed.end(),
                                   [&](const json& m) { return m.value("checkpoint", "") == checkpoint; });
    if (there || !busy) return r;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw control::RemoteError(wire::error_code::kUnavailable,
                                 "the leader was still collecting the model of " + opt.job_id + " after " +
                                     std::to_string(opt.timeout.count()) + " s (--timeout)",
                                 "job");
    }
    if (!said) {
      std::cerr << "dltrain: the leader is collecting the model of " << opt.job_id << " from its agent; waiting"
                << std::endl;
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace

int models(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  json body = json::object();
  if (!opt.job_id.empty()) body["job"] = opt.job_id;
  const json r = c.request("models", body, opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
    return kExitOk;
  }
  if (!r.value("kept", true)) std::cout << "the leader keeps no models (it has no state directory)\n";
  const auto list = r.value("models", json::array());
  if (list.empty() && r.value("collecting", json::array()).empty()) {
    std::cout << "no models kept" << (opt.job_id.empty() ? "" : " of " + opt.job_id);
    if (r.contains("model_error")) std::cout << ": " << r["model_error"].get<std::string>();
    std::cout << std::endl;
    return kExitOk;
  }
  std::cout << std::left << std::setw(10) << "JOB" << std::setw(12) << "CHECKPOINT" << std::setw(13) << "MODEL"
            << std::setw(15) << "DATASET" << std::setw(10) << "ACCURACY" << std::setw(8) << "EPOCHS" << std::setw(11)
            << "SIZE" << "STORED\n";
  for (const auto& m : list) {
    const std::string acc = m.contains("test_accuracy") ? fmt(m["test_accuracy"].get<double>(), 4) : "-";
    std::cout << std::left << std::setw(10) << m.value("job", "") << std::setw(12) << m.value("checkpoint", "")
              << std::setw(13) << m.value("model", "") << std::setw(15) << m.value("dataset", "") << std::setw(10)
              << acc << std::setw(8) << m.value("epochs", 0) << std::setw(11)
              << human_bytes(static_cast<double>(m.value("bytes", std::int64_t{0}))) << when(m.value("created_unix", 0.0))
              << "\n";
  }
  for (const auto& job : r.value("collecting", json::array())) {
    std::cout << std::left << std::setw(10) << job.get<std::string>() << "(being collected from its agent)\n";
  }
  if (!list.empty()) std::cout << "download one: dltrain model get " << list[0].value("job", "JOB") << " -o DIR\n";
  return kExitOk;
}

int model_get(control::BlockingControlClient& c, const CommandOptions& opt, const ModelGetOptions& given, bool as_json) {
  ModelGetOptions mo = given;
  // --checkpoint 3: the model after epoch 3.
  if (!mo.checkpoint.empty() &&
      std::all_of(mo.checkpoint.begin(), mo.checkpoint.end(), [](unsigned char ch) { return std::isdigit(ch); })) {
    mo.checkpoint = "epoch-" + mo.checkpoint;
  }
  const json r = stored_models(c, opt, mo.checkpoint);
  json manifest;
  std::string kept;
  for (const auto& m : r.value("models", json::array())) {
    kept += (kept.empty() ? "" : ", ") + m.value("checkpoint", "");
    if (m.value("checkpoint", "") == mo.checkpoint) manifest = m;
  }
  if (manifest.is_null()) {
    std::string why = "no model \"" + mo.checkpoint + "\" of " + opt.job_id + " is kept";
    if (!kept.empty()) why += " (its models: " + kept + ")";
    if (r.contains("state")) why += "; the job is " + r["state"].get<std::string>();
    if (r.contains("model_error")) why += "; " + r["model_error"].get<std::string>();
    throw control::RemoteError(wire::error_code::kNotFound, why, "job");
  }
  const fs::path dir = mo.dir.empty() ? fs::path(opt.job_id + "-model") : fs::path(mo.dir);
  std::vector<std::string> written;
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError("cannot create " + dir.string() + ": " + ec.message());
    // A model file of another model downloaded here before would be taken for this one's.
    for (const char* name : wire::kModelFiles) fs::remove(dir / name, ec);
    for (const auto& f : manifest.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      if (!wire::is_model_file(name)) throw ProtocolError("the leader listed an unexpected file \"" + name + "\"");
      ChunkedFileWriter w((dir / name).string(), f.at("bytes").get<std::int64_t>(), f.at("sha256").get<std::string>(),
                          wire::ModelUploadBody::kMaxFileBytes);
      while (!w.complete()) {
        json body{{"job", opt.job_id},  {"checkpoint", mo.checkpoint},     {"file", name},
                  {"offset", w.offset()}, {"max_bytes", wire::ModelFileRequestBody::kMaxBytes}};
        const auto chunk = wire::ModelFileChunkBody::from_json(c.request("model_read", body, opt.timeout));
        w.append(chunk.offset, base64_decode(chunk.data));
      }
      w.finish();
      written.push_back(name);
    }
  } catch (const IoError& e) {
    // Here, not the leader: said as such (main() takes an IoError for an unreachable leader).
    throw Error(std::string("model get: ") + e.what());
  }
  if (as_json) {
    std::cout << json{{"dir", fs::absolute(dir).string()}, {"model", manifest}}.dump() << std::endl;
    return kExitOk;
  }
  std::cout << opt.job_id << " (" << mo.checkpoint << ", " << manifest.value("model", "") << ", "
            << manifest.value("dataset", "");
  if (manifest.contains("test_accuracy")) std::cout << ", test accuracy " << fmt(manifest["test_accuracy"].get<double>(), 4);
  std::cout << "): ";
  for (std::size_t i = 0; i < written.size(); ++i) std::cout << (i ? ", " : "") << written[i];
  std::cout << " (" << human_bytes(static_cast<double>(manifest.value("bytes", std::int64_t{0}))) << ", SHA-256 checked) -> "
            << dir.string() << "/\n";
  std::cout << "try it: dltrain predict " << dir.string() << " IMAGE.png   |   dltrain evaluate " << dir.string()
            << " --data DIR   |   python3: torch.load(\"" << (dir / "state_dict.pt").string() << "\")\n";
  return kExitOk;
}

// Uploads the file at `path` unless the leader has its content; returns its SHA-256.
std::string upload_file(control::BlockingControlClient& c, const fs::path& path, const std::string& field,
                        const CommandOptions& opt, bool quiet) {
  std::error_code ec;
  const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) throw ConfigError(field, "cannot read " + path.string() + ": " + ec.message());
  if (size > wire::ModelUploadBody::kMaxFileBytes) {
    throw ConfigError(field, "\"" + path.string() + "\" has " + std::to_string(size) + " bytes, more than the " +
                                 std::to_string(wire::ModelUploadBody::kMaxFileBytes) + " a model file may have");
  }
  if (size == 0) throw ConfigError(field, "\"" + path.string() + "\" is empty");
  std::string sha;
  try {
    sha = sha256_file_hex(path.string());
  } catch (const IoError& e) {
    throw ConfigError(field, e.what());
  }
  json body{{"sha256", sha}, {"size", size}, {"offset", 0}, {"data", ""}};
  auto st = wire::ModelUploadState::from_json(c.request("model_upload", body, opt.timeout));
  if (!st.stored && !quiet) {
    std::cerr << "dltrain: uploading " << path.string() << " (" << human_bytes(static_cast<double>(size))
              << ") to the leader" << std::endl;
  }
  // The leader says where to go on after each window (another client uploading the same
  // content may have moved it on); every window it takes moves it on, so the windows
  // needed are bounded, and so are those it might not take.
  const std::int64_t windows = size / wire::ModelUploadBody::kMaxBytes + 1;
  for (std::int64_t sent = 0; !st.stored; ++sent) {
    if (sent > 4 * windows + 16) throw ProtocolError("the leader did not take the upload of " + path.string());
    FileWindow w;
    try {
      w = read_file_window(path.string(), st.offset, wire::ModelUploadBody::kMaxBytes);
    } catch (const IoError& e) {
      throw ConfigError(field, e.what());
    }
    if (w.bytes.empty()) throw ConfigError(field, path.string() + " changed while it was uploaded");
    body["offset"] = st.offset;
    body["data"] = base64_encode(w.bytes);
    st = wire::ModelUploadState::from_json(c.request("model_upload", body, opt.timeout));
  }
  return sha;
}

json with_uploaded_model(control::BlockingControlClient& c, json request, const CommandOptions& opt, bool quiet) {
  toml::table job;
  try {
    job = toml::parse(request.at("job_toml").get<std::string>());
  } catch (const toml::parse_error&) {
    return request;  // the leader says what is wrong with the file
  }
  const fs::path base = request.at("base_dir").get<std::string>();
  const auto local = [&](const std::string& p) { return (fs::path(p).is_relative() ? base / p : fs::path(p)).lexically_normal(); };
  std::error_code ec;
  const auto model = job["model"].value<std::string>();
  const auto file = job["model_file"].value<std::string>();
  if (model == "torchscript" && file && fs::is_regular_file(local(*file), ec)) {
    request["model_sha256"] = upload_file(c, local(*file), "model_file", opt, quiet);
  }
  // init_from a model directory here (`dltrain model get` wrote it): its state_dict goes
  // up too; a job id is the leader's to resolve.
  if (const auto from = job["init_from"].value<std::string>(); from && fs::is_directory(local(*from), ec)) {
    const fs::path sd = local(*from) / "state_dict.pt";
    if (!fs::is_regular_file(sd, ec)) {
      throw ConfigError("init_from", "\"" + local(*from).string() + "\" has no state_dict.pt (a model directory is what "
                                     "`dltrain model get JOB -o DIR` writes)");
    }
    request["init_sha256"] = upload_file(c, sd, "init_from", opt, quiet);
  }
  return request;
}

int exec_model_tool(const std::string& self, const std::vector<std::string>& args) {
  const std::string tool = (fs::path(self).parent_path() / "dltrain-model").string();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(tool.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(tool.c_str(), argv.data());
  std::cerr << "dltrain: " << (args.empty() ? std::string("this command") : args[0])
            << " runs the model with LibTorch, in dltrain-model, which is installed beside dltrain; cannot run "
            << tool << ": " << std::strerror(errno) << "\n";
  return kExitBadInput;
}

}  // namespace dltrain::client
