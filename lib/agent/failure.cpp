#include "agent/failure.h"

#include <csignal>
#include <fstream>
#include <sstream>

namespace dltrain::agent {

std::string classify_exit(int exit_code, int signal, const std::string& reported, bool oom_killed) {
  if (!reported.empty()) return reported;
  if (signal == SIGKILL && oom_killed) return "oom";
  if (signal != 0) return "signal";
  if (exit_code == 126) return "start";
  return "exit_code";
}

std::optional<std::uint64_t> parse_oom_kills(const std::string& memory_events) {
  std::istringstream in(memory_events);
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> cgroup_oom_kills() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;  // the cgroup v2 line
    std::ifstream ev("/sys/fs/cgroup" + line.substr(3) + "/memory.events");
    if (!ev) return std::nullopt;
    std::stringstream ss;
    ss << ev.rdbuf();
    return parse_oom_kills(ss.str());
  }
  return std::nullopt;
}

}  // namespace dltrain::agent
