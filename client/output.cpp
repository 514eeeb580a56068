#include "output.h"

#include <ctime>
#include <iomanip>
#include <optional>
#include <sstream>

#include "common/json_fields.h"
#include "wire/leader_events.h"
#include "wire/task_events.h"

namespace dltrain::client {

using json = nlohmann::json;

std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
  return os.str();
}

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

namespace {

namespace events = wire::events;

void print_progress(std::ostream& out, const events::Progress& e, const std::string& job, const std::string& task) {
  out << job << " [" << task << "] epoch " << e.epoch << " step " << e.step << "/" << e.steps_per_epoch << "  loss "
      << fmt(e.loss, 4) << "  lr " << fmt(e.lr, 4) << "  " << fmt(e.images_per_sec, 0) << " img/s  pushed "
      << human_bytes(static_cast<double>(e.bytes_pushed)) << "  pulled "
      << human_bytes(static_cast<double>(e.bytes_pulled));
  if (e.density < 1.0) out << "  density " << e.density;
  if (e.compression_ratio && *e.compression_ratio > 1.05) out << "  compression " << fmt(*e.compression_ratio, 1) << "x";
  if (e.data_wait_fraction) out << "  data wait " << fmt(100.0 * *e.data_wait_fraction, 1) << "%";
  if (e.skipped_images && *e.skipped_images > 0) out << "  skipped images " << *e.skipped_images;
  out << std::endl;
}

std::string channel_values(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt(v[i], 4);
  return s + "]";
}

void print_data_info(std::ostream& out, const events::DataInfo& d, const std::string& who) {
  out << who << d.dataset << ": " << d.classes << " classes, " << d.train_images << " training images";
  if (d.test_images > 0) out << ", " << d.test_images << " test images";
  out << ", " << d.channels << "x" << d.image_size << "x" << d.image_size << " inputs, mean " << channel_values(d.mean)
      << " std " << channel_values(d.std) << " ("
      << (d.normalization == "sample" ? "computed on " + std::to_string(d.sample_images.value_or(0)) + " images"
                                      : d.normalization)
      << ")";
  if (d.loader_threads) out << ", " << *d.loader_threads << " loader threads";
  out << std::endl;
}

void print_restarting(std::ostream& out, const events::Restarting& e, const std::string& job,
                      const std::string& task) {
  out << job << " [" << task << "] " << e.reason
      << (e.last_error.empty() ? "" : " (" + e.last_error + ")") << "; restart " << e.attempt.value_or(0) << " of "
      << e.max_restarts;
  if (e.kind == "ps") {
    out << " on port " << e.port.value_or(0) << ", from its latest checkpoint" << std::endl;
  } else {
    out << ", resuming after epoch " << e.resume_epoch.value_or(0) << std::endl;
  }
}

void print_reassigned(std::ostream& out, const events::Reassigned& e, const std::string& job) {
  out << job << ": re-assigned as generation " << e.generation;
  for (const auto& m : e.moved) out << "; " << m.task << " " << m.from << " -> " << m.to;
  if (e.replica_from) out << "; lost shard state rebuilt from " << *e.replica_from << "'s replica";
  out << std::endl;
}

void print_epoch_end(std::ostream& out, const events::EpochEnd& e, const std::string& job, const std::string& task) {
  out << job << " [" << task << "] epoch " << e.epoch << "/" << e.epochs << " done in " << fmt(e.epoch_seconds, 1)
      << " s  train loss " << fmt(e.train_loss, 4) << "  " << fmt(e.images_per_sec, 0) << " img/s";
  if (e.test_accuracy) out << "  test accuracy " << fmt(*e.test_accuracy, 4);
  if (e.data_wait_seconds && e.epoch_seconds > 0) {
    out << "  data wait " << fmt(100.0 * *e.data_wait_seconds / e.epoch_seconds, 1) << "%";
  }
  out << std::endl;
}

// A ratio's figure ("12.3"); one that is null or absent (nothing was sent that way)
// prints as 0.0.
std::string ratio(const std::optional<json_fields::Nullable<double>>& r) {
  return fmt(r && *r ? **r : 0.0, 1);
}

// Which task failed a job first, where, how, and the end of its log.
void print_failure(std::ostream& out, const events::Failure& f) {
  out << "\n  failed first: " << f.task << " on agent " << f.agent << ", cause " << f.cause;
  if (f.signal) out << " (signal " << *f.signal << ")";
  if (f.exit_code) out << " (exit code " << *f.exit_code << ")";
  if (!f.last_lines.empty()) {
    out << "\n  last lines of its log:";
    for (const auto& l : f.last_lines) out << "\n    " << l;
  }
}

void print_summary(std::ostream& out, const events::Summary& e, const std::string& job) {
  out << job << " " << e.state << ": test accuracy " << (e.test_accuracy ? fmt(*e.test_accuracy, 4) : std::string("n/a"))
      << ", " << e.epochs << " epochs, " << fmt(e.wall_seconds, 1) << " s, pushed "
      << human_bytes(static_cast<double>(e.bytes_pushed)) << ", pulled "
      << human_bytes(static_cast<double>(e.bytes_pulled)) << ", " << fmt(e.images_per_sec, 0)
      << " img/s (last epoch, all workers)";
  if (e.compression != "none" && e.compression_ratio && *e.compression_ratio) {
    out << "\n  " << e.compression << ": " << ratio(e.compression_ratio) << "x fewer bytes than dense (up "
        << ratio(e.compression_ratio_up) << "x, down " << ratio(e.compression_ratio_down) << "x)";
    if (e.compression_ratio_after_warmup && *e.compression_ratio_after_warmup) {
      out << "; after warm-up " << ratio(e.compression_ratio_after_warmup) << "x (up "
          << ratio(e.compression_ratio_up_after_warmup) << "x, down " << ratio(e.compression_ratio_down_after_warmup)
          << "x)";
    }
  }
  if (e.skipped_images && *e.skipped_images > 0) out << "\n  skipped " << *e.skipped_images << " unreadable images";
  if (e.error) out << "\n  error: " << *e.error;
  if (e.failure) print_failure(out, *e.failure);
  if (e.model_checkpoint && *e.model_checkpoint == "last") {
    out << "\n  trained model kept by the leader: dltrain model get " << job << " -o DIR";
  } else if (e.model_checkpoint) {
    // A failed or cancelled job's latest epoch checkpoint ("epoch-4").
    const std::string& cp = *e.model_checkpoint;
    out << "\n  checkpoint " << cp << " kept by the leader: dltrain resume " << job
        << " continues from it; dltrain model get " << job << " --checkpoint "
        << (cp.rfind("epoch-", 0) == 0 ? cp.substr(6) : cp) << " -o DIR downloads it";
  }
  if (e.model_error) out << "\n  " << (e.model_checkpoint ? "not every checkpoint kept: " : "no trained model kept: ") << *e.model_error;
  out << std::endl;
}

void print_worker_event(std::ostream& out, const std::string& kind, const json& e, const std::string& job,
                        const std::string& task) {
  const std::string who = job + " [" + task + "] ";
  if (kind == events::Progress::kKind) {
    print_progress(out, events::Progress::from_json(e), job, task);
  } else if (kind == events::PsResync::kKind) {
    const auto r = events::PsResync::from_json(e);
    out << who << "lost PS shard " << r.shard << " (" << r.reason << "); reconnected and resynced in "
        << fmt(r.seconds, 1) << " s" << std::endl;
  } else if (kind == events::WorkerStopped::kKind && e.contains("replica")) {
    const auto r = events::WorkerStopped::from_json(e).replica;
    out << who << "stopped"
        << (r && r->steps ? " and saved its replica at step " + std::to_string(*r->steps) : std::string())
        << std::endl;
  } else if (kind == events::ReplicaLoaded::kKind) {
    out << who << "initialises the PS shards from its replica of step " << events::ReplicaLoaded::from_json(e).steps
        << std::endl;
  } else if (kind == events::SkippedStep::kKind) {
    const auto k = events::SkippedStep::from_json(e);
    out << who << "skipped epoch " << k.epoch << " step " << k.step << ": NaN/Inf loss or gradient ("
        << k.skipped_steps << " skipped so far)" << std::endl;
  } else if (kind == events::DataInfo::kKind) {
    print_data_info(out, events::DataInfo::from_json(e), who);
  } else if (kind == events::SkippedImage::kKind) {
    out << who << "skipped an unreadable image: " << events::SkippedImage::from_json(e).message << std::endl;
  } else if (kind == events::EpochEnd::kKind) {
    print_epoch_end(out, events::EpochEnd::from_json(e), job, task);
  } else if (kind == events::Started::kKind) {
    const auto st = events::Started::from_json(e);
    out << who << "started: " << st.train_examples << " training examples, " << st.parameters << " parameters in "
        << st.partitions << " partitions" << std::endl;
  } else if (kind == events::TaskError::kKind) {
    out << who << "error: " << events::TaskError::from_json(e).message << std::endl;
  }
}

}  // namespace

