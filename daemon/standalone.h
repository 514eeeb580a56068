// Standalone mode: a leader plus N local agents on loopback, for one machine.
#pragma once

#include <cstdint>
#include <string>

namespace dltrain::daemon {

/// Options of `dltrain-agent --standalone`.
struct StandaloneOptions {
  int agents = 3;            ///< agent processes to start, [1, 64]
  int cores_per_agent = 1;   ///< cores each agent offers, [1, 4096]
  /// The first agent's `gpus` setting ("none", "auto", or a TOML list such as "[0, 1]");
  /// the others offer none (they share one machine: one agent may claim its GPUs).
  std::string gpus = "none";
  std::string nvml_library;  ///< the first agent's nvml_library; "" = the default
  std::string state_dir;     ///< "" = a temporary directory, removed on exit
  std::uint16_t port = 0;    ///< leader control port on 127.0.0.1; 0 = ephemeral
  /// Each agent's ps_checkpoint_interval in seconds, [0.1, 86400]; 0 = the agent default
  /// (10 s). Tests set it so that a shard has checkpointed before they kill it.
  double ps_checkpoint_interval_s = 0;
  /// Each agent's progress_interval in seconds, [0.1, 86400]; 0 = the agent default (5 s).
  double progress_interval_s = 0;
  bool shared_plan = false;  ///< the leader's shared_plan (docs/operations.md, "The shared plan")
  std::string log_level = "info";
};

/// The TOML value of the first standalone agent's `gpus` for --gpus `gpus`: "none" and
/// "auto" quoted, "0,2" as [0, 2]. Throws ConfigError("--gpus", …) for anything else.
std::string standalone_gpus_value(const std::string& gpus);

/// Runs the cluster until SIGINT/SIGTERM: the leader in this process, each agent as a
/// child process (`agent_exe --config <state_dir>/agent-<i>/agent.toml`). Once every
/// agent has registered it writes {"leader": "ws://127.0.0.1:PORT", "client_token": ...}
/// to <state_dir>/client.json and to control::default_standalone_client_file() (mode
/// 0600), and prints a ready line on stdout. On a signal it stops the agents (which stop
/// their tasks), removes both client files, and removes a temporary state directory.
/// Returns the process exit code (0 after a clean stop, 1 when start-up failed).
int run_standalone(const StandaloneOptions& opt, const std::string& agent_exe);

}  // namespace dltrain::daemon
