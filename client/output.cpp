#include "output.h"

#include <iomanip>
#include <sstream>

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

void print_progress(std::ostream& out, const json& e, const std::string& job, const std::string& task) {
  out << job << " [" << task << "] epoch " << e.value("epoch", 0) << " step " << e.value("step", 0) << "/"
      << e.value("steps_per_epoch", 0) << "  loss " << fmt(e.value("loss", 0.0), 4) << "  lr "
      << fmt(e.value("lr", 0.0), 4) << "  " << fmt(e.value("images_per_sec", 0.0), 0) << " img/s  pushed "
      << human_bytes(e.value("bytes_pushed", 0.0)) << "  pulled " << human_bytes(e.value("bytes_pulled", 0.0));
  if (e.contains("density") && e["density"].is_number() && e["density"].get<double>() < 1.0) {
    out << "  density " << e["density"].get<double>();
  }
  if (e.contains("compression_ratio") && e["compression_ratio"].is_number() &&
      e["compression_ratio"].get<double>() > 1.05) {
    out << "  compression " << fmt(e["compression_ratio"].get<double>(), 1) << "x";
  }
  out << std::endl;
}

void print_restarting(std::ostream& out, const json& e, const std::string& job, const std::string& task) {
  out << job << " [" << task << "] " << e.value("reason", "died")
      << (e.value("last_error", "").empty() ? "" : " (" + e.value("last_error", "") + ")") << "; restart "
      << e.value("attempt", 0) << " of " << e.value("max_restarts", 0);
  if (e.value("kind", "") == "ps") {
    out << " on port " << e.value("port", 0) << ", from its latest checkpoint" << std::endl;
  } else {
    out << ", resuming after epoch " << e.value("resume_epoch", 0) << std::endl;
  }
}

void print_reassigned(std::ostream& out, const json& e, const std::string& job) {
  out << job << ": re-assigned as generation " << e.value("generation", 0);
  for (const auto& m : e["moved"]) {
    out << "; " << m.value("task", "") << " " << m.value("from", "") << " -> " << m.value("to", "");
  }
  if (e.contains("replica_from")) out << "; lost shard state rebuilt from " << e.value("replica_from", "") << "'s replica";
  out << std::endl;
}

void print_epoch_end(std::ostream& out, const json& e, const std::string& job, const std::string& task) {
  out << job << " [" << task << "] epoch " << e.value("epoch", 0) << "/" << e.value("epochs", 0) << " done in "
      << fmt(e.value("epoch_seconds", 0.0), 1) << " s  train loss " << fmt(e.value("train_loss", 0.0), 4) << "  "
      << fmt(e.value("images_per_sec", 0.0), 0) << " img/s";
  if (e.contains("test_accuracy")) out << "  test accuracy " << fmt(e.value("test_accuracy", 0.0), 4);
  out << std::endl;
}

void print_summary(std::ostream& out, const json& e, const std::string& job) {
  out << job << " " << e.value("state", "") << ": test accuracy "
      << (e["test_accuracy"].is_number() ? fmt(e["test_accuracy"].get<double>(), 4) : std::string("n/a")) << ", "
      << e.value("epochs", 0) << " epochs, " << fmt(e.value("wall_seconds", 0.0), 1) << " s, pushed "
      << human_bytes(e.value("bytes_pushed", 0.0)) << ", pulled " << human_bytes(e.value("bytes_pulled", 0.0)) << ", "
      << fmt(e.value("images_per_sec", 0.0), 0) << " img/s (last epoch, all workers)";
  if (e.value("compression", "none") != "none" && e.contains("compression_ratio") &&
      e["compression_ratio"].is_number()) {
    out << "\n  " << e.value("compression", "") << ": " << fmt(e["compression_ratio"].get<double>(), 1)
        << "x fewer bytes than dense (up " << fmt(e.value("compression_ratio_up", 0.0), 1) << "x, down "
        << fmt(e.value("compression_ratio_down", 0.0), 1) << "x)";
    if (e.contains("compression_ratio_after_warmup") && e["compression_ratio_after_warmup"].is_number()) {
      out << "; after warm-up " << fmt(e["compression_ratio_after_warmup"].get<double>(), 1) << "x (up "
          << fmt(e.value("compression_ratio_up_after_warmup", 0.0), 1) << "x, down "
          << fmt(e.value("compression_ratio_down_after_warmup", 0.0), 1) << "x)";
    }
  }
  if (e.contains("error")) out << "\n  error: " << e.value("error", "");
  out << std::endl;
}

}  // namespace

