// dltrain: the thin command-line client. Every decision is the leader's; this program
// finds the leader, sends one request, and prints what comes back.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "common/errors.h"
#include "control/client.h"
#include "dltrain/config.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Exit codes (documented in --help and docs/operations.md).
constexpr int kExitOk = 0;
constexpr int kExitJobFailed = 1;   // the job failed or was cancelled
constexpr int kExitBadInput = 2;    // usage error or a job/request the leader rejected
constexpr int kExitNoLeader = 3;    // the leader cannot be reached or stopped answering

struct Target {
  std::string leader, token, source;
  std::string ca_file;  // wss:// leaders: CA certificates to verify it with ("" = the system's)
  std::string ca_source = "--ca-file";  // where ca_file came from, for messages
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Flags, then environment, then a client config, then a standalone cluster's file.
Target find_leader(const std::string& flag_leader, const std::string& flag_token, const std::string& flag_ca) {
  Target t{flag_leader, flag_token, "flags", flag_ca};
  if (t.ca_file.empty() && !env("DLTRAIN_CA_FILE").empty()) {
    t.ca_file = env("DLTRAIN_CA_FILE");
    t.ca_source = "DLTRAIN_CA_FILE";
  }
  auto fill = [&](const std::string& leader, const std::string& token, const std::string& source) {
    if (t.leader.empty() && !leader.empty()) {
      t.leader = leader;
      t.source = source;
    }
    if (t.token.empty() && !token.empty()) t.token = token;
  };
  fill(env("DLTRAIN_LEADER"), env("DLTRAIN_TOKEN"), "environment");
  std::vector<fs::path> configs;
  if (!env("DLTRAIN_CLIENT_CONFIG").empty()) configs.emplace_back(env("DLTRAIN_CLIENT_CONFIG"));
  const std::string xdg = env("XDG_CONFIG_HOME");
  const std::string home = env("HOME").empty() ? "/root" : env("HOME");
  configs.push_back(fs::path(xdg.empty() ? home + "/.config" : xdg) / "dltrain/client.toml");
  configs.emplace_back("/etc/dltrain/client.toml");
  for (const auto& p : configs) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    try {
      auto tbl = toml::parse_file(p.string());
      std::string token = tbl["token"].value_or(std::string());
      if (token.empty()) {
        if (auto tf = tbl["token_file"].value<std::string>()) {
          std::ifstream in(*tf);
          std::getline(in, token);
        }
      }
      fill(tbl["leader"].value_or(std::string()), token, p.string());
      if (t.ca_file.empty()) {
        if (auto ca = tbl["ca_file"].value<std::string>(); ca && !ca->empty()) {
          // Relative to the configuration file, as the agent's paths are.
          const fs::path cp(*ca);
          t.ca_file = (cp.is_relative() ? p.parent_path() / cp : cp).string();
          t.ca_source = "ca_file in " + p.string();
        }
      }
    } catch (const toml::parse_error& e) {
      throw dltrain::ConfigError("", "client config " + p.string() + ": " + std::string(e.description()));
    }
  }
  const std::string sa = dltrain::control::default_standalone_client_file();
  std::error_code ec;
  if (fs::exists(sa, ec)) {
    std::ifstream in(sa);
    try {
      auto j = json::parse(in);
      fill(j.value("leader", ""), j.value("client_token", ""), sa);
    } catch (const json::exception&) {
      throw dltrain::ConfigError("", "standalone client file " + sa + " is not valid JSON");
    }
  }
  if (t.leader.empty()) {
    throw dltrain::ConfigError("leader",
                               "no leader configured: pass --leader ws://HOST:PORT, set DLTRAIN_LEADER, write "
                               "~/.config/dltrain/client.toml, or start a local cluster with "
                               "`dltrain-agent --standalone`");
  }
  if (t.token.empty()) {
    throw dltrain::ConfigError("token", "no client token for " + t.leader +
                                            ": pass --token, set DLTRAIN_TOKEN or put token in the client config");
  }
  return t;
}

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

