// Running the real executables from integration tests.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/wait.h"

namespace dltrain::testing {

/// Exit code (-1 when killed or not started) and standard output of a command.
struct Result {
  int code = -1;
  std::string out;
};

/// Runs a shell command under `timeout` (seconds) and captures its stdout.
inline Result run(const std::string& cmd, int timeout_s = 300) {
  Result r;
  FILE* p = popen(("timeout " + std::to_string(timeout_s) + " " + cmd).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) r.out += buf.data();
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// The last non-empty line of `s` (a followed job's summary).
/// The whole of a file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

inline std::string last_line(const std::string& s) {
  std::istringstream in(s);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

/// A shell command running beside the test (e.g. `dltrain follow JOB --json`) with its
/// stdout and stderr in a file the test reads while it runs. Killed (SIGKILL) and reaped
/// at scope exit if still running.
class Background {
 public:
  Background(const std::string& cmd, std::string out_path) : out_(std::move(out_path)) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0) _exit(126);
      dup2(fd, 1);
      dup2(fd, 2);
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  /// Waits up to `timeout_s` seconds for the command to exit; returns its exit code, or
  /// -1 when it is still running (or was killed by a signal).
  int wait(int timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (code_ == kRunning && pid_ > 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return code_;
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return code_ == kRunning ? -1 : code_;
  }

  /// The command's pid (the shell execs it, so this is the command itself).
  int pid() const { return pid_; }

  /// The complete lines the command has written so far.
  std::vector<std::string> lines() const {
    std::ifstream in(out_);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::string> out;
    std::size_t start = 0;
    for (std::size_t nl = all.find('\n'); nl != std::string::npos; nl = all.find('\n', start)) {
      out.push_back(all.substr(start, nl - start));
      start = nl + 1;
    }
    return out;
  }

 private:
  static constexpr int kRunning = -2;
  std::string out_;
  pid_t pid_ = -1;
  int code_ = kRunning;
};

/// An executable (argv[0] a path, no shell) running beside the test with its stdout on a
/// pipe the test reads line by line (JSON lines: event()) and its stderr in the file
/// `log`. Killed (SIGKILL) and reaped at scope exit if still running.
class PipedChild {
 public:
  PipedChild(const std::vector<std::string>& argv, const std::filesystem::path& log) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (err >= 0) ::dup2(err, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~PipedChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  PipedChild(const PipedChild&) = delete;
  PipedChild& operator=(const PipedChild&) = delete;

  /// The next line on stdout, or nullopt at end of file or after `timeout`.
  std::optional<std::string> line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  /// The first stdout line whose "event" is `event`, within `timeout`.
  std::optional<nlohmann::json> event(const std::string& event, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto l = line(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
      if (!l) return std::nullopt;
      auto j = nlohmann::json::parse(*l, nullptr, false);
      if (j.is_object() && j.value("event", "") == event) return j;
    }
    return std::nullopt;
  }

  /// Exit code after it ends (-1 when killed by a signal), waiting at most `timeout`;
  /// nullopt when it does not end in time (it is then killed at scope exit). Once it has
  /// ended, the same code again.
  std::optional<int> wait(std::chrono::seconds timeout) {
    if (pid_ <= 0) return code_;
    int st = 0;
    if (!wait_until([&] { return ::waitpid(pid_, &st, WNOHANG) != 0; }, timeout, std::chrono::milliseconds(50))) {
      return std::nullopt;
    }
    pid_ = -1;
    code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return code_;
  }

  /// Sends signal `sig` to the child while it runs (nothing once it has been reaped:
  /// never kill(-1, ...)).
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> code_;  ///< its exit code once reaped
  int out_ = -1;
  std::string buf_;
};

/// Pids of processes (this one excepted) whose command line or working directory mentions
/// `needle`.
inline std::vector<int> processes_mentioning(const std::string& needle) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::stoi(name);
    if (pid == getpid()) continue;
    std::string cmd;
    try {
      std::ifstream in(e.path() / "cmdline");
      cmd.assign(std::istreambuf_iterator<char>(in), {});
    } catch (const std::ios_base::failure&) {
      continue;  // it exited while being read (ESRCH from the read): it mentions nothing now
    }
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    std::error_code ec;
    const auto cwd = std::filesystem::read_symlink(e.path() / "cwd", ec).string();
    if (cmd.find(needle) != std::string::npos || (!ec && cwd.rfind(needle, 0) == 0)) out.push_back(pid);
  }
  return out;
}

/// The state letter of process `pid` from /proc/PID/stat ('R', 'S', 'T' = stopped, ...),
/// or '?' when there is no such process.
inline char process_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const auto paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

}  // namespace dltrain::testing
