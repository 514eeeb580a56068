// control_load: a control-plane load generator for one real dltrain leader.
//
// It opens real WebSocket sessions to the leader with the project's control client
// (control/client.h) and speaks the real protocol (wire/control.h, wire/task_events.h):
// N simulated agents register, heartbeat and run the tasks the leader assigns them
// without processes (reporting the events a PS shard or worker reports, so that jobs
// finish), M simulated clients send list / status / follow requests and submit small
// jobs. It prints one JSON object: request latencies per kind, heartbeat round trips,
// the agents the leader declared lost, errors, jobs, and the leader's memory and CPU
// (with --leader-pid). bench/load/run.py runs it over a grid; bench/load/README.md
// describes the fields.
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <CLI/CLI.hpp>

#include "common/errors.h"
#include "common/log.h"
#include "common/secret.h"
#include "load/driver.h"

namespace fs = std::filesystem;
using dltrain::load::json;

namespace {

// Sessions need a descriptor each: raises the soft limit towards the hard one.
void raise_fd_limit(std::size_t needed) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur >= needed) return;
  rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, std::max<rlim_t>(needed, rl.rlim_cur));
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < needed) {
    throw dltrain::ConfigError("--agents", std::to_string(needed) + " file descriptors are needed and the hard limit "
                                           "is " + std::to_string(rl.rlim_max) + " (raise it: ulimit -Hn)");
  }
}

// A data directory the leader accepts (it checks that the four IDX files exist; the
// simulated tasks read nothing): empty files in a new temporary directory.
std::string make_data_dir() {
  std::string tmpl = (fs::temp_directory_path() / "dltrain-load-data-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw dltrain::IoError("cannot create a temporary data directory");
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"}) {
    std::ofstream(fs::path(tmpl) / f);
  }
  return tmpl;
}