void print_event(const json& e) {
  const std::string kind = e.value("event", "");
  const std::string job = e.value("job", "");
  const std::string task = e.value("task", "");
  if (kind == "state") {
    std::cout << job << ": " << e.value("state", "") << std::endl;
  } else if (kind == "progress") {
    std::cout << job << " [" << task << "] epoch " << e.value("epoch", 0) << " step " << e.value("step", 0) << "/"
              << e.value("steps_per_epoch", 0) << "  loss " << fmt(e.value("loss", 0.0), 4) << "  lr "
              << fmt(e.value("lr", 0.0), 4) << "  " << fmt(e.value("images_per_sec", 0.0), 0) << " img/s  pushed "
              << human_bytes(e.value("bytes_pushed", 0.0)) << "  pulled " << human_bytes(e.value("bytes_pulled", 0.0));
    if (e.contains("density") && e["density"].is_number() && e["density"].get<double>() < 1.0) {
      std::cout << "  density " << e["density"].get<double>();
    }
    if (e.contains("compression_ratio") && e["compression_ratio"].is_number() &&
        e["compression_ratio"].get<double>() > 1.05) {
      std::cout << "  compression " << fmt(e["compression_ratio"].get<double>(), 1) << "x";
    }
    std::cout << std::endl;
  } else if (kind == "restarting") {
    std::cout << job << " [" << task << "] " << e.value("reason", "died")
              << (e.value("last_error", "").empty() ? "" : " (" + e.value("last_error", "") + ")") << "; restart "
              << e.value("attempt", 0) << " of " << e.value("max_restarts", 0);
    if (e.value("kind", "") == "ps") {
      std::cout << " on port " << e.value("port", 0) << ", from its latest checkpoint" << std::endl;
    } else {
      std::cout << ", resuming after epoch " << e.value("resume_epoch", 0) << std::endl;
    }
  } else if (kind == "ps_recovered") {
    std::cout << job << " [" << task << "] listens again on " << e.value("endpoint", "") << ": "
              << e.value("recovery", "") << std::endl;
  } else if (kind == "ps_resync") {
    std::cout << job << " [" << task << "] lost PS shard " << e.value("shard", -1) << " ("
              << e.value("reason", "") << "); reconnected and resynced in " << fmt(e.value("seconds", 0.0), 1)
              << " s" << std::endl;
  } else if (kind == "recovering") {
    std::cout << job << ": " << e.value("reason", "") << "; stopping its tasks to re-assign it" << std::endl;
  } else if (kind == "waiting_for_agent") {
    std::cout << job << ": no agent has free cores for " << e["tasks"].dump() << "; waiting up to "
              << fmt(e.value("timeout_ms", 0) / 1000.0, 0) << " s for one" << std::endl;
  } else if (kind == "reassigned") {
    std::cout << job << ": re-assigned as generation " << e.value("generation", 0);
    for (const auto& m : e["moved"]) {
      std::cout << "; " << m.value("task", "") << " " << m.value("from", "") << " -> " << m.value("to", "");
    }
    if (e.contains("replica_from")) std::cout << "; lost shard state rebuilt from " << e.value("replica_from", "") << "'s replica";
    std::cout << std::endl;
  } else if (kind == "stopped" && e.contains("replica")) {
    const auto& r = e["replica"];
    std::cout << job << " [" << task << "] stopped"
              << (r.is_object() && r.contains("steps") ? " and saved its replica at step " + std::to_string(r.value("steps", 0))
                                                     : std::string())
              << std::endl;
  } else if (kind == "replica_loaded") {
    std::cout << job << " [" << task << "] initialises the PS shards from its replica of step " << e.value("steps", 0)
              << std::endl;
  } else if (kind == "skipped_step") {
    std::cout << job << " [" << task << "] skipped epoch " << e.value("epoch", 0) << " step " << e.value("step", 0)
              << ": NaN/Inf loss or gradient (" << e.value("skipped_steps", 0) << " skipped so far)" << std::endl;
  } else if (kind == "epoch_end") {
    std::cout << job << " [" << task << "] epoch " << e.value("epoch", 0) << "/" << e.value("epochs", 0)
              << " done in " << fmt(e.value("epoch_seconds", 0.0), 1) << " s  train loss "
              << fmt(e.value("train_loss", 0.0), 4) << "  " << fmt(e.value("images_per_sec", 0.0), 0) << " img/s";
    if (e.contains("test_accuracy")) std::cout << "  test accuracy " << fmt(e.value("test_accuracy", 0.0), 4);
    std::cout << std::endl;
  } else if (kind == "started") {
    std::cout << job << " [" << task << "] started: " << e.value("train_examples", 0) << " training examples, "
              << e.value("parameters", 0) << " parameters in " << e.value("partitions", 0) << " partitions"
              << std::endl;
  } else if (kind == "error") {
    std::cout << job << " [" << task << "] error: " << e.value("message", "") << std::endl;
  } else if (kind == "plan") {
    const auto& p = e["plan"];
    std::cout << job << " planner: " << p.value("explanation", "") << std::endl;
  } else if (kind == "summary") {
    std::cout << job << " " << e.value("state", "") << ": test accuracy "
              << (e["test_accuracy"].is_number() ? fmt(e["test_accuracy"].get<double>(), 4) : std::string("n/a"))
              << ", " << e.value("epochs", 0) << " epochs, " << fmt(e.value("wall_seconds", 0.0), 1)
              << " s, pushed " << human_bytes(e.value("bytes_pushed", 0.0)) << ", pulled "
              << human_bytes(e.value("bytes_pulled", 0.0)) << ", " << fmt(e.value("images_per_sec", 0.0), 0)
              << " img/s (last epoch, all workers)";
    if (e.value("compression", "none") != "none" && e.contains("compression_ratio") &&
        e["compression_ratio"].is_number()) {
      std::cout << "\n  " << e.value("compression", "") << ": " << fmt(e["compression_ratio"].get<double>(), 1)
                << "x fewer bytes than dense (up " << fmt(e.value("compression_ratio_up", 0.0), 1) << "x, down "
                << fmt(e.value("compression_ratio_down", 0.0), 1) << "x)";
      if (e.contains("compression_ratio_after_warmup") && e["compression_ratio_after_warmup"].is_number()) {
        std::cout << "; after warm-up " << fmt(e["compression_ratio_after_warmup"].get<double>(), 1) << "x (up "
                  << fmt(e.value("compression_ratio_up_after_warmup", 0.0), 1) << "x, down "
                  << fmt(e.value("compression_ratio_down_after_warmup", 0.0), 1) << "x)";
      }
    }
    if (e.contains("error")) std::cout << "\n  error: " << e.value("error", "");
    std::cout << std::endl;
  }
}

