// The worker task's training loop: LibTorch forward/backward, the exchange with the PS
// shards (dense ASGD, or top-k sparsified, momentum-corrected pushes and the PS's sparse
// downlink; ps/exchange.h), per-epoch evaluation of the PS's parameters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "ps/client.h"
#include "group/local_group.h"

namespace dltrain::train {

/// Everything one worker needs; filled by the worker executable from its arguments.
struct WorkerConfig {
  JobSpec spec;
  std::uint64_t job = 0;
  std::uint32_t generation = 0;
  std::vector<std::uint8_t> secret;  ///< the job secret (raw bytes), proven to each PS shard
  int rank = 0;                      ///< [0, spec.workers)
  int threads = 1;                   ///< intra-op threads given to LibTorch
  std::vector<ps::PsEndpoint> shards;  ///< one per PS shard, in shard order
  std::chrono::milliseconds ps_timeout{60000};     ///< bound on the PS's silence within a call
  std::chrono::seconds finish_timeout{1800};       ///< rank 0's wait for the other workers
  double progress_interval_s = 5.0;  ///< seconds between progress events
  int resume_epoch = 0;              ///< after a restart: epochs already finished, [0, epochs)
  /// Set (from a SIGTERM handler) to ask the worker to stop: it saves its replica to
  /// `replica_path` (if any, and only once it holds the PS's parameters) and throws
  /// Stopped. Checked before every step and every 100 ms inside PS calls. Must outlive
  /// run_worker.
  const std::atomic<bool>* stop_requested = nullptr;
  /// Elastic jobs: set (from a SIGUSR1 handler) to ask the worker to leave the job (a
  /// scale-down): after its current step it tells the shards it leaves, gives back its
  /// unfinished data chunks, reports "left" and run_worker returns -1. Checked after every
  /// step. May be null; must outlive run_worker.
  const std::atomic<bool>* leave_requested = nullptr;
  /// Where a stopped worker saves its parameter replica (ps::write_replica_file); "" = not saved.
  std::string replica_path;
  /// A replica saved by a stopped worker of an earlier generation of this job: offered to
  /// the PS shards as the initial parameters instead of the seeded ones (a shard that
  /// restored its own checkpoint keeps its values). "" = the seeded initialisation.
  std::string init_replica_path;
  /// Where the worker keeps its step timeline (wire/step_trace.h, write_step_trace),
  /// rewritten every `trace_interval_s` and when it ends; "" = no timeline is kept.
  std::string trace_path;
  std::size_t trace_steps = 1000;  ///< steps the timeline keeps, [1, 4096] (~130 bytes each on disk)
  double trace_interval_s = 5.0;   ///< seconds between two writes of the timeline
  /// Rank 0: where the trained model goes when the job ends (save_model_artifact); "" =
  /// nowhere. The worker executable sets it to model/ in its task directory.
  std::string artifact_dir;
  /// This worker's local group (group/local_group.h; spec.local_group): the workers of
  /// the job on this machine. Absent = none: the worker pushes and pulls for itself.
  std::optional<group::LocalGroupOptions> local_group;
};

/// run_worker gave up because WorkerConfig::stop_requested became true. The "stopped"
/// event it sent last says whether, where and at which step the replica was saved.
class Stopped : public Error {
 public:
  using Error::Error;
};

/// Receives the worker's events (one JSON object each, built from wire/task_events.h:
/// started, progress, epoch_end, done, stopped, skipped_step, ps_resync, profile,
/// replica_loaded). Called on the training thread.
using ProgressSink = std::function<void(const nlohmann::json&)>;

/// Learning rate at training progress `epoch_pos` (epochs completed, fractional, in
/// [0, epochs]): linear warm-up from lr/10 over `warmup_epochs` (Goyal et al. 2017,
/// "Accurate, Large Minibatch SGD", §2.2), then constant, cosine to 0
/// (Loshchilov & Hutter 2017, SGDR, eq. 5 without restarts) or step (×0.1 at 50% and 75%
/// of training).
double learning_rate(const OptimizerSpec& opt, double epoch_pos, int epochs);

/// Trains worker `cfg.rank` to the end of the job. Rank 0 also evaluates the PS's
/// parameters on the test set after every epoch (after the last one, once every worker
/// has finished) and reports `test_accuracy` in its "epoch_end" events.
/// Returns the final test accuracy (rank 0) or -1 (other ranks).
/// Throws ConfigError/ProtocolError/IoError from loading data (or the init replica),
/// IoError/TimeoutError from the PS, Error when a loss turns NaN/Inf, Stopped when asked
/// to stop.
double run_worker(const WorkerConfig& cfg, const ProgressSink& sink);

}  // namespace dltrain::train
