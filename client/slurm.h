// `dltrain slurm`: a dltrain cluster inside a Slurm allocation (docs/slurm.md). The
// launcher (run, serve) runs in the batch script or an salloc shell on the allocation's
// first node; it starts one agent per node with one srun step, the first node's agent
// being the leader, waits for every agent, writes the client settings, then runs a job
// to its end (run) or serves until the allocation ends (serve). `agent` is that step's
// task on each node. The decisions are lib/launch/slurm.h's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dltrain::client {

/// Options of `dltrain slurm run|serve|show`.
struct SlurmOptions {
  std::string job_file;            ///< run: the job to run to its end
  /// The leader's control port on the first node; 0 = launch::port_for_job (from the job id).
  std::uint16_t port = 0;
  /// Where the client settings (client.toml, client.token) go; "" =
  /// $SLURM_SUBMIT_DIR/dltrain-<job> (the current directory when that is unset).
  std::string dir;
  std::chrono::seconds form_timeout{120};  ///< every agent registered within this, or exit 3
  std::chrono::seconds stop_timeout{60};   ///< the agents' step ended within this after SIGTERM, or SIGKILL
  std::string state_root;          ///< node-local base of the agents' state; "" = $TMPDIR or /tmp
  std::string leader_state_dir;    ///< the leader's state outside the allocation (kept); "" = node-local
  std::chrono::seconds drain_poll{30};   ///< how often each node's step looks for a drain; 0 = never
  std::string agent_log_level = "warn";  ///< the agents' log level (their output is the step's)
  std::string srun = "srun";       ///< the srun program (name or path)
};

/// `dltrain slurm run JOB`: forms the cluster, checks that the job fits it, submits the job
/// and prints its progress, stops the agents, and returns the job's exit code (0
/// succeeded, 1 failed or cancelled: its reason is the last line), 2 for bad input (not in
/// an allocation, a bad job file, a job that does not fit), 3 when the cluster did not
/// form. Never throws.
int slurm_run(const SlurmOptions& opt, const std::string& self_exe);

/// `dltrain slurm serve`: forms the cluster, writes the client settings, and serves until
/// the agents' step ends (the allocation ends, scancel) or this process gets SIGTERM or
/// SIGINT, which stops the agents. Returns 0, 2 or 3 as slurm_run. Never throws.
int slurm_serve(const SlurmOptions& opt, const std::string& self_exe);

/// `dltrain slurm show`: what run and serve would do (nodes, leader, addresses; on a
/// step's node, what it was granted) without starting anything, as text or JSON.
/// Returns 0, or 2 with the reason. Never throws.
int slurm_show(const SlurmOptions& opt, bool as_json);

/// `dltrain slurm agent`: the srun step's task on one node. Writes the node's agent
/// configuration and tokens under its node-local state directory, runs `dltrain-agent`
/// (found next to `self_exe`) until it ends, forwarding SIGTERM/SIGINT/SIGHUP to it, stops
/// it when Slurm reports the node drained, removes the state directory, and returns the
/// agent's exit code (0 after a stop that was asked for), or 2 for a bad environment.
/// Never throws.
int slurm_agent(const std::string& self_exe);

}  // namespace dltrain::client
