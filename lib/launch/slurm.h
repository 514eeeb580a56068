// The Slurm launcher's decisions (docs/slurm.md): what an allocation granted, read from
// the environment Slurm gives a batch script and each step's tasks; its node list
// expanded by Slurm itself (`scontrol show hostnames`) and the nodes' addresses
// (`scontrol show node`); the settings the launcher hands every node's step; the agent
// configuration each node runs; and whether a job can run on what the agents offer.
// Processes (srun, the agents, the job) are started by client/slurm.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "launch/command.h"

namespace dltrain {
struct JobSpec;
}

namespace dltrain::launch {

/// The launcher cannot go on: not inside an allocation, a Slurm variable it needs is
/// missing or malformed, scontrol failed, or a job does not fit what Slurm granted.
/// The message names the variable, the command or the job file and says what to do.
class LaunchError : public Error {
 public:
  using Error::Error;
};

/// Runs a command to its end (run_command, or a test's stand-in that still runs the real
/// program with a different environment).
using CommandRunner = std::function<CommandResult(const std::vector<std::string>& argv)>;

/// run_command with a 60 s bound.
CommandRunner default_runner();

/// The allocation as the batch script (or an salloc shell) sees it.
struct SlurmJob {
  std::string job_id;      ///< SLURM_JOB_ID
  std::string nodelist;    ///< SLURM_JOB_NODELIST, Slurm's compressed hostlist ("gpu[01-04]")
  int num_nodes = 0;       ///< SLURM_JOB_NUM_NODES (or the older SLURM_NNODES), ≥ 1
  std::string submit_dir;  ///< SLURM_SUBMIT_DIR ("" when unset)
};

/// Reads the allocation from `env`. Throws LaunchError naming the variable when
/// SLURM_JOB_ID or SLURM_JOB_NODELIST is missing (with the hint that the launcher runs
/// inside sbatch or salloc), or when the node count is missing or not a positive integer.
SlurmJob read_slurm_job(const Environment& env);

/// The host names of a Slurm hostlist expression, in Slurm's order, from
/// `scontrol show hostnames LIST` (the hostlist grammar is Slurm's, so it is Slurm that
/// expands it). Throws LaunchError with scontrol's own message when it fails (a malformed
/// list, no Slurm configuration) or prints nothing.
std::vector<std::string> expand_hostlist(const std::string& hostlist, const CommandRunner& run);

/// Each node's address as Slurm reaches it (NodeAddr; NodeHostName when that is absent),
/// from one `scontrol show node -o LIST`, as an IP address: a host name (what Slurm
/// reports when NodeAddr is unset) is resolved here (numeric_address), since the agents
/// bind and advertise IP addresses. Throws LaunchError naming the node when scontrol
/// fails, does not list one of `nodes`, or its address does not resolve.
std::map<std::string, std::string> node_addresses(const std::vector<std::string>& nodes, const std::string& hostlist,
                                                  const CommandRunner& run);

/// `address` itself when it is an IPv4 or IPv6 literal; otherwise the first IPv4 address it
/// resolves to (getaddrinfo), else the first IPv6 one. Throws LaunchError naming `node`,
/// the address and the resolver's reason when it does not resolve.
std::string numeric_address(const std::string& node, const std::string& address);

/// Parses `scontrol show node -o` output (one node per line, `Key=Value` pairs separated
/// by spaces) into node name → its `key` value (e.g. "NodeAddr", "State").
std::map<std::string, std::string> scontrol_node_field(const std::string& scontrol_out, const std::string& key);

/// What Slurm granted one step task on its node (read on that node).
struct NodeGrant {
  std::string node;  ///< SLURMD_NODENAME
  int node_id = 0;   ///< SLURM_NODEID: 0 on the allocation's first node
  int cpus = 0;      ///< SLURM_CPUS_ON_NODE, ≥ 1
  /// The GPUs granted on this node as indices (SLURM_STEP_GPUS, else SLURM_JOB_GPUS, else
  /// CUDA_VISIBLE_DEVICES when it is a list of indices); empty = none (Slurm granted none,
  /// or set CUDA_VISIBLE_DEVICES to "NoDevFiles").
  std::vector<int> gpus;
  std::int64_t memory_mb = 0;  ///< SLURM_MEM_PER_NODE (MiB); 0 when unset
};

/// Reads `env` of a step task. Throws LaunchError naming the variable that is missing or
/// malformed (a GPU list that is not comma-separated non-negative integers, say).
NodeGrant read_node_grant(const Environment& env);

/// The NVML indices a node's agent offers for the GPUs Slurm granted (`granted`: Slurm's
/// numbers, SLURM_STEP_GPUS or SLURM_JOB_GPUS) when NVML sees `visible` GPUs inside the
/// step. A device-constrained step (cgroup.conf ConstrainDevices=yes) sees only its own
/// GPUs, numbered from 0: when `visible` equals the number granted, all of them
/// (0 … n−1). An unconstrained step sees the whole node, numbered as Slurm numbers them
/// (gres.conf AutoDetect=nvml, or File= in PCI order): then the granted numbers. Throws
/// LaunchError when neither holds (fewer GPUs visible than granted, or a granted number
/// NVML does not have), saying both.
std::vector<int> nvml_indices_of_grant(const std::vector<int>& granted, int visible);

/// The port of the leader of Slurm job `job_id` when none is given: 20000 + job_id mod
/// 40000, so that allocations that share their first node (without --exclusive) do not
/// collide. A job id that is not a number gives 7070.
std::uint16_t port_for_job(const std::string& job_id);

/// The launcher's decisions, handed to every node's step through its environment
/// (variables DLTRAIN_SLURM_*; the tokens never appear on a command line).
struct LaunchPlan {
  std::string job_id;                           ///< the Slurm job
  std::string leader_node;                      ///< the allocation's first node
  std::uint16_t port = 7070;                    ///< the leader's control port on it
  std::map<std::string, std::string> addresses;  ///< node → address (node_addresses)
  std::string agent_token;                      ///< 64 hex characters, new per allocation
  std::string client_token;                     ///< 64 hex characters, new per allocation
  /// Node-local directory under which each agent keeps its state
  /// (`<state_root>/dltrain-slurm-<job>/<node>`), removed when the agent ends.
  std::string state_root = "/tmp";
  /// The leader's state directory when it must outlive the allocation (the planner's
  /// history on a shared file system); "" = under state_root, removed with it.
  std::string leader_state_dir;
  /// How often each node's step asks Slurm for its node's state, to stop its agent when
  /// the node is drained; 0 = never.
  std::chrono::seconds drain_poll{30};
  std::string agent_log_level = "warn";  ///< the agents' log_level