void print_event(std::ostream& out, const json& e) {
  const std::string kind = events::kind_of(e);
  const std::string job = e.value("job", "");
  const std::string task = e.value("task", "");
  if (kind == events::StateChanged::kKind) {
    out << job << ": " << events::StateChanged::from_json(e).state << std::endl;
  } else if (kind == events::Restarting::kKind) {
    print_restarting(out, events::Restarting::from_json(e), job, task);
  } else if (kind == events::PsRecovered::kKind) {
    const auto r = events::PsRecovered::from_json(e);
    out << job << " [" << task << "] listens again on " << r.endpoint << ": " << r.recovery << std::endl;
  } else if (kind == events::Recovering::kKind) {
    out << job << ": " << events::Recovering::from_json(e).reason << "; stopping its tasks to re-assign it"
        << std::endl;
  } else if (kind == events::Resized::kKind) {
    const auto r = events::Resized::from_json(e);
    out << job << ": resized from " << r.from << " to " << r.to << " workers (" << r.by << ")";
    for (const auto& s : r.started) out << "; started " << s;
    if (!r.leaving.empty()) out << "; leaving after their step:";
    for (const auto& l : r.leaving) out << " " << l;
    out << std::endl;
  } else if (kind == events::Left::kKind) {
    const auto l = events::Left::from_json(e);
    out << job << " [" << task << "] left after " << l.steps << " steps; " << l.members << " workers still train"
        << std::endl;
  } else if (kind == events::Waiting::kKind) {
    const auto w = events::Waiting::from_json(e);
    out << job << ": waiting: position " << w.position << " in the queue, needs " << w.cores_needed << " cores, "
        << w.cores_free << " free, " << w.cores_total << " in the cluster";
    if (w.gpus_needed) {
      out << "; needs " << *w.gpus_needed << " GPUs, " << w.gpus_free.value_or(0) << " free, "
          << w.gpus_total.value_or(0) << " in the cluster";
    }
    if (!w.fits_cluster) out << "; more than the whole cluster has, it waits for agents to join";
    if (w.quota) out << "; " << *w.quota;
    if (w.queue_timeout_seconds) out << "; fails after " << fmt(*w.queue_timeout_seconds, 0) << " s (queue_timeout)";
    out << std::endl;
  } else if (kind == events::WaitingForAgent::kKind) {
    const auto w = events::WaitingForAgent::from_json(e);
    out << job << ": no agent has free cores for " << json(w.tasks).dump() << "; waiting up to "
        << fmt(static_cast<double>(w.timeout_ms) / 1000.0, 0) << " s for one" << std::endl;
  } else if (kind == events::Reassigned::kKind) {
    print_reassigned(out, events::Reassigned::from_json(e), job);
  } else if (kind == events::ShardsSpread::kKind) {
    const auto s = events::ShardsSpread::from_json(e);
    out << job << ": " << s.ps_shards << " PS shard" << (s.ps_shards == 1 ? "" : "s") << " on "
        << json(s.agents).dump();
    if (s.partition_size) out << ", partitions of at most " << *s.partition_size << " floats";
    out << std::endl;
  } else if (kind == events::DataPlaced::kKind) {
    const auto d = events::DataPlaced::from_json(e);
    out << job << ": workers placed by where their shards are cached:";
    for (std::size_t i = 0; i < d.agents.size(); ++i) {
      out << (i ? "," : "") << " worker-" << i << " on " << d.agents[i] << " ("
          << fmt(100 * (i < d.cached_fraction.size() ? d.cached_fraction[i] : 0.0), 0) << "% of its shards cached)";
    }
    out << std::endl;
  } else if (kind == events::PlanDecided::kKind) {
    out << job << " planner: " << events::PlanDecided::from_json(e).plan.value("explanation", "") << std::endl;
  } else if (kind == events::Summary::kKind) {
    print_summary(out, events::Summary::from_json(e), job);
  } else {
    print_worker_event(out, kind, e, job, task);
  }
}

