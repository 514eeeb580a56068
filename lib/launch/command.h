// Child processes of the launcher: a short external command run to its end with what it
// printed read back and a bound on its time (Slurm's `scontrol`), and long-lived children
// (srun, the agent) started with a clean signal state and reaped by their caller.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::launch {

/// Environment variables, name → value: a copy of this process's (current_environment)
/// or one a test builds.
using Environment = std::map<std::string, std::string>;

/// This process's environment (environ) as a map. Thread-safe as long as nobody changes
/// the environment meanwhile.
Environment current_environment();

/// `env` as the `NAME=value` strings execve takes.
std::vector<std::string> environment_strings(const Environment& env);

/// How a command ended.
struct CommandResult {
  /// Its exit status, or 128 + the signal number when a signal ended it (as a shell says).
  int exit_code = -1;
  std::string out;  ///< everything it wrote to standard output
  std::string err;  ///< everything it wrote to standard error
};

/// Runs `argv` (argv[0] is looked up on PATH) with standard input from /dev/null and this
/// process's environment, and waits for its end, at most `timeout` (then it is killed
/// with SIGKILL). Output is read as it comes, so a chatty command cannot block on a full
/// pipe; each stream is capped at 64 MiB. Throws IoError naming the program when it cannot
/// be started (e.g. "scontrol: not found on PATH"), and TimeoutError naming it and the
/// bound when it ran past `timeout`. Thread-safe (no shared state; the child is reaped here).
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

/// Starts `argv` (argv[0] looked up on PATH) with environment `env`, sharing this process's
/// standard streams, with no signal blocked and SIGTERM, SIGINT and SIGHUP at their default
/// action whatever this process does with them. Returns its pid; the caller reaps it
/// (exit_status). Throws IoError naming the program when it cannot be started.
pid_t start_process(const std::vector<std::string>& argv, const Environment& env);

/// The exit code of child `pid` (as CommandResult::exit_code) once it has ended; nullopt
/// while it still runs (`wait` = false) . With `wait` = true, blocks until it ends.
std::optional<int> exit_status(pid_t pid, bool wait);

}  // namespace dltrain::launch
