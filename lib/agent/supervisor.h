// Spawns and supervises task processes (PS shards, workers) for an agent.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace dltrain::agent {

/// What to run.
struct ProcessSpec {
  std::vector<std::string> argv;  ///< argv[0] is the executable's path
  std::string log_path;           ///< the child's stderr is appended here ("" = inherit)
  std::string work_dir;           ///< "" = inherit
  /// Environment variables set (or replaced) in the child, NAME → value; the rest of the
  /// agent's environment is inherited.
  std::vector<std::pair<std::string, std::string>> env;
};

/// How a child ended: exactly one of exit_code >= 0 or signal > 0.
struct ExitStatus {
  int exit_code = -1;
  int signal = 0;
  std::string describe() const;  ///< "exit code 1" / "killed by signal 9 (Killed)"
};

/// Supervises child processes of this process on one io_context thread.
///
/// Every child: gets its own process group, dies with the agent (PR_SET_PDEATHSIG
/// SIGKILL, checked against a race with the parent's exit), has stdin from /dev/null,
/// stdout on a pipe read line by line, stderr appended to a log file.
/// Thread-safety: all calls and callbacks on the io_context's thread.
class Supervisor {
 public:
  using LineFn = std::function<void(const std::string& line)>;
  using ExitFn = std::function<void(const ExitStatus&)>;

  explicit Supervisor(boost::asio::io_context& io);
  ~Supervisor();  ///< kills (SIGKILL) every child still running

  /// Starts a child. `on_line` gets each stdout line (without '\n'; lines over 1 MiB are
  /// cut); `on_exit` is called once after the child was reaped and its stdout drained.
  /// Returns the pid. Throws IoError when fork/pipe/exec set-up fails (exec failure
  /// itself shows up as exit code 127 with the reason in the log file).
  pid_t spawn(const ProcessSpec& spec, LineFn on_line, ExitFn on_exit);

  /// SIGTERM to the child's process group, then SIGKILL after `grace` if still alive.
  void stop(pid_t pid, std::chrono::milliseconds grace);
  /// `sig` to the child itself (not its group); nothing when it is not a live child.
  void signal(pid_t pid, int sig);
  /// stop() for every child.
  void stop_all(std::chrono::milliseconds grace);
  /// SIGKILL to the child's process group at once.
  void kill_now(pid_t pid);
  /// Children not yet reaped.
  std::size_t running() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::agent