void print_job_line(std::ostream& out, const json& j) {
  out << std::left << std::setw(9) << j.value("job", "") << std::setw(11) << j.value("state", "") << std::setw(22)
      << j.value("name", "").substr(0, 21) << std::setw(6) << j.value("model", "") << std::right << std::setw(3)
      << j.value("workers", 0) << "w" << std::setw(3)
      << (j.value("ps_shards_auto", false) ? std::string("a") : std::to_string(j.value("ps_shards", 0))) << "ps  epoch "
      << j.value("epochs", 0) << "/" << j.value("epochs_total", 0) << "  acc "
      << (j["test_accuracy"].is_number() ? fmt(j["test_accuracy"].get<double>(), 4) : std::string("  -   ")) << "  "
      << fmt(j.value("wall_seconds", 0.0), 0) << " s";
  // Another user's than the admin's (docs/operations.md, "Users").
  if (j.contains("owner") && j.value("owner", "") != "admin") out << "  " << j.value("owner", "");
  out << std::endl;
}

void print_job_list(std::ostream& out, const json& jobs) {
  if (jobs.empty()) {
    out << "no jobs" << std::endl;
  } else {
    for (const auto& j : jobs) print_job_line(out, j);
  }
}

void print_job_status(std::ostream& out, json r) {
  print_job_line(out, r);
  for (const auto& t : r["tasks"]) {
    out << "  " << std::left << std::setw(10) << t.value("task", "") << std::setw(10) << t.value("state", "")
        << std::setw(12) << t.value("agent", "") << t.value("endpoint", "") << " " << t.value("exit", "")
        << (t.contains("error") ? "  " + t.value("error", "") : "");
    if (t.value("restarts", 0) > 0) out << "  restarts " << t.value("restarts", 0);
    if (t.value("resyncs", 0) > 0) out << "  resynced " << t.value("resyncs", 0) << "x with restarted PS shards";
    if (t.value("straggler", false)) out << "  straggler";
    if (t.contains("gpus") && t["gpus"].is_array()) {
      out << "  GPU";
      for (const auto& g : t["gpus"]) out << " " << g.dump();
    }
    if (t.contains("recovery")) out << "  " << t.value("recovery", "");
    if (t.value("leaving", false)) out << "  leaving after its step";
    out << std::endl;
  }
  if (r.contains("elastic") && r["elastic"].is_object()) {
    // An elastic job: its bounds, and under the shared plan why it has its workers.
    out << "  elastic: " << r.value("workers", 0) << " workers within [" << r["elastic"].value("min_workers", 0)
        << ", " << r["elastic"].value("max_workers", 0) << "] (dltrain scale " << r.value("job", "")
        << " --workers N)";
    if (r.contains("share")) out << "; shared plan: " << r.value("share", "");
    out << std::endl;
  }
  if (r.value("state", "") == "recovering") {
    out << "  recovering for " << fmt(r.value("recovering_seconds", 0.0), 0) << " s because "
        << r.value("recovery_reason", "") << "; generation " << r.value("generation", 0) + 1
        << " starts once every old task has stopped and each has an agent";
    if (r.value("reassignments", 0) > 0) out << " (re-assigned " << r.value("reassignments", 0) << "x before)";
    out << std::endl;
  } else if (r.value("reassignments", 0) > 0) {
    out << "  generation " << r.value("generation", 0) << ", re-assigned " << r.value("reassignments", 0)
        << "x; last because " << r.value("recovery_reason", "") << std::endl;
  }
  if (r.contains("plan") && r["plan"].is_object()) {
    // An automatic job: what the planner chose (workers, batch, compression) and why.
    const auto& p = r["plan"];
    out << "  plan: ";
    if (p.contains("choice") && p["choice"].contains("compression")) {
      out << "compression " << p["choice"].value("compression", "") << "; ";
    }
    out << p.value("explanation", "") << std::endl;
  }
  if (r.contains("error")) out << "  error: " << r.value("error", "") << std::endl;
  if (r.contains("failure") && r["failure"].is_object()) {
    print_failure(out, events::Failure::from_json(r["failure"]));
    out << std::endl;
  }
  for (const auto& m : r.value("models", json::array())) {
    out << "  model " << m.value("checkpoint", "") << " (" << m.value("model", "") << ", "
        << human_bytes(static_cast<double>(m.value("bytes", std::int64_t{0}))) << "): dltrain model get "
        << r.value("job", "") << (m.value("checkpoint", "") == "last" ? "" : " --checkpoint " + m.value("checkpoint", ""))
        << " -o DIR" << std::endl;
  }
  if (r.contains("model_error")) {
    out << "  " << (r.contains("models") ? "not every checkpoint kept: " : "no trained model kept: ")
        << r.value("model_error", "") << std::endl;
  }
  if (r.contains("resumed_from")) {
    out << "  resumes " << r.value("resumed_from", "") << " from its checkpoint " << r.value("resume_checkpoint", "")
        << " (epoch " << r.value("resume_epoch", 0) + 1 << " on)" << std::endl;
  }
  if (r.value("state", "") == "queued") {
    out << "  waiting: position " << r.value("queue_position", 0) << " in the queue, needs "
        << r.value("cores_needed", 0) << " cores, " << r.value("cores_free", 0) << " free";
    if (r.contains("cores_total")) out << ", " << r.value("cores_total", 0) << " in the cluster";
    if (r.contains("gpus_needed")) {
      out << "; needs " << r.value("gpus_needed", 0) << " GPUs, " << r.value("gpus_free", 0) << " free, "
          << r.value("gpus_total", 0) << " in the cluster";
    }
    if (!r.value("fits_cluster", true)) out << "; more than the whole cluster has, it waits for agents to join";
    if (r.contains("quota")) out << "; " << r.value("quota", "");
    out << std::endl;
  }
}

