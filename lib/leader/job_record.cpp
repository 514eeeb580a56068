#include "leader/job_record.h"

#include "data/shards.h"

#include "common/compression_spec.h"
#include "common/errors.h"

namespace dltrain::leader {

using json = nlohmann::json;

namespace {

std::uint64_t sum(const std::map<int, std::uint64_t>& m) {
  std::uint64_t s = 0;
  for (const auto& [k, v] : m) s += v;
  return s;
}

wire::events::Traffic total(const std::map<int, wire::events::Traffic>& m) {
  wire::events::Traffic t;
  for (const auto& [r, x] : m) {
    t.up += x.up;
    t.down += x.down;
    t.dense_up += x.dense_up;
    t.dense_down += x.dense_down;
  }
  return t;
}

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double JobRec::wall_seconds() const {
  if (fixed_wall >= 0) return fixed_wall;
  return std::chrono::duration<double>((ended ? *ended : Clock::now()) - submitted).count();
}

std::uint64_t JobRec::bytes_pushed() const { return bytes.pushed_before + sum(bytes.pushed); }
std::uint64_t JobRec::bytes_pulled() const { return bytes.pulled_before + sum(bytes.pulled); }

void JobRec::close_generation_bytes() {
  bytes.pushed_before += sum(bytes.pushed);
  bytes.pulled_before += sum(bytes.pulled);
  bytes.pushed.clear();
  bytes.pulled.clear();
}

std::optional<double> JobRec::progress() const {
  double done = 0, total = 0;
  for (const auto& t : tasks) {
    if (t.kind != TaskKind::kWorker || t.steps_per_epoch <= 0) continue;
    const double steps = static_cast<double>(t.steps_per_epoch) * spec.epochs;
    total += steps;
    done += std::min(static_cast<double>(t.global_step), steps);
  }
  if (total <= 0) return std::nullopt;
  return done / total;
}

std::optional<double> JobRec::eta_seconds() const {
  const auto p = progress();
  const auto& base = eta_base;
  if (state() != JobState::kRunning || !p || !base.training_since || *p <= base.progress_at_training_since) {
    return std::nullopt;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - *base.training_since).count();
  return elapsed * (1 - *p) / (*p - base.progress_at_training_since);
}

TaskRec* JobRec::find_task(const std::string& name) {
  for (auto& t : tasks) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void mark_stragglers(JobRec& j, double factor) {
  // An elastic job's workers claim their chunks as they go, so a slow one takes fewer
  // and holds nobody up; one that joined late has fewer steps without being slow.
  if (j.spec.elastic.on()) factor = 0;
  std::int64_t lead = 0;
  for (const auto& t : j.tasks) {
    if (t.kind == TaskKind::kWorker) lead = std::max(lead, t.global_step);
  }
  for (auto& t : j.tasks) {
    if (t.kind != TaskKind::kWorker) continue;
    t.straggler = factor > 0 && t.state == TaskState::kRunning && lead >= kMinStepsForStragglers &&
                  static_cast<double>(t.global_step) * factor < static_cast<double>(lead);
  }
}

std::string QueueStatus::cache_note() const {
  if (cache_agents < 0 || fits_cluster || cache_agents == agents) return {};
  return "; its workers read a sharded data set and go only to agents with a shard cache (cache_bytes > 0): " +
         std::to_string(cache_agents) + " of the " + std::to_string(agents) + " agents have one";
}

wire::events::Summary summary(const JobRec& j) {
  wire::events::Summary s;
  s.job = j.id;
  s.name = j.spec.name;
  s.state = std::string(to_string(j.state()));
  if (j.test_accuracy >= 0) s.test_accuracy = j.test_accuracy;
  s.epochs = j.epochs_done;
  s.wall_seconds = j.wall_seconds();
  s.bytes_pushed = j.bytes_pushed();
  s.bytes_pulled = j.bytes_pulled();
  for (const auto& [r, v] : j.figures.images_per_sec) s.images_per_sec += v;
  if (!j.figures.skipped_images.empty()) {
    s.skipped_images = 0;
    for (const auto& [r, v] : j.figures.skipped_images) *s.skipped_images += v;
  }
  s.compression = enum_name(j.spec.compression.method);
  if (!j.figures.traffic.empty()) {
    s.set_ratios(total(j.figures.traffic), false);
    s.set_ratios(total(j.figures.traffic_after_warmup), true);
  }
  if (!j.error.empty()) s.error = j.error;
  s.failure = j.failure;
  if (!j.model.checkpoint.empty()) s.model_checkpoint = j.model.checkpoint;
  if (!j.model.error.empty()) s.model_error = j.model.error;
  return s;
}

json job_json(const JobRec& j, const std::optional<QueueStatus>& queue) {
  json tasks = json::array();
  for (const auto& t : j.tasks) {
    json tj{{"task", t.name}, {"agent", t.agent}, {"state", to_string(t.state)}};
    if (t.port) tj["endpoint"] = t.address + ":" + std::to_string(t.port);
    if (!t.exit.empty()) tj["exit"] = t.exit;
    if (!t.last_error.empty()) tj["error"] = t.last_error;
    if (t.restarts > 0) tj["restarts"] = t.restarts;
    if (!t.recovery.empty()) tj["recovery"] = t.recovery;
    if (t.resyncs > 0) tj["resyncs"] = t.resyncs;
    if (t.straggler) tj["straggler"] = true;
    if (!t.gpus.empty()) tj["gpus"] = t.gpus;
    // A worker's own progress: its latest report's global step of its shard's steps in
    // all epochs, and the epochs it finished (worker 0's are the job's "epochs").
    if (t.kind == TaskKind::kWorker && t.steps_per_epoch > 0) {
      tj["step"] = t.global_step;
      tj["steps_total"] = t.steps_per_epoch * j.spec.epochs;
    }
    if (t.kind == TaskKind::kWorker && t.epochs_done > 0) tj["epochs"] = t.epochs_done;
    if (t.leaving) tj["leaving"] = true;
    tasks.push_back(tj);
  }
  json out = summary(j).to_json();
  out.erase("event");
  out["model"] = std::string(enum_name(j.spec.model));
  out["dataset"] = std::string(enum_name(j.spec.dataset));
  out["workers"] = j.spec.workers;
  if (j.spec.elastic.on()) {
    out["elastic"] = {{"min_workers", j.spec.elastic.min_workers}, {"max_workers", j.spec.elastic.max_workers}};
    if (!j.share.empty()) out["share"] = j.share;
  }
  out["ps_shards"] = j.spec.ps_shards;
  // ps_shards = "auto" until the job starts: ps_shards is then the least it will have.
  if (j.spec.ps_shards_auto) out["ps_shards_auto"] = true;
  out["batch_size"] = j.spec.batch_size;
  out["epochs_total"] = j.spec.epochs;
  out["device"] = std::string(enum_name(j.spec.device));
  if (j.spec.gpus_per_worker > 0) out["gpus_per_worker"] = j.spec.gpus_per_worker;
  out["local_group"] = j.spec.local_group;
  out["compression_settings"] = {{"method", std::string(enum_name(j.spec.compression.method))},
                                 {"ratio", j.spec.compression.ratio},
                                 {"downlink_ratio", j.spec.compression.downlink_ratio},
                                 {"warmup_epochs", j.spec.compression.warmup_epochs},
                                 {"warmup_schedule", std::string(enum_name(j.spec.compression.warmup_schedule))}};
  out["submitted_at"] = j.submitted_unix;
  out["owner"] = j.owner;
  if (!j.resume.from.empty()) {
    out["resumed_from"] = j.resume.from;
    out["resume_checkpoint"] = j.resume.checkpoint;
    out["resume_epoch"] = j.resume.epoch;
  }
  out["generation"] = j.generation;
  out["reassignments"] = j.recovery.reassignments;
  if (!j.recovery.reason.empty()) out["recovery_reason"] = j.recovery.reason;
  if (j.state() == JobState::kRecovering && j.recovery.since) {
    out["recovering_seconds"] = std::chrono::duration<double>(JobRec::Clock::now() - *j.recovery.since).count();
  }
  out["tasks"] = tasks;
  if (const auto p = j.progress()) out["progress"] = j.terminal() && j.state() == JobState::kSucceeded ? 1.0 : *p;
  if (const auto eta = j.eta_seconds()) out["eta_seconds"] = *eta;
  if (!j.explore.plan.is_null()) out["plan"] = j.explore.plan;
  if (!j.explore.profile_of.empty()) out["profile_of"] = j.explore.profile_of;
  if (!j.explore.pending_profiles.empty()) out["exploring_with"] = j.explore.pending_profiles;
  if (queue) {
    out["queue_position"] = queue->position;
    out["cores_needed"] = queue->cores_needed;
    out["cores_free"] = queue->cores_free;
    out["fits_cluster"] = queue->fits_cluster;
    out["cores_total"] = queue->cores_total;
    if (queue->gpus_needed > 0) {
      out["gpus_needed"] = queue->gpus_needed;
      out["gpus_free"] = queue->gpus_free;
      out["gpus_total"] = queue->gpus_total;
    }
  }
  return out;
}

// The secret is dropped once the job has ended (nobody needs it any more).
json stored_record(const JobRec& j) {
  json r = job_json(j, std::nullopt);
  r["spec"] = j.spec;
  r["num"] = j.num;
  r["generation"] = j.generation;
  if (!j.terminal() && !j.secret.empty()) r["secret"] = j.secret;
  if (!j.explore.profile_of.empty()) r["profile_of"] = j.explore.profile_of;
  if (j.explore.rounds > 0) r["explore_rounds"] = j.explore.rounds;
  if (!j.terminal()) {
    json tasks = json::array();
    for (const auto& t : j.tasks) tasks.push_back(t.to_json());
    r["task_records"] = tasks;
    r["failing_state"] = j.life.target() ? std::string(to_string(*j.life.target())) : std::string();
    r["workers_started"] = j.workers_started;
    r["recovery_reason"] = j.recovery.reason;
    r["seed"] = j.recovery.seed;
    r["seed_generation"] = j.recovery.seed_generation;
    // Byte counts: earlier generations' totals, and each worker's cumulative count in this
    // one (what its next events continue from).
    r["bytes_before"] = {{"pushed", j.bytes.pushed_before}, {"pulled", j.bytes.pulled_before}};
    r["last_bytes"] = j.bytes.last_bytes;
    json by_rank = json::object();
    for (const auto& [rank, v] : j.bytes.pushed) {
      by_rank[std::to_string(rank)] = {v, j.bytes.pulled.count(rank) ? j.bytes.pulled.at(rank) : 0};
    }
    r["bytes_by_rank"] = by_rank;
  }
  return r;
}

JobRec job_from_record(std::uint64_t num, const json& r) {
  JobRec j;
  j.num = num;
  j.id = "job-" + std::to_string(num);
  j.spec = job_from_json(r.at("spec"));
  const std::string state = r.value("state", "failed");
  const auto parsed = parse_job_state(state);
  if (!parsed) throw ConfigError("state", "stored job " + j.id + ": unknown state \"" + state + "\"");
  j.life = JobLifecycle::restored(*parsed, std::nullopt);
  const auto acc = r.find("test_accuracy");
  j.test_accuracy = acc != r.end() && acc->is_number() ? acc->get<double>() : -1.0;
  j.epochs_done = r.value("epochs", 0);
  j.submitted_unix = r.value("submitted_at", 0.0);
  j.owner = r.value("owner", std::string("admin"));
  j.fixed_wall = r.value("wall_seconds", 0.0);
  j.error = r.value("error", "");
  if (r.contains("failure") && r["failure"].is_object()) j.failure = wire::events::Failure::from_json(r["failure"]);
  j.explore.profile_of = r.value("profile_of", "");
  j.explore.rounds = r.value("explore_rounds", 0);
  j.resume.from = r.value("resumed_from", "");
  j.resume.checkpoint = r.value("resume_checkpoint", "");
  j.resume.epoch = r.value("resume_epoch", 0);
  // Both absent from records written before jobs had secrets.
  j.generation = r.value("generation", 1u);
  j.secret = r.value("secret", "");
  if (r.contains("plan")) j.explore.plan = r["plan"];
  j.bytes.pushed_before = r.value("bytes_pushed", std::uint64_t{0});
  j.bytes.pulled_before = r.value("bytes_pulled", std::uint64_t{0});
  return j;
}

void resume_stored_counters(JobRec& j, const json& r) {
  j.fixed_wall = -1;
  j.submitted = JobRec::Clock::now() - std::chrono::duration_cast<JobRec::Clock::duration>(
                                           std::chrono::duration<double>(std::max(0.0, unix_now() - j.submitted_unix)));
  const std::string failing = r.value("failing_state", "");
  std::optional<JobState> target;
  if (!failing.empty()) {
    const auto f = parse_job_state(failing);
    if (!f || !terminal(*f)) {
      throw ConfigError("failing_state",
                        "stored job " + j.id + ": failing_state \"" + failing + "\" is not a terminal state");
    }
    target = *f;
  }
  j.life = JobLifecycle::restored(j.state(), target);
  j.workers_started = r.value("workers_started", false);
  j.recovery.reason = r.value("recovery_reason", "");
  j.recovery.seed = r.value("seed", "");
  j.recovery.seed_generation = r.value("seed_generation", 0u);
  j.recovery.reassignments = r.value("reassignments", 0);
  if (r.contains("bytes_before")) {
    j.bytes.pushed_before = r["bytes_before"].value("pushed", std::uint64_t{0});
    j.bytes.pulled_before = r["bytes_before"].value("pulled", std::uint64_t{0});
    j.bytes.last_bytes = r.value("last_bytes", 0.0);
    const json by_rank = r.value("bytes_by_rank", json::object());
    for (const auto& [rank, v] : by_rank.items()) {
      j.bytes.pushed[std::stoi(rank)] = v.at(0).get<std::uint64_t>();
      j.bytes.pulled[std::stoi(rank)] = v.at(1).get<std::uint64_t>();
    }
  }
  if (r.contains("task_records")) {
    for (const auto& tr : r.at("task_records")) {
      for (const char* k : {"name", "kind", "index", "agent"}) {
        if (!tr.contains(k)) throw ProtocolError(std::string("a stored task record has no \"") + k + "\"");
      }
      TaskRec t = TaskRec::from_json(tr);
      if (!tr.contains("state")) t.state = TaskState::kExited;
      j.tasks.push_back(std::move(t));
    }
  }
  // Tasks hold cores again only when their agent re-reports them; one the leader had not
  // started yet never will be in this form.
  for (auto& t : j.tasks) {
    if (t.state == TaskState::kPending) {
      t.state = TaskState::kExited;
      t.exit = "never started";
    }
  }
}

std::map<std::string, std::int64_t> JobRec::cached_for(
    int rank, const std::map<std::string, const std::set<std::string>*>& cached) const {
  std::map<std::string, std::int64_t> out;
  if (data_shards.empty() || rank < 0 || rank >= spec.workers) return out;
  std::vector<std::int64_t> counts;
  for (const auto& s : data_shards) counts.push_back(s.samples);
  const auto slices = data::deal_shards(counts, rank, spec.workers, static_cast<std::uint64_t>(spec.seed), 0);
  for (const auto& [agent, held] : cached) {
    std::int64_t bytes = 0;
    for (const auto& sl : slices) {
      const auto& s = data_shards[static_cast<std::size_t>(sl.shard)];
      if (held == nullptr || held->count(s.sha256)) bytes += s.bytes;
    }
    if (bytes > 0 || held == nullptr) out[agent] = bytes;
  }
  return out;
}

}  // namespace dltrain::leader
