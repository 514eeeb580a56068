// The trained model: when every task of a succeeding job has exited, the leader collects
// the model worker 0 wrote (the PS's parameters of the final evaluation, with their
// BatchNorm statistics: the model the job's accuracy is of) from its agent, one window
// of one file at a time, checks each file's SHA-256 and keeps it in its model store
// (leader/model_store.h); only then does the job succeed, so that a client that saw it
// succeed can fetch the model at once. A model that cannot be collected costs the model,
// not the job: the summary says why. Clients list the models (`models`) and read them
// (`model_read`) from the store, which outlives the agents' task directories.
#include "leader/model_collection.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <fstream>

#include <spdlog/spdlog.h>

#include "common/file_transfer.h"
#include "job/job_spec.h"

namespace dltrain::leader {

using json = nlohmann::json;

namespace {

/// The largest metadata.json the leader collects (a worker's is a few KiB; 10,000 class
/// names fit).
constexpr std::int64_t kMaxMetadataBytes = 1 << 20;

/// The epoch of checkpoint name "epoch-N" (N >= 1), else 0.
int checkpoint_epoch(const std::string& name) {
  constexpr std::string_view kPrefix = "epoch-";
  if (name.size() <= kPrefix.size() || name.size() > kPrefix.size() + 6 || name.rfind(kPrefix, 0) != 0) return 0;
  int n = 0;
  for (std::size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

}  // namespace

bool ModelCollection::collect(JobRec& j) {
  if (collecting(j.id)) return true;
  const auto skip = [&](std::string why) {
    j.model.done = true;
    j.model.error = std::move(why);
    if (!j.model.error.empty()) spdlog::warn("job {}: no trained model kept: {}", j.id, j.model.error);
    return false;
  };
  if (!j.explore.profile_of.empty()) return skip("");  // an exploration run's model is nobody's
  const bool succeeding = j.life.target() == JobState::kSucceeded;
  const TaskRec* t = j.find_task("worker-0");
  // A failed or cancelled job leaves its latest epoch checkpoint (what `dltrain resume`
  // starts from), written before worker 0 reported that epoch's end; none when it wrote
  // none, or none since it was resumed (that one is its predecessor's).
  std::string checkpoint = "last";
  if (!succeeding) {
    const int every = j.spec.checkpoint.every_epochs;
    const int reached = t == nullptr || every <= 0 ? 0 : t->epochs_done / every * every;
    if (reached <= j.resume.epoch) return skip("");
    checkpoint = "epoch-" + std::to_string(reached);
  }
  if (!models_) return skip("the leader has no state directory to keep it in");
  if (t == nullptr || t->agent.empty()) return skip("the job has no worker-0");
  if (!session_of(t->agent)) return skip("agent " + t->agent + ", which has worker-0's model, is not connected");
  Collecting c;
  c.job = j.id;
  c.agent = t->agent;
  c.req.job = j.id;
  c.req.task = t->name;
  c.req.generation = j.generation;
  c.req.file = "metadata.json";
  c.req.checkpoint = checkpoint;
  c.manifest.job = j.id;
  c.manifest.checkpoint = checkpoint;
  c.manifest.model = enum_name(j.spec.model);
  c.manifest.dataset = enum_name(j.spec.dataset);
  if (j.test_accuracy >= 0) c.manifest.test_accuracy = j.test_accuracy;
  c.manifest.epochs = j.epochs_done;
  c.manifest.agent = t->agent;
  try {
    c.staging = models_->staging_dir(j.id, checkpoint);
  } catch (const std::exception& e) {
    return skip(e.what());
  }
  spdlog::info("job {}: collecting {} from agent {}", j.id,
               succeeding ? std::string("the trained model") : "its latest checkpoint, " + checkpoint, c.agent);
  auto& stored = collecting_[j.id] = std::move(c);
  request_window(stored);
  return true;
}

ModelCollection::SessionPtr ModelCollection::session_of(const std::string& agent) const {
  const auto a = agents_.find(agent);
  return a == agents_.end() || a->second.lost ? nullptr : a->second.session.lock();
}

void ModelCollection::request_window(Collecting& c) {
  c.req_id = "model-" + std::to_string(next_req_++);
  c.deadline = Clock::now() + kReplyTimeout;
  const auto session = session_of(c.agent);
  if (!session) return end(c.job, "agent " + c.agent + " went away while its model was collected");
  hooks_.order(session, c.req_id, wire::ControlType::kReadModelFile, c.req.to_json());
}

bool ModelCollection::on_reply(const wire::Envelope& env) {
  auto it = collecting_.begin();
  while (it != collecting_.end() && it->second.req_id != env.id) ++it;
  if (it == collecting_.end()) return false;
  Collecting& c = it->second;
  if (!env.ok) {
    if (env.error.value("code", std::string()) == wire::error_code::kNotFound && try_earlier_checkpoint(c)) return true;
    end(c.job, "agent " + c.agent + ": " + env.error.value("message", std::string("?")));
    return true;
  }
  try {
    take_chunk(c, wire::parse_body<wire::ModelFileChunkBody>(env));
  } catch (const std::exception& e) {
    end(c.job, "collecting the model from agent " + c.agent + ": " + e.what());
  }
  return true;
}

// A failed or cancelled job's latest epoch checkpoint that its worker 0 did not leave in
// this generation's directory (it was re-assigned since, or the write failed): the one
// before it, down to where the job started.
bool ModelCollection::try_earlier_checkpoint(Collecting& c) {
  const auto jit = jobs_.find(c.job);
  if (jit == jobs_.end() || !c.stored.empty() || c.req.offset != 0 || c.req.file != "metadata.json" || c.writer ||
      jit->second.life.target() == JobState::kSucceeded) {
    return false;
  }
  const int every = jit->second.spec.checkpoint.every_epochs;
  const int k = checkpoint_epoch(c.manifest.checkpoint) - every;
  if (every <= 0 || k <= jit->second.resume.epoch) return false;
  const std::string next = "epoch-" + std::to_string(k);
  spdlog::info("job {}: agent {} has no checkpoint {}; trying {}", c.job, c.agent, c.manifest.checkpoint, next);
  std::error_code ec;
  std::filesystem::remove_all(c.staging, ec);
  try {
    c.staging = models_->staging_dir(c.job, next);
  } catch (const std::exception& e) {
    end(c.job, e.what());
    return true;
  }
  c.manifest.checkpoint = next;
  c.req.checkpoint = next;
  request_window(c);
  return true;
}

void ModelCollection::take_chunk(Collecting& c, const wire::ModelFileChunkBody& chunk) {
  if (!c.writer) {
    // A metadata file is small (the job's spec, class names, checksums): one that is not
    // is refused before the leader parses it.
    const std::int64_t most = c.req.file == "metadata.json" ? kMaxMetadataBytes : wire::ModelUploadBody::kMaxFileBytes;
    c.writer = std::make_unique<ChunkedFileWriter>((std::filesystem::path(c.staging) / c.req.file).string(), chunk.size,
                                                   chunk.sha256, most);
    c.sha256 = chunk.sha256;
  }
  c.writer->append(chunk.offset, base64_decode(chunk.data));
  if (!c.writer->complete()) {
    c.req.offset = c.writer->offset();
    return request_window(c);
  }
  c.writer->finish();
  c.manifest.files.push_back({c.req.file, c.writer->offset(), c.sha256});
  c.writer.reset();
  if (c.req.file == "metadata.json") take_metadata(c);
  if (!c.pending.empty()) {
    c.req.file = c.pending.front();
    c.pending.erase(c.pending.begin());
    c.req.offset = 0;
    return request_window(c);
  }
  c.manifest.created_unix = unix_now();
  models_->commit(c.manifest);
  inventory_changed();
  spdlog::info("job {}: trained model \"{}\" stored ({} files, {} bytes)", c.job, c.manifest.checkpoint,
               c.manifest.files.size(), c.manifest.bytes());
  if (c.stored.empty()) c.stored = c.manifest.checkpoint;
  if (!c.checkpoints_left.empty()) {
    // The next checkpoint beside the last model: its own directory, metadata first;
    // its epoch and accuracy are its metadata's.
    const std::string next = c.checkpoints_left.front();
    c.checkpoints_left.erase(c.checkpoints_left.begin());
    c.manifest.checkpoint = next;
    c.manifest.files.clear();
    c.manifest.test_accuracy.reset();
    c.manifest.epochs = 0;
    c.staging = models_->staging_dir(c.job, next);
    c.req.checkpoint = next;
    c.req.file = "metadata.json";
    c.req.offset = 0;
    return request_window(c);
  }
  end(c.job, "");
}

// What a checkpoint's metadata.json (just collected) says: the files the worker wrote
// (a built-in model has no model.pt), the epoch and accuracy of a checkpoint other than
// the last, and, in the last one's, the other checkpoints to collect.
void ModelCollection::take_metadata(Collecting& c) {
  std::ifstream in(std::filesystem::path(c.staging) / "metadata.json");
  const json meta = json::parse(in);
  for (const auto& f : meta.value("files", json::array())) {
    if (!f.is_string()) continue;
    const auto name = f.get<std::string>();
    if (wire::is_model_file(name) && name != "metadata.json" &&
        std::find(c.pending.begin(), c.pending.end(), name) == c.pending.end()) {
      c.pending.push_back(name);
    }
  }
  if (c.manifest.checkpoint != "last") {
    if (meta.contains("test_accuracy") && meta["test_accuracy"].is_number()) {
      c.manifest.test_accuracy = meta["test_accuracy"].get<double>();
    }
    if (meta.contains("epoch") && meta["epoch"].is_number_integer()) c.manifest.epochs = meta["epoch"].get<int>();
    return;
  }
  // As many as [checkpoint] can have asked for (every epochs_every-th epoch and "best"),
  // each once: a worker's metadata cannot make the leader fetch more.
  const auto jit = jobs_.find(c.job);
  const int every = jit == jobs_.end() ? 0 : jit->second.spec.checkpoint.every_epochs;
  const std::size_t most = (every > 0 ? static_cast<std::size_t>(jit->second.spec.epochs / every) : 0) + 1;
  for (const auto& cp : meta.value("checkpoints", json::array())) {
    if (c.checkpoints_left.size() >= most) break;
    if (!cp.is_string()) continue;
    const auto name = cp.get<std::string>();
    // A checkpoint names a directory on the agent and here: a path component only.
    try {
      wire::check_path_name(name, "checkpoints", "metadata.json");
    } catch (const ProtocolError&) {
      continue;
    }
    if (name != "last" && std::find(c.checkpoints_left.begin(), c.checkpoints_left.end(), name) == c.checkpoints_left.end()) {
      c.checkpoints_left.push_back(name);
    }
  }
}

// `job` by value: callers pass the Collecting's own, which the erase destroys.
void ModelCollection::end(std::string job, const std::string& error) {
  const auto it = collecting_.find(job);
  if (it != collecting_.end()) {
    // The first model stored ("last", or a failed job's epoch checkpoint) is the job's,
    // whatever became of another checkpoint.
    const std::string checkpoint = it->second.stored;
    const std::string failed = it->second.manifest.checkpoint;
    const std::string staging = it->second.staging;
    collecting_.erase(it);  // a writer left unfinished removes its part file
    if (!error.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(staging, ec);  // the files that did arrive
    }
    const auto jit = jobs_.find(job);
    if (jit == jobs_.end()) return;
    JobRec& j = jit->second;
    j.model.checkpoint = checkpoint;
    if (!error.empty()) {
      // With the job's model kept, the error is of another checkpoint: it says which.
      j.model.error = checkpoint.empty() ? error : "checkpoint \"" + failed + "\" not kept: " + error;
      spdlog::warn("job {}: {} trained model kept: {}", job, checkpoint.empty() ? "no" : "not every", error);
    }
    await_replicas(j);
  }
}

void ModelCollection::expire(Clock::time_point now) {
  if (uploads_) uploads_->expire(std::chrono::seconds(120));
  check_awaiting(now);
  for (auto& [name, r] : replicas_) {
    if (!r.parked.empty() && r.parked_until <= now) answer(r, reply_);
  }
  std::vector<std::pair<std::string, std::string>> ended;  // job, why
  for (const auto& [job, c] : collecting_) {
    const auto a = agents_.find(c.agent);
    if (a == agents_.end() || a->second.lost) {
      ended.emplace_back(job, "agent " + c.agent + " was lost while its model was collected");
    } else if (c.deadline <= now) {
      ended.emplace_back(job, "agent " + c.agent + " did not send the model within " +
                                  std::to_string(kReplyTimeout.count()) + " s");
    }
  }
  for (const auto& [job, why] : ended) end(job, why);
}

void ModelCollection::open(const std::string& state_dir, int retention) {
  models_ = std::make_unique<ModelStore>((std::filesystem::path(state_dir) / "models").string(), retention);
  uploads_ = std::make_unique<UploadStore>((std::filesystem::path(state_dir) / "uploads").string(), retention);
}

json ModelCollection::models_json(const std::optional<std::string>& job) const {
  // A reply stays well inside the 4 MiB message limit: a manifest is ~400 bytes.
  constexpr std::size_t kMaxListed = 1000;
  json out = json::array();
  if (!models_) return out;
  for (const auto& m : models_->list(job)) {
    if (out.size() >= kMaxListed) break;
    out.push_back(m.to_json());
  }
  return out;
}

json ModelCollection::on_models(const wire::ModelsQueryBody& b) const {
  json busy = json::array();
  for (const auto& [job, c] : collecting_) {
    if (!b.job || *b.job == job) busy.push_back(job);
  }
  json body{{"models", models_json(b.job)}, {"collecting", busy}, {"kept", models_ != nullptr}};
  if (b.job) {
    const auto jit = jobs_.find(*b.job);
    if (jit != jobs_.end()) {
      body["state"] = to_string(jit->second.state());
      if (!jit->second.model.error.empty()) body["model_error"] = jit->second.model.error;
    }
  }
  return body;
}

json ModelCollection::on_model_read(const wire::ModelFileRequestBody& b) const {
  const auto m = models_ ? models_->find(b.job, b.checkpoint) : std::nullopt;
  if (!m) {
    if (collecting_.count(b.job)) {
      throw wire::Refused(wire::error_code::kUnavailable, "the model of " + b.job + " is being collected from agent " +
                                                              collecting_.at(b.job).agent + "; try again in a moment");
    }
    const auto jit = jobs_.find(b.job);
    std::string why = "no model \"" + b.checkpoint + "\" of " + b.job + " is kept";
    if (jit == jobs_.end() && (!models_ || models_->list(b.job).empty())) why = "no job \"" + b.job + "\"";
    if (jit != jobs_.end() && !jit->second.terminal()) why += " (the job is " + std::string(to_string(jit->second.state())) + ")";
    if (jit != jobs_.end() && !jit->second.model.error.empty()) why += ": " + jit->second.model.error;
    throw wire::Refused(wire::error_code::kNotFound, why, "job");
  }
  const auto f = std::find_if(m->files.begin(), m->files.end(), [&](const ModelFileInfo& x) { return x.name == b.file; });
  if (f == m->files.end()) {
    throw wire::Refused(wire::error_code::kNotFound,
                        "the model of " + b.job + " has no " + b.file + " (a built-in model has no model.pt)", "file");
  }
  try {
    const auto w = read_file_window(models_->file_path(b.job, b.checkpoint, b.file), b.offset, b.max_bytes);
    wire::ModelFileChunkBody c;
    c.job = b.job;
    c.file = b.file;
    c.offset = w.offset;
    c.size = w.size;
    c.sha256 = f->sha256;
    c.data = base64_encode(w.bytes);
    return c.to_json();
  } catch (const std::exception& e) {
    throw wire::Refused(wire::error_code::kInternal, e.what(), "file");
  }
}

json ModelCollection::on_model_upload(const wire::ModelUploadBody& b) {
  if (!uploads_) {
    throw wire::Refused(wire::error_code::kUnavailable,
                        "the leader has no state directory to keep uploaded model files in", "sha256");
  }
  // The files of the jobs that may still start a worker stay, whatever the retention.
  std::set<std::string> keep;
  for (const auto& [id, j] : jobs_) {
    if (j.terminal()) continue;
    if (!j.spec.model_sha256.empty()) keep.insert(j.spec.model_sha256);
    if (!j.spec.init_sha256.empty()) keep.insert(j.spec.init_sha256);
  }
  try {
    wire::ModelUploadState st;
    st.offset = uploads_->put(b.sha256, b.size, b.offset, base64_decode(b.data), keep);
    st.stored = st.offset == b.size;
    if (st.stored && !b.data.empty()) inventory_changed();
    if (st.stored && !b.data.empty()) spdlog::info("model file {} uploaded ({} bytes)", b.sha256, b.size);
    return st.to_json();
  } catch (const ProtocolError& e) {
    throw wire::Refused(wire::error_code::kBadRequest, e.what(), "data");
  } catch (const std::exception& e) {
    throw wire::Refused(wire::error_code::kInternal, e.what(), "data");
  }
}

std::optional<std::string> ModelCollection::uploaded(const std::string& sha256) const {
  return uploads_ ? uploads_->find(sha256) : std::nullopt;
}

void ModelCollection::resolve_init_from(const wire::SubmitBody& b, JobSpec& spec) {
  const auto fail = [&](const std::string& why) {
    return wire::Refused(wire::error_code::kInvalidJob, "init_from: " + why, "init_from");
  };
  if (!uploads_ || !models_) throw fail("the leader has no state directory: it keeps no models to start from");
  if (b.init_sha256) {
    if (!uploads_->find(*b.init_sha256)) {
      throw fail("the leader has no uploaded state_dict " + *b.init_sha256 + " (dltrain submit uploads it first)");
    }
    spec.init_sha256 = *b.init_sha256;
    return;
  }
  const auto m = models_->find(spec.init_from, "last");
  if (!m) {
    throw fail("\"" + spec.init_from + "\" is neither a job whose model the leader keeps (`dltrain models` lists "
               "them) nor a model directory where the job was submitted");
  }
  if (m->model != enum_name(spec.model)) {
    throw fail(spec.init_from + " trained model \"" + m->model + "\"; this job trains \"" +
               std::string(enum_name(spec.model)) + "\"");
  }
  const auto f = std::find_if(m->files.begin(), m->files.end(), [](const ModelFileInfo& x) { return x.name == "state_dict.pt"; });
  if (f == m->files.end()) throw fail("the model of " + spec.init_from + " has no state_dict.pt");
  try {
    uploads_->adopt(models_->file_path(m->job, m->checkpoint, "state_dict.pt"), f->sha256);
    inventory_changed();
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  spec.init_sha256 = f->sha256;
}

// `dltrain resume JOB`: the job's configuration (as planned, so that the schedule and the
// data shards are the ones the checkpoint was trained with), its latest epoch checkpoint's
// state_dict as init_from, and its workers starting at that checkpoint's epoch
// (leader.cpp, launch), where the learning-rate schedule and each epoch's data order
// follow from the epoch (train/trainer.cpp). A resumed job cancelled before it wrote a
// checkpoint of its own resumes from the one it started from.
JobRec ModelCollection::resume_job(const wire::ResumeBody& b,
                                   const std::function<std::optional<std::string>(const JobSpec&)>& ps_memory_problem) {
  const auto refuse = [&](const char* code, const std::string& why) { return wire::Refused(code, "resume: " + why, "job"); };
  if (!models_ || !uploads_) {
    throw refuse(wire::error_code::kConflict, "the leader has no state directory: it keeps no checkpoints");
  }
  if (collecting_.count(b.job)) {
    throw refuse(wire::error_code::kUnavailable, "the latest checkpoint of " + b.job + " is being collected from agent " +
                                                      collecting_.at(b.job).agent + "; try again in a moment");
  }
  // A job whose last model the leader keeps succeeded, whether or not it still keeps the
  // job itself.
  if (models_->find(b.job, "last")) {
    throw refuse(wire::error_code::kConflict, b.job + " succeeded: nothing is left to train (init_from = \"" + b.job +
                                                   "\" starts a new job from its model)");
  }
  const auto jit = jobs_.find(b.job);
  if (jit != jobs_.end()) {
    const JobRec& j = jit->second;
    if (!j.explore.profile_of.empty()) throw refuse(wire::error_code::kConflict, b.job + " is an exploration run of " + j.explore.profile_of);
    if (!j.terminal()) {
      throw refuse(wire::error_code::kConflict, b.job + " is " + std::string(to_string(j.state())) +
                                                     ": resume continues a failed or cancelled job (dltrain cancel " +
                                                     b.job + " first)");
    }
    if (j.state() == JobState::kSucceeded) {
      throw refuse(wire::error_code::kConflict, b.job + " succeeded: nothing is left to train (init_from = \"" + b.job +
                                                     "\" starts a new job from its model)");
    }
  }
  // The latest epoch checkpoint of the job, else of the job it resumed, and so on.
  std::optional<ModelManifest> from;
  std::string origin = b.job;
  for (int hop = 0; hop < 16 && !from; ++hop) {
    for (const auto& m : models_->list(origin)) {
      if (checkpoint_epoch(m.checkpoint) > (from ? checkpoint_epoch(from->checkpoint) : 0)) from = m;
    }
    const auto oj = jobs_.find(origin);
    if (from || oj == jobs_.end() || oj->second.resume.from.empty()) break;
    origin = oj->second.resume.from;
  }
  if (!from) {
    if (jit == jobs_.end() && models_->list(b.job).empty()) throw refuse(wire::error_code::kNotFound, "no job \"" + b.job + "\"");
    std::string why = "the leader keeps no epoch checkpoint of " + b.job +
                      ": a job leaves one to resume from when its job file asks for [checkpoint] every_epochs = N and "
                      "it finished N epochs";
    if (jit != jobs_.end() && !jit->second.model.error.empty()) why += " (" + jit->second.model.error + ")";
    throw refuse(wire::error_code::kNotFound, why);
  }
  JobRec j;
  try {
    // The job as it ran; the checkpoint's metadata holds it when the leader no longer does.
    if (const auto oj = jobs_.find(from->job); oj != jobs_.end()) {
      j.spec = oj->second.spec;
    } else {
      std::ifstream in(models_->file_path(from->job, from->checkpoint, "metadata.json"));
      j.spec = job_from_json(json::parse(in).at("job"));
    }
  } catch (const std::exception& e) {
    throw refuse(wire::error_code::kInternal, "the configuration of " + from->job + " cannot be read: " + e.what());
  }
  // The checkpoint is of the shards and partitions the job ran with.
  j.spec.workers_auto = j.spec.batch_auto = j.spec.ps_shards_auto = j.spec.partition_size_auto = false;
  // As a submit is: a PS shard that fits no agent now is refused now.
  if (auto why = ps_memory_problem(j.spec)) throw refuse(wire::error_code::kInvalidJob, *why);
  j.resume.epoch = checkpoint_epoch(from->checkpoint);
  j.resume.checkpoint = from->checkpoint;
  j.resume.from = from->job;
  if (j.resume.epoch >= j.spec.epochs) {
    throw refuse(wire::error_code::kConflict, from->job + "'s checkpoint " + from->checkpoint + " is of its last epoch: nothing is left to train");
  }
  // Its files: the checkpoint's state_dict to start from and, for a TorchScript model, its
  // model.pt (the network itself, its values those of the state_dict), kept as uploads_.
  const auto file_of = [&](const std::string& name) -> std::optional<ModelFileInfo> {
    const auto f = std::find_if(from->files.begin(), from->files.end(), [&](const ModelFileInfo& x) { return x.name == name; });
    if (f == from->files.end()) return std::nullopt;
    return *f;
  };
  try {
    const auto sd = file_of("state_dict.pt");
    if (!sd) throw refuse(wire::error_code::kNotFound, from->job + "'s checkpoint " + from->checkpoint + " has no state_dict.pt");
    uploads_->adopt(models_->file_path(from->job, from->checkpoint, sd->name), sd->sha256);
    j.spec.init_sha256 = sd->sha256;
    j.spec.init_from = from->job;
    if (j.spec.model == ModelKind::kTorchScript) {
      const auto pt = file_of("model.pt");
      if (!pt) throw refuse(wire::error_code::kNotFound, from->job + "'s checkpoint " + from->checkpoint + " has no model.pt");
      uploads_->adopt(models_->file_path(from->job, from->checkpoint, pt->name), pt->sha256);
      j.spec.model_sha256 = pt->sha256;
    }
    inventory_changed();
  } catch (const wire::Refused&) {
    throw;
  } catch (const std::exception& e) {
    throw refuse(wire::error_code::kInternal, e.what());
  }
  return j;
}

json ModelCollection::on_model_download(const wire::ModelDownloadBody& b) const {
  const auto path = uploaded(b.sha256);
  if (!path) {
    throw wire::Refused(wire::error_code::kNotFound, "the leader has no uploaded model file " + b.sha256, "sha256");
  }
  try {
    const auto w = read_file_window(*path, b.offset, b.max_bytes);
    wire::ModelFileChunkBody c;
    c.file = "model_file";
    c.offset = w.offset;
    c.size = w.size;
    c.sha256 = b.sha256;
    c.data = base64_encode(w.bytes);
    return c.to_json();
  } catch (const std::exception& e) {
    throw wire::Refused(wire::error_code::kInternal, e.what(), "sha256");
  }
}

}  // namespace dltrain::leader
