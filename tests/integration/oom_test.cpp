// A real OOM kill, and how an agent tells it from any other SIGKILL (agent/failure.h):
// the test makes a memory cgroup with a 64 MiB limit below its own (cgroup v1's memory
// hierarchy, or v2 where the memory controller can be delegated), puts a child process
// in it that plays the agent, and that child starts a task process which touches memory
// until the kernel's OOM killer ends it with SIGKILL. The child then reads the cgroup's
// OOM-kill count as the agent does, before and after, and classifies the exit. Needs
// root and a writable memory cgroup; skipped, saying why, where there is none.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "agent/failure.h"
#include "wire/task_events.h"
#include "support/names.h"
#include "support/process.h"

namespace {


bool write_file(const fs::path& p, const std::string& text) {
  const int fd = ::open(p.c_str(), O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// A new cgroup below this process's memory cgroup with a memory limit of `bytes`, or ""
// with `why` set.
fs::path make_limited_cgroup(std::int64_t bytes, std::string& why) {
  const auto counter = dltrain::agent::memory_cgroup_counter_file(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"));
  if (!counter) {
    why = "no memory cgroup to ask (neither cgroup v2 memory.events nor v1 memory.oom_control)";
    return {};
  }
  const fs::path own = fs::path(*counter).parent_path();
  const bool v1 = fs::path(*counter).filename() == "memory.oom_control";
  const fs::path dir = own / ("dltrain-oom-test-" + std::to_string(::getpid()));
  if (::mkdir(dir.c_str(), 0755) != 0) {
    why = "cannot create " + dir.string() + ": " + std::strerror(errno);
    return {};
  }
  const std::string limit = std::to_string(bytes);
  const bool limited = v1 ? write_file(dir / "memory.limit_in_bytes", limit) : write_file(dir / "memory.max", limit);
  if (!limited) {
    why = "cannot set a memory limit in " + dir.string() + " (the memory controller is not delegated here)";
    ::rmdir(dir.c_str());
    return {};
  }
  // Without swap accounting a swap device would let the task page out instead.
  if (v1 && fs::exists(dir / "memory.memsw.limit_in_bytes")) write_file(dir / "memory.memsw.limit_in_bytes", limit);
  if (!v1) write_file(dir / "memory.swap.max", "0");
  return dir;
}

// Exit codes of the child that plays the agent.
constexpr int kOk = 0, kNoCount = 10, kNotKilled = 11, kNotCounted = 12, kWrongCause = 13, kJoinFailed = 14;

}  // namespace

TEST(OomKill, AKernelOomKillOfATaskIsCountedByItsCgroupAndClassifiedAsOom) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a cgroup";
  std::string why;
  const fs::path cg = make_limited_cgroup(64 << 20, why);
  if (cg.empty()) GTEST_SKIP() << why;

  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    if (!write_file(cg / "cgroup.procs", std::to_string(::getpid()))) _exit(kJoinFailed);
    const auto before = dltrain::agent::cgroup_oom_kills();
    if (!before) _exit(kNoCount);
    const pid_t task = ::fork();
    if (task == 0) {
      // Touch up to 512 MiB, 1 MiB at a time: far past the 64 MiB limit, bounded anyway.
      for (int mib = 0; mib < 512; ++mib) {
        auto* p = static_cast<char*>(std::malloc(1 << 20));
        if (!p) _exit(2);
        std::memset(p, mib & 0xff, 1 << 20);
      }
      _exit(0);
    }
    int st = 0;
    ::waitpid(task, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) _exit(kNotKilled);
    const auto after = dltrain::agent::cgroup_oom_kills();
    if (!after || *after != *before + 1) _exit(kNotCounted);
    const std::string cause = dltrain::wire::events::classify_exit(0, SIGKILL, "", *after > *before);
    _exit(cause == "oom" ? kOk : kWrongCause);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(agent, &st, 0), agent);
  ASSERT_TRUE(WIFEXITED(st)) << "the child playing the agent was killed itself (signal " << WTERMSIG(st) << ")";
  const int code = WEXITSTATUS(st);
  ::rmdir(cg.c_str());  // empty again: both processes have exited
  EXPECT_NE(code, kJoinFailed) << "could not move a process into " << cg;
  EXPECT_NE(code, kNoCount) << "the cgroup's OOM-kill count could not be read";
  EXPECT_NE(code, kNotKilled) << "the task was not SIGKILLed past its 64 MiB limit";
  EXPECT_NE(code, kNotCounted) << "the cgroup did not count exactly one OOM kill";
  EXPECT_NE(code, kWrongCause) << "classify_exit did not say oom";
  EXPECT_EQ(code, kOk);
  // The same SIGKILL without a new count in the cgroup is an ordinary signal.
  EXPECT_EQ(dltrain::wire::events::classify_exit(0, SIGKILL, "", false), "signal");
}
