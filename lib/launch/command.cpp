#include "launch/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/errors.h"

extern char** environ;

namespace dltrain::launch {

namespace {

constexpr std::size_t kMaxCapture = 64u << 20;

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (pipe2(fd, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  }
  ~Pipe() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  void close_end(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/// posix_spawnp with the child's signal mask emptied and the stop signals at their
/// defaults (a launcher blocks them to take them with sigtimedwait).
pid_t spawn(const std::vector<std::string>& argv, char* const* envp, const posix_spawn_file_actions_t* fa,
            const char* not_found) {
  if (argv.empty()) throw InvalidArgument("cannot start a process: empty argv");
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t none, dflt;
  sigemptyset(&none);
  sigemptyset(&dflt);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) sigaddset(&dflt, s);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dflt);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), fa, &at, args.data(), envp);
  posix_spawnattr_destroy(&at);
  if (rc != 0) throw IoError(argv[0] + ": " + (rc == ENOENT ? std::string(not_found) : std::strerror(rc)));
  return pid;
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    env.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

std::vector<std::string> environment_strings(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  Pipe out, err;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out.fd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err.fd[1], 2);
  pid_t pid = -1;
  try {
    pid = spawn(argv, environ, &fa, "not found on PATH");
  } catch (...) {
    posix_spawn_file_actions_destroy(&fa);
    throw;
  }
  posix_spawn_file_actions_destroy(&fa);
  out.close_end(1);
  err.close_end(1);

  CommandResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<char, 8192> buf{};
  bool timed_out = false;
  while (out.fd[0] >= 0 || err.fd[0] >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    std::array<pollfd, 2> p{pollfd{out.fd[0], POLLIN, 0}, pollfd{err.fd[0], POLLIN, 0}};
    const int n = ::poll(p.data(), p.size(), static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || (p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t got = ::read(p[i].fd, buf.data(), buf.size());
      std::string& sink = i == 0 ? r.out : r.err;
      if (got > 0) {
        if (sink.size() < kMaxCapture) sink.append(buf.data(), static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        (i == 0 ? out : err).close_end(0);
      }
    }
  }
  // The pipes can close before the child ends (it closed its output, or poll failed):
  // the wait for its exit is bounded by the same deadline.
  int status = 0;
  bool killed = false;
  for (;;) {
    if (timed_out && !killed) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    const pid_t w = ::waitpid(pid, &status, killed ? 0 : WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (w == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        timed_out = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  if (timed_out) {
    throw TimeoutError(fmt::format("{}: still running after {:g} s; killed", argv[0], timeout.count() / 1000.0));
  }
  r.exit_code = exit_code_of(status);
  return r;
}

pid_t start_process(const std::vector<std::string>& argv, const Environment& env) {
  const auto strings = environment_strings(env);
  std::vector<char*> envp;
  for (const auto& e : strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  return spawn(argv, envp.data(), nullptr, "not found");
}

std::optional<int> exit_status(pid_t pid, bool wait) {
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid, &status, wait ? 0 : WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r != pid) return std::nullopt;
  return exit_code_of(status);
}

}  // namespace dltrain::launch