void print_event(std::ostream& out, const json& e) {
  const std::string kind = e.value("event", "");
  const std::string job = e.value("job", "");
  const std::string task = e.value("task", "");
  if (kind == "state") {
    out << job << ": " << e.value("state", "") << std::endl;
  } else if (kind == "progress") {
    print_progress(out, e, job, task);
  } else if (kind == "restarting") {
    print_restarting(out, e, job, task);
  } else if (kind == "ps_recovered") {
    out << job << " [" << task << "] listens again on " << e.value("endpoint", "") << ": " << e.value("recovery", "")
        << std::endl;
  } else if (kind == "ps_resync") {
    out << job << " [" << task << "] lost PS shard " << e.value("shard", -1) << " (" << e.value("reason", "")
        << "); reconnected and resynced in " << fmt(e.value("seconds", 0.0), 1) << " s" << std::endl;
  } else if (kind == "recovering") {
    out << job << ": " << e.value("reason", "") << "; stopping its tasks to re-assign it" << std::endl;
  } else if (kind == "waiting_for_agent") {
    out << job << ": no agent has free cores for " << e["tasks"].dump() << "; waiting up to "
        << fmt(e.value("timeout_ms", 0) / 1000.0, 0) << " s for one" << std::endl;
  } else if (kind == "reassigned") {
    print_reassigned(out, e, job);
  } else if (kind == "stopped" && e.contains("replica")) {
    const auto& r = e["replica"];
    out << job << " [" << task << "] stopped"
        << (r.is_object() && r.contains("steps") ? " and saved its replica at step " + std::to_string(r.value("steps", 0))
                                               : std::string())
        << std::endl;
  } else if (kind == "replica_loaded") {
    out << job << " [" << task << "] initialises the PS shards from its replica of step " << e.value("steps", 0)
        << std::endl;
  } else if (kind == "skipped_step") {
    out << job << " [" << task << "] skipped epoch " << e.value("epoch", 0) << " step " << e.value("step", 0)
        << ": NaN/Inf loss or gradient (" << e.value("skipped_steps", 0) << " skipped so far)" << std::endl;
  } else if (kind == "epoch_end") {
    print_epoch_end(out, e, job, task);
  } else if (kind == "started") {
    out << job << " [" << task << "] started: " << e.value("train_examples", 0) << " training examples, "
        << e.value("parameters", 0) << " parameters in " << e.value("partitions", 0) << " partitions" << std::endl;
  } else if (kind == "error") {
    out << job << " [" << task << "] error: " << e.value("message", "") << std::endl;
  } else if (kind == "plan") {
    const auto& p = e["plan"];
    out << job << " planner: " << p.value("explanation", "") << std::endl;
  } else if (kind == "summary") {
    print_summary(out, e, job);
  }
}

void print_job_line(std::ostream& out, const json& j) {
  out << std::left << std::setw(9) << j.value("job", "") << std::setw(11) << j.value("state", "") << std::setw(22)
      << j.value("name", "").substr(0, 21) << std::setw(6) << j.value("model", "") << std::right << std::setw(3)
      << j.value("workers", 0) << "w" << std::setw(3) << j.value("ps_shards", 0) << "ps  epoch "
      << j.value("epochs", 0) << "/" << j.value("epochs_total", 0) << "  acc "
      << (j["test_accuracy"].is_number() ? fmt(j["test_accuracy"].get<double>(), 4) : std::string("  -   ")) << "  "
      << fmt(j.value("wall_seconds", 0.0), 0) << " s" << std::endl;
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
    if (t.contains("recovery")) out << "  " << t.value("recovery", "");
    out << std::endl;
  }
  if (r.value("reassignments", 0) > 0 || r.value("state", "") == "recovering") {
    out << "  generation " << r.value("generation", 0) << ", re-assigned " << r.value("reassignments", 0)
        << "x; last because " << r.value("recovery_reason", "") << std::endl;
  }
  if (r.contains("error")) out << "  error: " << r.value("error", "") << std::endl;
  if (r.value("state", "") == "queued") {
    out << "  waiting: position " << r.value("queue_position", 0) << " in the queue, needs "
        << r.value("cores_needed", 0) << " cores, " << r.value("cores_free", 0) << " free" << std::endl;
  }
}

void print_plan(std::ostream& out, json r) {
  out << (r.value("feasible", false) ? "decision: " : "no decision: ") << r.value("explanation", "") << std::endl;
  if (!r["explore"].empty()) {
    out << "history is thin; a submit would first profile:";
    for (const auto& e : r["explore"]) out << " " << e.value("workers", 0) << "x" << e.value("batch_size", 0);
    out << std::endl;
  }
  out << std::left << std::setw(8) << "workers" << std::setw(7) << "batch" << std::setw(12) << "s/epoch"
      << std::setw(10) << "total s" << std::setw(10) << "accuracy" << std::setw(10) << "cost"
      << "verdict" << std::endl;
  for (const auto& row : r["table"]) {
    out << std::left << std::setw(8) << row.value("workers", 0) << std::setw(7) << row.value("batch_size", 0);
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
    out << std::left << std::setw(9) << o.value("job", "") << std::setw(6) << o.value("model", "") << std::setw(15)
        << o.value("dataset", "") << std::setw(8) << o.value("source", "") << o.value("workers", 0) << "w x "
        << std::setw(5) << o.value("batch_size", 0) << " epoch " << std::setw(3) << o.value("epoch", 0) << " "
        << std::setw(8) << fmt(o.value("epoch_seconds", 0.0), 1) << "s " << std::setw(7)
        << fmt(o.value("images_per_sec", 0.0), 0) << " img/s";
    if (o.value("final_accuracy", -1.0) >= 0) out << "  final accuracy " << fmt(o.value("final_accuracy", 0.0), 4);
    out << std::endl;
  }
}

void print_agents(std::ostream& out, const json& agents) {
  for (const auto& a : agents) {
    out << std::left << std::setw(14) << a.value("agent", "") << std::setw(9) << a.value("state", "") << std::setw(16)
        << a.value("address", "") << a.value("free_cores", 0) << "/" << a.value("cores", 0) << " cores free  "
        << a.value("memory_mb", 0) << " MiB  " << a.value("hardware_class", "") << std::endl;
  }
}

}  // namespace dltrain::client
