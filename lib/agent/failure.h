// How a task ended, in the terms `dltrain status` and a failed job's summary use
// (wire::events::Failure): how the kernel's OOM killer is told from any other SIGKILL.
// The cause itself is wire::events::classify_exit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::agent {

/// The `oom_kill` count of a cgroup v2 `memory.events` or cgroup v1
/// `memory.oom_control` file's text ("key value" lines); nullopt when absent.
std::optional<std::uint64_t> parse_oom_kills(const std::string& memory_events);

/// The file that counts OOM kills for the memory cgroup of a process whose
/// /proc/PID/cgroup is `self_cgroup` and /proc/PID/mountinfo is `mountinfo`: the cgroup
/// v2 `memory.events` where the cgroup2 file system is mounted and its memory controller
/// is on for that cgroup, else the v1 memory hierarchy's `memory.oom_control` (hybrid and
/// v1-only hosts); nullopt when neither exists. Reads only whether that file exists.
std::optional<std::string> memory_cgroup_counter_file(const std::string& self_cgroup, const std::string& mountinfo);

/// OOM kills so far in this process's memory cgroup (memory_cgroup_counter_file). Tasks
/// are this process's children in the same cgroup, so a task the kernel killed for
/// memory counts here (v2 also counts descendant cgroups); nullopt where no memory
/// controller can be asked.
std::optional<std::uint64_t> cgroup_oom_kills();

}  // namespace dltrain::agent
