#include "agent/failure.h"

#include <csignal>
#include <fstream>
#include <sstream>

namespace dltrain::agent {

std::optional<std::uint64_t> parse_oom_kills(const std::string& memory_events) {
  std::istringstream in(memory_events);
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

std::optional<std::string> memory_cgroup_counter_file(const std::string& self_cgroup, const std::string& mountinfo) {
  // Mount points: the cgroup2 file system, and a cgroup v1 hierarchy with the memory
  // controller ("… - cgroup cgroup rw,memory"); proc(5), /proc/PID/mountinfo.
  // A mount may show a subtree of its hierarchy (mountinfo's root field, e.g. a container
  // without a cgroup namespace sees "/docker/ID" mounted on /sys/fs/cgroup/memory): a
  // cgroup path is then relative to that root.
  std::string v2_mount, v1_mount, v2_root = "/", v1_root = "/";
  std::istringstream mounts(mountinfo);
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, mount_point, word;
    if (!(f >> id >> parent >> dev >> root >> mount_point)) continue;
    while (f >> word && word != "-") {
    }
    std::string fstype, source, super_options;
    if (!(f >> fstype >> source >> super_options)) continue;
    if (fstype == "cgroup2" && v2_mount.empty()) v2_mount = mount_point, v2_root = root;
    if (fstype == "cgroup" && v1_mount.empty()) {
      std::istringstream opts(super_options);
      std::string o;
      while (std::getline(opts, o, ',')) {
        if (o == "memory") v1_mount = mount_point, v1_root = root;
      }
    }
  }
  // This process's cgroups: "0::/path" (v2), "N:memory:/path" or "N:cpu,memory:/path" (v1).
  std::istringstream cg(self_cgroup);
  std::string v2_path, v1_path;
  while (std::getline(cg, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? std::string::npos : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) v2_path = path;
    std::istringstream c(controllers);
    std::string one;
    while (std::getline(c, one, ',')) {
      if (one == "memory") v1_path = path;
    }
  }
  const auto under = [](const std::string& mount, const std::string& root, std::string path) {
    if (root != "/" && path.compare(0, root.size(), root) == 0 &&
        (path.size() == root.size() || path[root.size()] == '/')) {
      path = path.substr(root.size());
    }
    return mount + (path == "/" ? "" : path);
  };
  // v2 where its memory controller is on (memory.events exists), else v1.
  if (!v2_mount.empty() && !v2_path.empty()) {
    const std::string f = under(v2_mount, v2_root, v2_path) + "/memory.events";
    if (std::ifstream(f)) return f;
  }
  if (!v1_mount.empty() && !v1_path.empty()) {
    const std::string f = under(v1_mount, v1_root, v1_path) + "/memory.oom_control";
    if (std::ifstream(f)) return f;
  }
  return std::nullopt;
}

namespace {
std::string slurp(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::optional<std::uint64_t> cgroup_oom_kills() {
  const auto file = memory_cgroup_counter_file(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"));
  if (!file) return std::nullopt;
  std::ifstream ev(*file);
  std::stringstream ss;
  ss << ev.rdbuf();
  return parse_oom_kills(ss.str());
}

}  // namespace dltrain::agent
