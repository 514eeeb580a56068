// How an agent turns a leader's start_task request into a task process: the task's
// directory (<state_dir>/tasks/<job>/<task>-g<generation>), its secret file, its job
// specification, the state it takes over from an earlier generation, and its command line
// (wire/task_args.h). Plain functions over the file system, no event loop.
#pragma once

#include <optional>
#include <string>

#include "config/options.h"
#include "wire/task_kind.h"
#include "agent/supervisor.h"
#include "wire/control_bodies.h"
#include "wire/task_args.h"

namespace dltrain::agent {

/// A task ready to be spawned, and what its restarts need.
struct TaskLaunch {
  std::string job;                   ///< "job-3"
  std::string name;                  ///< "ps-0", "worker-1"
  wire::TaskKind kind = wire::TaskKind::kWorker;
  std::uint32_t generation = 0;
  int threads = 1;
  std::vector<int> gpus;             ///< GPU indices it was given (its CUDA_VISIBLE_DEVICES)
  std::string secret_path;           ///< the job secret's file (mode 0600), removed when the task ends
  std::optional<wire::PsTaskArgs> ps;          ///< a PS shard
  std::optional<wire::WorkerTaskArgs> worker;  ///< a worker
  ProcessSpec process;               ///< argv of the first start, log file, working directory

  /// The process of a restart: a worker resumes after `epochs_done` epochs; a PS shard
  /// listens on `port` again (0 = a fresh one, when it died before it listened).
  ProcessSpec restart(int epochs_done, int port) const;
};

/// Prepares the task that `start_task` (the leader's request body, checked by
/// wire::parse_body: job and task names that are path components, a valid secret and
/// spec, ...; see docs/protocol.md) asks for: creates its directory, writes the secret
/// file (0600) and a worker's job.json, copies a shard's stop checkpoint from its earlier
/// generation's directory. Throws IoError naming the path when a file cannot be written
/// or a worker's replica to start from is missing.
TaskLaunch prepare_task(const config::AgentOptions& opt, const wire::StartTaskBody& start_task);

/// Where task `name` of `generation` of `job` keeps its log (its stderr):
/// <state_dir>/tasks/<job>/<name>-g<generation>/task.log, rotated to task.log.1.
std::string task_log_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                          std::uint32_t generation);

/// The step timeline a worker keeps in its task directory (wire/step_trace.h).
inline constexpr const char* kStepTraceFile = "step_trace.json";

/// Where worker `name` of `generation` of `job` keeps its step timeline:
/// <state_dir>/tasks/<job>/<name>-g<generation>/step_trace.json (read by `dltrain trace`).
std::string step_trace_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                            std::uint32_t generation);

/// Where worker `name` of `generation` of `job` wrote the file `file` (wire::kModelFiles)
/// of the trained model's checkpoint `checkpoint`: model/ in its task directory for
/// "last" (daemon/worker_main.cpp), model-<checkpoint>/ for the others ("best",
/// "epoch-N"). `checkpoint` must be a safe path component (the request's check).
std::string model_file_path(const config::AgentOptions& opt, const std::string& job, const std::string& name,
                            std::uint32_t generation, const std::string& checkpoint, const std::string& file);

}  // namespace dltrain::agent
