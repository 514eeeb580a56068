// dltrain-worker: one worker task of one job. Started by an agent, never by hand (but it
// can be, for debugging). Progress goes to stdout as JSON lines; logs to stderr. The job
// secret it proves to the PS shards is read from --secret-file (mode 0600 or stricter).
// Exit code 2: a configuration error (e.g. a secret file readable by others); 143: stopped
// by SIGTERM (after saving its replica to --replica-file, when it held the PS's
// parameters); 1: any other failure.
#include <atomic>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/secret.h"
#include "train/trainer.h"

namespace {

std::vector<dltrain::ps::PsEndpoint> parse_endpoints(const std::string& list) {
  std::vector<dltrain::ps::PsEndpoint> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == item.size()) {
      throw dltrain::ConfigError("--ps", "expected HOST:PORT[,HOST:PORT...], got \"" + item + "\"");
    }
    const int port = std::stoi(item.substr(colon + 1));
    if (port < 1 || port > 65535) throw dltrain::ConfigError("--ps", "port out of range in \"" + item + "\"");
    std::string host = item.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    out.push_back({host, static_cast<std::uint16_t>(port)});
  }
  return out;
}

// Set by SIGTERM; the training loop and the PS client look at it (async-signal-safe: a
// lock-free atomic store).
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigterm(int) { g_stop.store(true, std::memory_order_relaxed); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dltrain worker task: trains one shard of a job's data against its PS shards"};
  std::string spec_path, ps_list, secret_file, log_level = "info";
  dltrain::train::WorkerConfig cfg;
  double ps_timeout_s = 0;
  app.add_option("--job-json", spec_path, "job specification (JSON, as sent by the leader)")->required();
  app.add_option("--job-id", cfg.job, "numeric job id")->required();
  app.add_option("--generation", cfg.generation, "job generation");
  app.add_option("--secret-file", secret_file, "file holding the job secret (hex; mode 0600 or stricter)")
      ->required();
  app.add_option("--rank", cfg.rank, "worker rank, 0-based")->required();
  app.add_option("--ps", ps_list, "PS shard endpoints HOST:PORT, comma-separated, shard order")->required();
  app.add_option("--threads", cfg.threads, "intra-op threads")->check(CLI::Range(1, 1024));
  app.add_option("--ps-timeout", ps_timeout_s,
                 "seconds the PS shards may stay silent within a call (default: the job's ps.timeout)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--resume-epoch", cfg.resume_epoch, "after a restart: epochs already finished")->check(CLI::Range(0, 100000));
  app.add_option("--replica-file", cfg.replica_path,
                 "on SIGTERM, save the parameter replica here (for a re-assignment of the job)");
  app.add_option("--init-replica", cfg.init_replica_path,
                 "initialise the PS shards from this saved replica instead of the seeded parameters");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  cfg.stop_requested = &g_stop;
  try {
    dltrain::init_logging("worker-" + std::to_string(cfg.rank), log_level);
    cfg.secret = dltrain::read_job_secret_file(secret_file, "--secret-file");
    std::ifstream in(spec_path);
    if (!in) throw dltrain::IoError("cannot open job specification \"" + spec_path + "\"");
    cfg.spec = dltrain::job_from_json(nlohmann::json::parse(in));
    cfg.shards = parse_endpoints(ps_list);
    const double timeout_s = ps_timeout_s > 0 ? ps_timeout_s : cfg.spec.ps_timeout_seconds;
    cfg.ps_timeout = std::chrono::milliseconds(std::llround(timeout_s * 1000.0));
    if (static_cast<int>(cfg.shards.size()) != cfg.spec.ps_shards) {
      throw dltrain::ConfigError("--ps", std::to_string(cfg.shards.size()) + " endpoints for " +
                                             std::to_string(cfg.spec.ps_shards) + " PS shards");
    }
    dltrain::train::run_worker(cfg, [](const nlohmann::json& ev) {
      std::cout << ev.dump() << '\n' << std::flush;
    });
    return 0;
  } catch (const dltrain::train::Stopped& e) {
    spdlog::info("{}", e.what());
    return 143;
  } catch (const dltrain::ConfigError& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 1;
  }
}