void print_plan(std::ostream& out, json r) {
  const bool methods = r.value("chooses_method", false);
  out << (r.value("feasible", false) ? "decision: " : "no decision: ") << r.value("explanation", "") << std::endl;
  if (!r["explore"].empty()) {
    out << (r.value("feasible", false) ? "a submit would first profile:" : "history is thin; a submit would first profile:");
    for (const auto& e : r["explore"]) {
      out << " " << e.value("workers", 0) << "x" << e.value("batch_size", 0);
      if (methods) out << " " << e.value("compression", "");
    }
    out << std::endl;
  }
  if (methods) {
    const double link = r.value("link_bytes_per_sec", 0.0);
    out << "link: " << (link > 0 ? fmt(link * 8 / 1e6, 0) + " Mbit/s (the slowest agent's probe)" : std::string("not measured"))
        << std::endl;
    out << "best of each method:" << std::endl;
    for (const auto& row : r.value("methods", json::array())) {
      out << "  " << std::left << std::setw(16) << row.value("compression", "") << row.value("workers", 0) << "x"
          << std::setw(6) << row.value("batch_size", 0);
      if (row.contains("total_seconds")) {
        out << " " << fmt(row.value("total_seconds", 0.0), 1) << " s (" << fmt(row.value("comm_seconds_per_epoch", 0.0), 1)
            << " s/epoch on the wire), accuracy " << fmt(row.value("accuracy", 0.0), 4) << ", cost "
            << fmt(row.value("cost", 0.0), 4);
      }
      out << "  " << (row.value("feasible", false) ? "ok" : row.value("reason", "")) << std::endl;
    }
  }
  out << std::left << std::setw(8) << "workers" << std::setw(7) << "batch";
  if (methods) out << std::setw(16) << "compression";
  out << std::setw(12) << "s/epoch" << std::setw(10) << "total s" << std::setw(10) << "accuracy" << std::setw(10)
      << "cost" << "verdict" << std::endl;
  for (const auto& row : r["table"]) {
    out << std::left << std::setw(8) << row.value("workers", 0) << std::setw(7) << row.value("batch_size", 0);
    if (methods) out << std::setw(16) << row.value("compression", "");
    if (row.contains("total_seconds")) {
      out << std::setw(12) << fmt(row.value("seconds_per_epoch", 0.0), 1) << std::setw(10)
          << fmt(row.value("total_seconds", 0.0), 0) << std::setw(10) << fmt(row.value("accuracy", 0.0), 4)
          << std::setw(10) << fmt(row.value("cost", 0.0), 4);
    } else {
      out << std::setw(42) << "-";
    }
    out << (row.value("feasible", false) ? "ok" : row.value("reason", "")) << std::endl;
  }
}

