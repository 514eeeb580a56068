// dltrain-worker: one worker task of one job. Started by an agent, never by hand (but it
// can be, for debugging). Progress goes to stdout as JSON lines; logs to stderr. The job
// secret it proves to the PS shards is read from --secret-file (mode 0600 or stricter).
// Exit code 2: a configuration error (e.g. a secret file readable by others); 143: stopped
// by SIGTERM (after saving its replica to --replica-file, when it held the PS's
// parameters); 1: any other failure. SIGUSR1 asks a worker of an elastic job to leave it
// after its current step (a scale-down); it then exits 0.
#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/native_libs.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/secret.h"
#include "train/trainer.h"
#include "wire/task_args.h"
#include "wire/task_events.h"

namespace {

// The task's last words on stdout, for its agent and the leader.
void print_error(const std::exception& e) {
  dltrain::wire::events::write_line(std::cout, dltrain::wire::events::TaskError::of(e).to_json());
}

// Set by SIGTERM; the training loop and the PS client look at it (async-signal-safe: a
// lock-free atomic store).
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigterm(int) { g_stop.store(true, std::memory_order_relaxed); }

// Set by SIGUSR1: an elastic job's worker leaves after its step (WorkerConfig::leave_requested).
std::atomic<bool> g_leave{false};
extern "C" void on_sigusr1(int) { g_leave.store(true, std::memory_order_relaxed); }

}  // namespace

int main(int argc, char** argv) {
  // First of all: a leave request (SIGUSR1) must not find the default action, which kills.
  struct sigaction su {};
  su.sa_handler = on_sigusr1;
  sigemptyset(&su.sa_mask);
  sigaction(SIGUSR1, &su, nullptr);
  CLI::App app{"dltrain worker task: trains one shard of a job's data against its PS shards"};
  dltrain::wire::WorkerTaskArgs args;
  args.add_to(app);
  CLI11_PARSE(app, argc, argv);
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  dltrain::train::WorkerConfig cfg;
  cfg.stop_requested = &g_stop;
  cfg.leave_requested = &g_leave;
  cfg.job = args.job_id;
  cfg.generation = args.generation;
  cfg.rank = args.rank;
  cfg.threads = args.threads;
  cfg.resume_epoch = args.resume_epoch;
  if (args.progress_interval_s > 0) cfg.progress_interval_s = args.progress_interval_s;
  cfg.replica_path = args.replica_file;
  cfg.init_replica_path = args.init_replica;
  cfg.trace_path = args.trace_file;
  // The agent starts a task in its task directory: rank 0 leaves the trained model there.
  if (cfg.rank == 0) cfg.artifact_dir = (std::filesystem::current_path() / "model").string();
  try {
    dltrain::init_logging("worker-" + std::to_string(cfg.rank), args.log_level);
    // docs/training.md, "CPU speed: malloc and BLAS".
    if (!dltrain::allocator_is_tcmalloc()) {
      spdlog::warn("this worker runs on {} (built with DLTRAIN_ALLOCATOR=system): evaluation and large batches run "
                   "several times slower on it (docs/training.md, \"CPU speed: malloc and BLAS\")",
                   dltrain::allocator_name());
    }
    if (dltrain::blas_is_reference()) {
      spdlog::warn("LibTorch's libblas.so.3 is the reference BLAS: matrix products run ~20x slower than on "
                   "OpenBLAS; install libopenblas0-openmp (docs/training.md, \"CPU speed: malloc and BLAS\")");
    }
    cfg.secret = dltrain::read_job_secret_file(args.secret_file, "--secret-file");
    std::ifstream in(args.job_json);
    if (!in) throw dltrain::IoError("cannot open job specification \"" + args.job_json + "\"");
    cfg.spec = dltrain::job_from_json(nlohmann::json::parse(in));
    for (const auto& e : args.endpoints()) cfg.shards.push_back({e.host, e.port});
    if (!args.local_group_socket.empty()) {
      dltrain::group::LocalGroupOptions g;
      g.socket_path = args.local_group_socket;
      g.rank = args.local_group_rank;
      std::stringstream names(args.local_group_members);
      for (std::string m; std::getline(names, m, ',');) g.members.push_back(m);
      if (g.rank >= static_cast<int>(g.members.size())) {
        throw dltrain::ConfigError("--local-group-rank", "rank " + std::to_string(g.rank) + " of a group of " +
                                                             std::to_string(g.members.size()) + " members");
      }
      g.job = cfg.job;
      g.generation = cfg.generation;
      // A member waits for the others while member 0 evaluates after an epoch: bounded,
      // generously, by ten times the PS timeout (docs/gpu.md, "Local groups").
      cfg.local_group = std::move(g);
    }
    const double timeout_s = args.ps_timeout_s > 0 ? args.ps_timeout_s : cfg.spec.ps_timeout_seconds;
    cfg.ps_timeout = std::chrono::milliseconds(std::llround(timeout_s * 1000.0));
    // A member waits for the others while member 0 evaluates after an epoch: bounded,
    // generously, by ten times the PS timeout (docs/gpu.md, "Local groups").
    if (cfg.local_group) cfg.local_group->timeout = 10 * cfg.ps_timeout;
    if (static_cast<int>(cfg.shards.size()) != cfg.spec.ps_shards) {
      throw dltrain::ConfigError("--ps", std::to_string(cfg.shards.size()) + " endpoints for " +
                                             std::to_string(cfg.spec.ps_shards) + " PS shards");
    }
    // Every event also goes to the task's log (stderr), so that the log says what the
    // worker was doing when it ended, however it ended (`dltrain status` shows its tail).
    dltrain::train::run_worker(cfg, [](const nlohmann::json& ev) {
      dltrain::wire::events::write_line(std::cout, ev);
      spdlog::info("{}", ev.dump());
    });
    return 0;
  } catch (const dltrain::train::Stopped& e) {
    spdlog::info("{}", e.what());
    return 143;
  } catch (const dltrain::ConfigError& e) {
    spdlog::error("{}", e.what());
    print_error(e);
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    print_error(e);
    return 1;
  }
}
