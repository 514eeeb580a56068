// How a task ended, in the terms `dltrain status` and a failed job's summary use
// (wire::events::Failure): its cause, and the last lines of its log.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::agent {

/// The cause of a failed exit (exit code != 0 or a signal), one of
/// wire::events::Failure::cause: the task's own word first ("divergence", "timeout",
/// "config": `reported`, from its last error event), then "oom" for a SIGKILL while its
/// cgroup counted a new OOM kill (`oom_killed`), "signal" for any other signal, "start"
/// for exit code 126 (the agent could not start it), "exit_code" otherwise. Pure.
std::string classify_exit(int exit_code, int signal, const std::string& reported, bool oom_killed);

/// The `oom_kill` count of a cgroup v2 `memory.events` file's text; nullopt when absent.
std::optional<std::uint64_t> parse_oom_kills(const std::string& memory_events);

/// OOM kills so far in this process's cgroup (cgroup v2 `memory.events`, which counts
/// the cgroup's descendants too, so a task the kernel killed for memory counts here);
/// nullopt where there is no cgroup v2 memory controller to ask.
std::optional<std::uint64_t> cgroup_oom_kills();

}  // namespace dltrain::agent