void print_history(std::ostream& out, json r) {
  if (!r.value("persistent", false)) out << "(this leader keeps no store)" << std::endl;
  for (const auto& o : r["observations"]) {
    // The method as plans name it ("dgc 1%"), from the row's method and setting.
    std::string method = o.value("compression", "none");
    if (const double setting = o.value("compression_setting", 0.0); setting > 0 && method != "none" && method != "fp16") {
      method += method == "powersgd" ? " rank " + fmt(setting, 0) : " " + fmt(100.0 * setting, setting < 0.01 ? 1 : 0) + "%";
    }
    out << std::left << std::setw(9) << o.value("job", "") << std::setw(11) << o.value("model", "") << std::setw(15)
        << o.value("dataset", "") << std::setw(8) << o.value("source", "") << std::setw(10) << method
        << o.value("workers", 0) << "w x "
        << std::setw(5) << o.value("batch_size", 0) << " epoch " << std::setw(3) << o.value("epoch", 0) << " "
        << std::setw(8) << fmt(o.value("epoch_seconds", 0.0), 1) << "s " << std::setw(7)
        << fmt(o.value("images_per_sec", 0.0), 0) << " img/s";
    if (o.value("final_accuracy", -1.0) >= 0) out << "  final accuracy " << fmt(o.value("final_accuracy", 0.0), 4);
    out << std::endl;
  }
}