std::string job_toml(const dltrain::load::LoadOptions& o) {
  return "name = \"load\"\nmodel = \"cnn\"\ndataset = \"fashion-mnist\"\ndata_dir = \"" + o.data_dir +
         "\"\nepochs = " + std::to_string(o.job_epochs) + "\nworkers = " + std::to_string(o.job_workers) +
         "\nps_shards = " + std::to_string(o.job_ps) +
         "\nbatch_size = 64\nthreads_per_task = 1\ntrain_samples = 12000\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "control_load: control-plane load on one real dltrain leader. Opens --agents simulated agent sessions\n"
      "(register, heartbeat at the leader's interval, run assigned tasks by reporting a real task's events\n"
      "on a timer, no processes) and --clients client sessions (status / list / follow, one at a time with\n"
      "--client-interval seconds of think time, and jobs submitted at --submit-rate), measures for --duration\n"
      "seconds after every session is up, waits for the submitted jobs to end, and prints one JSON object\n"
      "(or writes it to --out).\n"
      "Exit code 0: no error, no agent lost, every job succeeded; 1 otherwise; 2 bad arguments.\n"
      "Example: control_load --leader-file STATE/leader.json --agent-token-file agent.token\n"
      "         --client-token-file client.token --agents 100 --clients 10 --duration 30 --leader-pid PID"};
  dltrain::load::LoadOptions o;
  std::string leader_file, agent_token_file, client_token_file, out;
  auto* url = app.add_option("--leader", o.leader_url, "leader URL, ws://HOST:PORT");
  app.add_option("--leader-file", leader_file,
                 "or: the leader.json a leader writes in its state_dir (its URL, for listen_port = 0)")
      ->excludes(url);
  app.add_option("--agent-token-file", agent_token_file, "file holding the agent token (mode 0600)")->required();
  app.add_option("--client-token-file", client_token_file, "file holding the client token (mode 0600)")->required();
  app.add_option("--agents", o.agents, "simulated agents")->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--cores-per-agent", o.cores_per_agent, "cores each agent registers with")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--clients", o.clients, "simulated clients")->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--duration", o.duration, "seconds measured once every session is up")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--ramp-timeout", o.ramp_timeout, "seconds for every session to come up")->capture_default_str();
  app.add_option("--drain-timeout", o.drain_timeout, "seconds for the submitted jobs to end after the window")
      ->capture_default_str();
  app.add_option("--connect-rate", o.connect_rate, "sessions opened per second in the ramp")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--client-interval", o.client_interval, "a client's mean think time, seconds from a reply to its next request (one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  app.add_option("--weight-status", o.weight_status, "weight of status {job} among a client's requests")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--weight-list", o.weight_list, "weight of list")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--weight-follow", o.weight_follow, "weight of follow {job} (of a running job, until its summary)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--submit-rate", o.submit_rate, "jobs submitted per second, by random clients (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--submit-follow", o.submit_follow, "share of submits with follow = true")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--job-workers", o.job_workers, "workers per job")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--job-ps", o.job_ps, "PS shards per job")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--job-epochs", o.job_epochs, "epochs per job")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--epoch-seconds", o.epoch_seconds, "seconds a simulated worker takes per epoch")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 86400.0));
  app.add_option("--progress-interval", o.progress_interval,
                 "seconds between two progress events of a simulated worker (the agents' default)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 86400.0));
  app.add_option("--task-start", o.task_start, "seconds from start_task to a task's first event")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--data-dir", o.data_dir,
                 "data_dir of the submitted jobs, as the leader sees it (default: a temporary directory with four\n"
                 "empty IDX files, which a leader on this machine accepts)");
  app.add_option("--request-timeout", o.request_timeout, "seconds after which an unanswered request is an error")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--monitor-interval", o.monitor_interval, "seconds between two reads of the leader's agents")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--leader-pid", o.leader_pid, "the leader's pid: its memory and CPU are read from /proc");
  app.add_option("--name-prefix", o.name_prefix, "agents register as PREFIX-0, PREFIX-1, ...")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the clients' random choices")->capture_default_str();
  app.add_option("--out", out, "write the JSON here instead of standard output");
  CLI11_PARSE(app, argc, argv);

  bool own_data_dir = false;
  try {
    dltrain::init_logging("load", "warn");
    if (o.leader_url.empty() && leader_file.empty()) throw dltrain::ConfigError("--leader", "or --leader-file is required");
    if (!leader_file.empty()) {
      const auto j = json::parse(dltrain::read_file_text(leader_file, "--leader-file", "leader endpoint file"), nullptr,
                                 false);
      if (!j.is_object() || !j.contains("url") || !j["url"].is_string()) {
        throw dltrain::ConfigError("--leader-file", "\"" + leader_file + "\" holds no {\"url\": ...}");
      }
      o.leader_url = j["url"].get<std::string>();
    }
    dltrain::control::parse_leader_url(o.leader_url, "--leader");
    o.agent_token = dltrain::read_private_file(agent_token_file, "--agent-token-file");
    o.client_token = dltrain::read_private_file(client_token_file, "--client-token-file");
    raise_fd_limit(static_cast<std::size_t>(o.agents + o.clients) + 64);
    if (o.data_dir.empty()) {
      o.data_dir = make_data_dir();
      own_data_dir = true;
    }
  } catch (const std::exception& e) {
    std::cerr << "control_load: " << e.what() << "\n";
    return 2;
  }

  boost::asio::io_context io;
  dltrain::load::LoadRun run(io, o);
  dltrain::load::Driver driver(run, job_toml(o));
  driver.start();
  io.run();
  const json report = driver.report();
  if (own_data_dir) {
    std::error_code ec;
    fs::remove_all(o.data_dir, ec);
  }
  if (out.empty()) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::ofstream(out) << report.dump(2) << "\n";
  }
  const auto& lat = report["latency_ms"];
  auto p99 = [&](const char* k) { return lat.contains(k) ? lat[k]["p99"].get<double>() : 0.0; };
  std::cerr << "control_load: " << o.agents << " agents, " << o.clients << " clients: heartbeat p99 "
            << p99("heartbeat") << " ms, status p99 " << p99("status") << " ms, errors "
            << report["errors"]["total"] << ", lost " << report["agents_lost"]["lost"] << ", jobs "
            << report["jobs"]["succeeded"] << "/" << report["jobs"]["submitted"] << " succeeded"
            << (report["passed"].get<bool>() ? "" : " (FAILED)") << "\n";
  return report["passed"].get<bool>() ? 0 : 1;
}