  /// ws://ADDRESS:PORT of the leader.
  std::string leader_url() const;
  /// The DLTRAIN_SLURM_* variables that carry this plan.
  Environment to_environment() const;
  /// Reads a plan back. Throws LaunchError naming the missing or malformed variable.
  static LaunchPlan from_environment(const Environment& env);
};

/// The agent configuration (TOML, the keys of configs/agent.toml) node `g.node` runs
/// under `plan`, its tokens in files of `state_dir`: the first node is the leader and
/// hosts tasks too; every agent offers exactly the cores, GPUs and memory Slurm granted
/// it and advertises its Slurm address; metrics on 127.0.0.1 at an ephemeral port.
/// Throws LaunchError when `plan` has no address for the node.
std::string agent_config_toml(const LaunchPlan& plan, const NodeGrant& g, const std::string& state_dir);

/// What one registered agent offers, from `dltrain agents`.
struct AgentOffer {
  std::string name;
  int cores = 0;
  int gpus = 0;
};

/// Checks that `spec` can run on `agents` (the whole allocation: no agent will join), by
/// the leader's own placement rule (whole tasks per node): (workers + PS shards) ×
/// threads_per_task cores in all, threads_per_task on one agent, and workers + PS shards
/// tasks in Σ floor(cores / threads_per_task) over the agents; for device = "cuda" also
/// workers × gpus_per_worker GPUs and workers in Σ floor(gpus / gpus_per_worker).
/// With workers = "auto" one worker must fit (the planner chooses within what fits).
/// Throws LaunchError naming `job_file`, what the job needs, what each agent offers, and
/// which sbatch options ask for more.
void check_job_fits(const JobSpec& spec, const std::vector<AgentOffer>& agents, const std::string& job_file);

}  // namespace dltrain::launch