void print_leader(std::ostream& out, const json& leader) {
  if (!leader.is_object() || !leader.value("ha", false)) return;
  const auto utc = [](double unix_s) {
    const std::time_t t = static_cast<std::time_t>(unix_s);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
    return std::string(buf);
  };
  out << "leader: " << leader.value("name", "?") << " serves, term " << leader.value("term", std::int64_t{0})
      << ", since " << utc(leader.value("since_unix", 0.0));
  std::string others;
  for (const auto& c : leader.value("candidates", json::array())) {
    if (c.value("candidate", "") == leader.value("name", "")) continue;
    others += (others.empty() ? "" : ", ") + c.value("candidate", "?") + " (" + c.value("state", "?") + ", " +
              c.value("address", "?") + ")";
  }
  if (!others.empty()) out << "; other candidates: " << others;
  if (leader.contains("candidates_error")) out << "; candidates unknown: " << leader.value("candidates_error", "");
  out << "\n";
}

void print_agents(std::ostream& out, const json& agents) {
  for (const auto& a : agents) {
    out << std::left << std::setw(14) << a.value("agent", "") << std::setw(9) << a.value("state", "") << std::setw(16)
        << a.value("address", "") << a.value("free_cores", 0) << "/" << a.value("cores", 0) << " cores free  "
        << a.value("memory_mb", 0) << " MiB  " << a.value("hardware_class", "");
    if (const double link = a.value("link_bytes_per_sec", 0.0); link > 0) out << "  link " << fmt(link * 8 / 1e6, 0) << " Mbit/s";
    if (const auto c = a.find("shard_cache"); c != a.end() && c->is_object()) {
      const auto mib = [&](const char* k) { return fmt(c->value(k, 0.0) / (1 << 20), 0); };
      out << "  cache " << c->value("shards", 0) << " shards " << mib("bytes") << "/" << mib("capacity_bytes") << " MiB, "
          << c->value("hits", 0) << " hits " << c->value("misses", 0) << " misses, fetched " << mib("bytes_fetched") << " MiB";
    }
    const auto gpus = a.value("gpus", json::array());
    if (!gpus.empty()) {
      out << "  " << a.value("gpus_free", 0) << "/" << gpus.size() << " GPUs free:";
      for (const auto& g : gpus) {
        out << " " << g.value("index", 0) << " " << g.value("name", "") << " (" << g.value("memory_mb", 0) << " MiB)";
      }
    }
    out << std::endl;
  }
}