int exit_for_state(const std::string& state) {
  return state == "succeeded" ? kExitOk : kExitJobFailed;
}

int follow(dltrain::control::BlockingControlClient& c, const std::string& job, bool as_json) {
  for (;;) {
    auto ev = c.next_event(std::chrono::seconds(30));
    if (!ev) continue;  // WebSocket keep-alive pings close the session if the leader goes silent
    if (ev->value("job", "") != job) continue;
    if (as_json) {
      std::cout << ev->dump() << std::endl;
    } else {
      print_event(*ev);
    }
    if (ev->value("event", "") == "summary") return exit_for_state(ev->value("state", ""));
  }
}

void print_job_line(const json& j) {
  std::cout << std::left << std::setw(9) << j.value("job", "") << std::setw(11) << j.value("state", "")
            << std::setw(22) << j.value("name", "").substr(0, 21) << std::setw(6) << j.value("model", "")
            << std::right << std::setw(3) << j.value("workers", 0) << "w" << std::setw(3) << j.value("ps_shards", 0)
            << "ps  epoch " << j.value("epochs", 0) << "/" << j.value("epochs_total", 0) << "  acc "
            << (j["test_accuracy"].is_number() ? fmt(j["test_accuracy"].get<double>(), 4) : std::string("  -   "))
            << "  " << fmt(j.value("wall_seconds", 0.0), 0) << " s" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dltrain " DLTRAIN_VERSION
               ": submit and watch training jobs on a dltrain cluster.\n"
               "The leader is found from --leader/--token, then DLTRAIN_LEADER/DLTRAIN_TOKEN, then\n"
               "~/.config/dltrain/client.toml (leader, token), then a local `dltrain-agent --standalone` cluster.\n"
               "Exit codes: 0 ok, 1 job failed or cancelled, 2 bad input, 3 leader unreachable."};
  app.require_subcommand(1);
  std::string leader, token;
  int timeout_s = 30;
  bool as_json = false;
  std::string ca_file;
  app.add_option("--leader", leader, "leader URL, ws://HOST:PORT or wss://HOST:PORT (TLS)");
  app.add_option("--token", token, "client bearer token");
  app.add_option("--ca-file", ca_file,
                 "wss:// only: CA certificates (PEM) to verify the leader with (default: DLTRAIN_CA_FILE, the "
                 "client config's ca_file, else the system's trust store)");
  app.add_option("--timeout", timeout_s, "seconds to wait for the leader's answer (1..3600)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.set_version_flag("--version", DLTRAIN_VERSION);

  std::string job_file, job_id;
  bool follow_flag = false;
  auto* submit = app.add_subcommand("submit", "submit a job file; with --follow, print progress until it ends");
  submit->add_option("JOB_FILE", job_file, "job file (TOML), e.g. configs/jobs/fashion-mnist.toml")->required();
  submit->add_flag("-f,--follow", follow_flag, "print progress until the job ends; exit 1 unless it succeeds");
  submit->add_flag("--json", as_json, "one JSON object per line");
  auto* status = app.add_subcommand("status", "show one job, or every job");
  status->add_option("JOB", job_id, "job id, e.g. job-1");
  status->add_flag("--json", as_json, "JSON output");
  auto* list = app.add_subcommand("list", "list jobs");
  list->add_flag("--json", as_json, "JSON output");
  auto* cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  cancel->add_option("JOB", job_id, "job id")->required();
  cancel->add_flag("--json", as_json, "JSON output");
  auto* agents = app.add_subcommand("agents", "list the agents registered with the leader");
  agents->add_flag("--json", as_json, "JSON output");
  auto* plan_cmd = app.add_subcommand("plan", "show the planner's decision for a job file without running anything");
  plan_cmd->add_option("JOB_FILE", job_file, "job file (TOML)")->required();
  plan_cmd->add_flag("--json", as_json, "JSON output");
  std::string model_filter, dataset_filter;
  auto* history_cmd = app.add_subcommand("history", "list the leader's performance observations");
  history_cmd->add_option("--model", model_filter, "only this model");
  history_cmd->add_option("--dataset", dataset_filter, "only this dataset");
  history_cmd->add_flag("--json", as_json, "JSON output");
  auto* follow_cmd = app.add_subcommand("follow", "print a job's progress until it ends");
  follow_cmd->add_option("JOB", job_id, "job id")->required();
  follow_cmd->add_flag("--json", as_json, "one JSON object per line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help/version or the usage error
    return rc == 0 ? kExitOk : kExitBadInput;
  }

  const auto timeout = std::chrono::seconds(timeout_s);
  Target target;
  try {
    target = find_leader(leader, token, ca_file);
  } catch (const dltrain::ConfigError& e) {
    std::cerr << "dltrain: " << e.what() << "\n";
    return kExitBadInput;
  }
  try {
    json submit_body;
    if (submit->parsed() || plan_cmd->parsed()) {
      std::error_code fec;
      if (!fs::is_regular_file(job_file, fec)) {
        std::cerr << "dltrain: job file \"" << job_file << "\" "
                  << (fs::exists(job_file, fec) ? "is not a regular file" : "does not exist") << "\n";
        return kExitBadInput;
      }
      std::ifstream in(job_file);
      if (!in) {
        std::cerr << "dltrain: cannot read job file \"" << job_file << "\"\n";
        return kExitBadInput;
      }
      std::stringstream ss;
      ss << in.rdbuf();
      submit_body = {{"job_toml", ss.str()},
                     {"base_dir", fs::absolute(fs::path(job_file)).parent_path().string()},
                     {"follow", follow_flag}};
    }
    dltrain::control::BlockingControlClient c(target.leader, target.token, timeout,
                                              dltrain::control::TlsClientOptions{target.ca_file, "", target.ca_source});
    if (submit->parsed()) {
      auto r = c.request("submit", submit_body, timeout);
      const std::string id = r.value("job", "");
      if (as_json) {
        std::cout << json{{"event", "submitted"}, {"job", id}, {"state", r.value("state", "")}}.dump() << std::endl;
      } else {
        std::cout << id << " submitted (" << r.value("state", "") << ") to " << target.leader << std::endl;
      }
      return follow_flag ? follow(c, id, as_json) : kExitOk;
    }
    if (plan_cmd->parsed()) {
      auto r = c.request("plan", submit_body, timeout);
      if (as_json) {
        std::cout << r.dump() << std::endl;
        return kExitOk;
      }
      std::cout << (r.value("feasible", false) ? "decision: " : "no decision: ") << r.value("explanation", "")
                << std::endl;
      if (!r["explore"].empty()) {
        std::cout << "history is thin; a submit would first profile:";
        for (const auto& e : r["explore"]) std::cout << " " << e.value("workers", 0) << "x" << e.value("batch_size", 0);
        std::cout << std::endl;
      }
      std::cout << std::left << std::setw(8) << "workers" << std::setw(7) << "batch" << std::setw(12) << "s/epoch"
                << std::setw(10) << "total s" << std::setw(10) << "accuracy" << std::setw(10) << "cost"
                << "verdict" << std::endl;
      for (const auto& row : r["table"]) {
        std::cout << std::left << std::setw(8) << row.value("workers", 0) << std::setw(7) << row.value("batch_size", 0);
        if (row.contains("total_seconds")) {
          std::cout << std::setw(12) << fmt(row.value("seconds_per_epoch", 0.0), 1) << std::setw(10)
                    << fmt(row.value("total_seconds", 0.0), 0) << std::setw(10) << fmt(row.value("accuracy", 0.0), 4)
                    << std::setw(10) << fmt(row.value("cost", 0.0), 4);
        } else {
          std::cout << std::setw(42) << "-";
        }
        std::cout << (row.value("feasible", false) ? "ok" : row.value("reason", "")) << std::endl;
      }
      return r.value("feasible", false) ? kExitOk : kExitJobFailed;
    }
    if (history_cmd->parsed()) {
      json body = json::object();
      if (!model_filter.empty()) body["model"] = model_filter;
      if (!dataset_filter.empty()) body["dataset"] = dataset_filter;
      auto r = c.request("history", body, timeout);
      if (as_json) {
        std::cout << r["observations"].dump() << std::endl;
        return kExitOk;
      }
      if (!r.value("persistent", false)) std::cout << "(this leader keeps no store)" << std::endl;
      for (const auto& o : r["observations"]) {
        std::cout << std::left << std::setw(9) << o.value("job", "") << std::setw(6) << o.value("model", "")
                  << std::setw(15) << o.value("dataset", "") << std::setw(8) << o.value("source", "")
                  << o.value("workers", 0) << "w x " << std::setw(5) << o.value("batch_size", 0) << " epoch "
                  << std::setw(3) << o.value("epoch", 0) << " " << std::setw(8) << fmt(o.value("epoch_seconds", 0.0), 1)
                  << "s " << std::setw(7) << fmt(o.value("images_per_sec", 0.0), 0) << " img/s";
        if (o.value("final_accuracy", -1.0) >= 0) std::cout << "  final accuracy " << fmt(o.value("final_accuracy", 0.0), 4);
        std::cout << std::endl;
      }
      return kExitOk;
    }
    if (follow_cmd->parsed()) {
      auto r = c.request("follow", {{"job", job_id}}, timeout);
      return follow(c, job_id, as_json);
    }
    if (status->parsed() && !job_id.empty()) {
      auto r = c.request("status", {{"job", job_id}}, timeout);
      if (as_json) {
        std::cout << r.dump() << std::endl;
      } else {
        print_job_line(r);
        for (const auto& t : r["tasks"]) {
          std::cout << "  " << std::left << std::setw(10) << t.value("task", "") << std::setw(10)
                    << t.value("state", "") << std::setw(12) << t.value("agent", "") << t.value("endpoint", "") << " "
                    << t.value("exit", "") << (t.contains("error") ? "  " + t.value("error", "") : "");
          if (t.value("restarts", 0) > 0) std::cout << "  restarts " << t.value("restarts", 0);
          if (t.value("resyncs", 0) > 0) std::cout << "  resynced " << t.value("resyncs", 0) << "x with restarted PS shards";
          if (t.contains("recovery")) std::cout << "  " << t.value("recovery", "");
          std::cout << std::endl;
        }
        if (r.value("reassignments", 0) > 0 || r.value("state", "") == "recovering") {
          std::cout << "  generation " << r.value("generation", 0) << ", re-assigned " << r.value("reassignments", 0)
                    << "x; last because " << r.value("recovery_reason", "") << std::endl;
        }
        if (r.contains("error")) std::cout << "  error: " << r.value("error", "") << std::endl;
        if (r.value("state", "") == "queued") {
          std::cout << "  waiting: position " << r.value("queue_position", 0) << " in the queue, needs "
                    << r.value("cores_needed", 0) << " cores, " << r.value("cores_free", 0) << " free" << std::endl;
        }
      }
      return kExitOk;
    }
    if (status->parsed() || list->parsed()) {
      auto r = c.request("list", json::object(), timeout);
      if (as_json) {
        std::cout << r["jobs"].dump() << std::endl;
      } else if (r["jobs"].empty()) {
        std::cout << "no jobs" << std::endl;
      } else {
        for (const auto& j : r["jobs"]) print_job_line(j);
      }
      return kExitOk;
    }
    if (cancel->parsed()) {
      auto r = c.request("cancel", {{"job", job_id}}, timeout);
      if (as_json) {
        std::cout << r.dump() << std::endl;
      } else {
        std::cout << job_id << ": " << r.value("state", "") << std::endl;
      }
      return kExitOk;
    }
    if (agents->parsed()) {
      auto r = c.request("agents", json::object(), timeout);
      if (as_json) {
        std::cout << r["agents"].dump() << std::endl;
      } else {
        for (const auto& a : r["agents"]) {
          std::cout << std::left << std::setw(14) << a.value("agent", "") << std::setw(9) << a.value("state", "")
                    << std::setw(16) << a.value("address", "") << a.value("free_cores", 0) << "/"
                    << a.value("cores", 0) << " cores free  " << a.value("memory_mb", 0) << " MiB  "
                    << a.value("hardware_class", "") << std::endl;
        }
      }
      return kExitOk;
    }
  } catch (const dltrain::control::AuthError& e) {
    std::cerr << "dltrain: " << e.what() << ": check --token, DLTRAIN_TOKEN or the client config (from "
              << target.source << ")\n";
    return kExitBadInput;
  } catch (const dltrain::control::RemoteError& e) {
    std::cerr << "dltrain: the leader rejected the request: " << e.what() << " [" << e.code() << "]\n";
    return kExitBadInput;
  } catch (const dltrain::TimeoutError& e) {
    std::cerr << "dltrain: cannot reach the leader at " << target.leader << " (from " << target.source
              << "): " << e.what() << "\n";
    return kExitNoLeader;
  } catch (const dltrain::IoError& e) {
    std::cerr << "dltrain: cannot reach the leader at " << target.leader << " (from " << target.source
              << "): " << e.what() << "\n";
    return kExitNoLeader;
  } catch (const std::exception& e) {
    std::cerr << "dltrain: " << e.what() << "\n";
    return kExitBadInput;
  }
  return kExitOk;
}
