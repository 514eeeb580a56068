// The command lines of the two task executables, dltrain-ps and dltrain-worker: one
// definition that the agent builds them from (agent/agent.cpp, to_argv) and that the
// tasks parse them with (daemon/ps_main.cpp and daemon/worker_main.cpp, add_to). With the
// events a task prints (wire/task_events.h) this is the whole agent ↔ task interface.
// A task can also be started by hand with these flags, for debugging.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "common/sync_mode.h"

namespace CLI {
class App;
}

namespace dltrain::wire {

/// dltrain-ps: one PS shard of one job.
struct PsTaskArgs {
  std::uint64_t job_id = 0;          ///< --job-id (required): the job's number
  std::uint32_t generation = 0;      ///< --generation: the job's generation
  std::string secret_file;           ///< --secret-file (required): the job secret, hex, mode 0600
  int shard = 0;                     ///< --shard: shard index, 0-based
  double momentum = 0.9;             ///< --momentum: heavy-ball momentum, [0, 1)
  int threads = 1;                   ///< --threads: I/O threads, [1, 1024]
  std::string bind = "0.0.0.0";      ///< --bind: address to listen on
  std::uint16_t port = 0;            ///< --port: 0 = ephemeral (a restart asks for its old one)
  std::string checkpoint;            ///< --checkpoint: file loaded at start, written periodically; "" = none
  double checkpoint_interval_s = 10; ///< --checkpoint-interval: seconds, [0.1, 86400]
  std::vector<std::uint32_t> workers_done;  ///< --workers-done: ranks that already finished
  double stats_interval_s = 5;       ///< --stats-interval: seconds between ps_stats events, [0.1, 86400]
  ps::SyncMode sync = ps::SyncMode::kAsync;  ///< --sync: async | ssp | sync (ps/sync.h)
  int staleness = 0;                 ///< --staleness: ssp's bound, steps, [0, 1000]
  int backup_workers = 0;            ///< --backup-workers: sync's backup workers, [0, 1023]
  double barrier_timeout_s = 30;     ///< --barrier-timeout: seconds, [0.1, 86400]
  /// --elastic-workers: an elastic job's members when the shard starts (ranks below it;
  /// ps/sync.h SyncOptions::initial_workers); 0 = the job is not elastic. [0, 1024]
  int elastic_workers = 0;
  std::string log_level = "info";    ///< --log-level

  /// `program` followed by the flags (defaults of optional ones left out).
  std::vector<std::string> to_argv(const std::string& program) const;
  /// Registers every flag on `app`, bound to these fields (which must outlive the parse).
  void add_to(CLI::App& app);
};

/// dltrain-worker: one worker of one job.
struct WorkerTaskArgs {
  std::string job_json;              ///< --job-json (required): the job specification file (JSON)
  std::uint64_t job_id = 0;          ///< --job-id (required)
  std::uint32_t generation = 0;      ///< --generation
  std::string secret_file;           ///< --secret-file (required)
  int rank = 0;                      ///< --rank (required): 0-based
  std::string ps;                    ///< --ps (required): HOST:PORT,... in shard order
  int threads = 1;                   ///< --threads: intra-op threads, [1, 1024]
  double ps_timeout_s = 0;           ///< --ps-timeout: seconds; 0 = the job's ps.timeout
  int resume_epoch = 0;              ///< --resume-epoch: after a restart, epochs already finished
  double progress_interval_s = 0;    ///< --progress-interval: seconds between progress events; 0 = 5
  std::string replica_file;          ///< --replica-file: where SIGTERM saves the replica
  std::string init_replica;          ///< --init-replica: initialise the PS shards from this replica
  std::string trace_file;            ///< --trace-file: where the step timeline is kept ("" = none)
  std::string log_level = "info";    ///< --log-level
  /// --local-group-socket: the rendezvous of this worker's local group (a Unix socket
  /// path its member 0 listens on, at most 107 bytes, relative to the working directory or
  /// absolute; group/local_group.h); "" = not in a group.
  std::string local_group_socket;
  int local_group_rank = 0;          ///< --local-group-rank: [0, members)
  std::string local_group_members;   ///< --local-group-members: task names, comma-separated, by rank

  /// `program` followed by the flags (defaults of optional ones left out).
  std::vector<std::string> to_argv(const std::string& program) const;
  /// Registers every flag on `app`, bound to these fields (which must outlive the parse).
  void add_to(CLI::App& app);
  /// The PS shards' endpoints from `ps`. Throws ConfigError("--ps", ...) naming the item.
  std::vector<HostPort> endpoints() const;
};

}  // namespace dltrain::wire