void print_dataset_report(std::ostream& out, const nlohmann::json& r) {
  const auto& splits = r.at("splits");
  out << r.at("dataset").get<std::string>() << " " << r.at("data_dir").get<std::string>() << ": "
      << r.at("classes").size() << " classes";
  for (const auto& [name, sp] : splits.items()) out << ", " << name << " " << sp.at("images").get<std::int64_t>() << " images";
  out << "\n";
  std::size_t width = 5;
  for (const auto& c : r.at("classes")) width = std::max(width, c.get<std::string>().size());
  out << std::left << std::setw(static_cast<int>(width)) << "class" << std::right;
  for (const auto& [name, sp] : splits.items()) out << "  " << std::setw(8) << name;
  out << "\n";
  for (const auto& c : r.at("classes")) {
    const auto cls = c.get<std::string>();
    out << std::left << std::setw(static_cast<int>(width)) << cls << std::right;
    for (const auto& [name, sp] : splits.items()) out << "  " << std::setw(8) << sp.at("per_class").value(cls, 0);
    out << "\n";
  }
  out << "image sizes:";
  for (const auto& s : r.at("sizes")) {
    out << " " << s.at("width").get<int>() << "x" << s.at("height").get<int>() << "x" << s.at("channels").get<int>()
        << " (" << s.at("images").get<std::int64_t>() << ")";
  }
  out << "\n";
  const auto& bad = r.at("unreadable");
  out << "unreadable files: " << bad.size() << (bad.empty() ? "" : " (skipped in training)") << "\n";
  for (const auto& b : bad) out << "  " << b.at("error").get<std::string>() << "\n";
  for (const auto& [split, n] : r.at("other_files").items()) {
    if (n.get<std::int64_t>() > 0) out << "other files in " << split << "/ (not .jpg, .jpeg or .png, ignored): " << n << "\n";
  }
  out << std::flush;
}

}  // namespace dltrain::client
