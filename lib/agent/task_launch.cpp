#include "agent/task_launch.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "job/job_spec.h"
#include "common/secret.h"

namespace dltrain::agent {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The directory of `name` in `generation` of `job`.
fs::path task_dir(const config::AgentOptions& opt, const std::string& job, const std::string& name, std::uint32_t generation) {
  return fs::path(opt.state_dir) / "tasks" / job / (name + "-g" + std::to_string(generation));
}

}  // namespace

std::string task_log_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                          std::uint32_t generation) {
  return (task_dir(opt, job, name, generation) / "task.log").string();
}

std::string step_trace_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                            std::uint32_t generation) {
  return (task_dir(opt, job, name, generation) / kStepTraceFile).string();
}

std::string model_file_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                            std::uint32_t generation, const std::string& checkpoint, const std::string& file) {
  return (task_dir(opt, job, name, generation) / (checkpoint == "last" ? "model" : "model-" + checkpoint) / file).string();
}

namespace {

// A re-assigned job (generation > 1): the directory this task had in an earlier
// generation (`generation`, a field of the request) holds the state it saved when stopped.
std::optional<fs::path> earlier_dir(const config::AgentOptions& opt, const wire::StartTaskBody& b,
                                    const std::optional<std::uint32_t>& generation) {
  if (!generation) return std::nullopt;
  return task_dir(opt, b.job, b.task, *generation);
}

void write_job_json(const fs::path& path, const JobSpec& spec) {
  std::ofstream out(path);
  out << json(spec).dump(2);
  out.close();
  if (!out) throw IoError("cannot write the job specification " + path.string());
}

wire::PsTaskArgs ps_args(const config::AgentOptions& opt, const wire::StartTaskBody& b, const fs::path& dir,
                         const std::string& secret) {
  wire::PsTaskArgs a;
  a.job_id = b.job_num;
  a.generation = b.generation;
  a.secret_file = secret;
  a.shard = b.index;
  const JobSpec& spec = b.spec;
  a.momentum = ps_momentum(spec);
  a.sync = spec.sync;
  a.staleness = spec.staleness;
  a.backup_workers = spec.backup_workers;
  a.barrier_timeout_s = effective_barrier_timeout(spec);
  if (spec.elastic.on()) a.elastic_workers = spec.workers;
  a.threads = b.threads;
  a.bind = opt.task_bind_address;
  a.checkpoint = (dir / "shard.ckpt").string();
  a.checkpoint_interval_s = static_cast<double>(opt.ps_checkpoint_interval.count()) / 1000.0;
  a.stats_interval_s = static_cast<double>(opt.progress_interval.count()) / 1000.0;
  a.log_level = opt.log_level;
  if (const auto old_dir = earlier_dir(opt, b, b.restore_generation)) {
    // The shard's checkpoint from before the re-assignment (written when it was stopped);
    // the new shard loads it before it listens.
    std::error_code ec;
    const auto from = *old_dir / "shard.ckpt";
    if (fs::exists(from, ec)) {
      fs::copy_file(from, dir / "shard.ckpt", fs::copy_options::overwrite_existing, ec);
      if (ec) throw IoError("cannot copy " + from.string() + ": " + ec.message());
      fs::permissions(dir / "shard.ckpt", fs::perms::owner_read | fs::perms::owner_write, ec);
    }
  }
  a.workers_done = b.workers_done;
  return a;
}

wire::WorkerTaskArgs worker_args(const config::AgentOptions& opt, const wire::StartTaskBody& b, const fs::path& dir,
                                 const std::string& secret) {
  wire::WorkerTaskArgs a;
  a.job_json = (dir / "job.json").string();
  write_job_json(a.job_json, b.spec);
  a.job_id = b.job_num;
  a.generation = b.generation;
  a.secret_file = secret;
  a.rank = b.index;
  for (const auto& e : b.ps) a.ps += (a.ps.empty() ? "" : ",") + e;
  a.threads = b.threads;
  a.replica_file = (dir / "replica.ckpt").string();
  a.trace_file = (dir / kStepTraceFile).string();
  a.progress_interval_s = static_cast<double>(opt.progress_interval.count()) / 1000.0;
  a.log_level = opt.log_level;
  if (const auto old_dir = earlier_dir(opt, b, b.init_replica_generation)) {
    std::error_code ec;
    const auto from = *old_dir / "replica.ckpt";
    if (!fs::exists(from, ec)) throw IoError("the replica to rebuild the job from, " + from.string() + ", is missing");
    a.init_replica = from.string();
  }
  a.resume_epoch = b.resume_epoch;
  if (b.local_group) {
    // One socket per job and generation on this agent, in the job's directory: every
    // member names the same file; member 0 listens there (never a TCP port). Relative to
    // the task's working directory (its task directory), as a Unix socket's path may hold
    // only 107 bytes and a state_dir can be long.
    a.local_group_socket = "../local-group-g" + std::to_string(b.generation) + ".sock";
    a.local_group_rank = b.local_group->rank;
    for (const auto& m : b.local_group->members) {
      a.local_group_members += (a.local_group_members.empty() ? "" : ",") + m;
    }
  }
  return a;
}

}  // namespace

ProcessSpec TaskLaunch::restart(int epochs_done, int port) const {
  ProcessSpec p = process;
  if (worker) {
    auto a = *worker;
    a.resume_epoch = epochs_done;
    p.argv = a.to_argv(process.argv.at(0));
  } else if (ps) {
    // The same port (the shard binds it with SO_REUSEADDR): the workers and the leader
    // keep their endpoint.
    auto a = *ps;
    a.port = static_cast<std::uint16_t>(port);
    p.argv = a.to_argv(process.argv.at(0));
  }
  return p;
}

TaskLaunch prepare_task(const config::AgentOptions& opt, const wire::StartTaskBody& b) {
  TaskLaunch t;
  t.job = b.job;
  t.name = b.task;
  t.kind = b.kind;
  t.generation = b.generation;
  t.threads = b.threads;
  t.gpus = b.gpus;
  // Every task sees only the GPUs it was given: none for a PS shard or a CPU worker (so
  // that a CUDA-enabled LibTorch in it cannot take a GPU another task holds).
  std::string visible;
  for (const int g : t.gpus) visible += (visible.empty() ? "" : ",") + std::to_string(g);
  t.process.env.emplace_back("CUDA_VISIBLE_DEVICES", visible);
  // The indices are NVML's, which number GPUs by PCI bus; CUDA numbers them so only with
  // this (its default puts the fastest first), and a worker must open the GPU it was given.
  t.process.env.emplace_back("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
  // The job secret reaches the task as a 0600 file in its directory, never on its command
  // line (which every local user can read in /proc).
  const fs::path dir = task_dir(opt, t.job, t.name, t.generation);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create task directory " + dir.string() + ": " + ec.message());
  t.secret_path = (dir / "job.secret").string();
  write_private_file(t.secret_path, b.secret + "\n");
  t.process.log_path = task_log_path(opt, t.job, t.name, t.generation);
  t.process.work_dir = dir.string();
  try {
    if (t.kind == wire::TaskKind::kPs) {
      t.ps = ps_args(opt, b, dir, t.secret_path);
      t.process.argv = t.ps->to_argv((fs::path(opt.task_bin_dir) / "dltrain-ps").string());
    } else {
      t.worker = worker_args(opt, b, dir, t.secret_path);
      t.process.argv = t.worker->to_argv((fs::path(opt.task_bin_dir) / "dltrain-worker").string());
    }
  } catch (...) {
    fs::remove(t.secret_path, ec);
    throw;
  }
  return t;
}

}  // namespace dltrain::agent
