#include "agent/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"

namespace dltrain::agent {

namespace asio = boost::asio;

std::string ExitStatus::describe() const {
  if (signal > 0) {
    return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  }
  return "exit code " + std::to_string(exit_code);
}

struct Child {
  pid_t pid = -1;
  std::unique_ptr<asio::posix::stream_descriptor> out;
  asio::streambuf buf{1 << 20};
  Supervisor::LineFn on_line;
  Supervisor::ExitFn on_exit;
  std::unique_ptr<asio::steady_timer> kill_timer;
  bool reaped = false;
  bool drained = false;
  ExitStatus status;
};

struct Supervisor::Impl : std::enable_shared_from_this<Supervisor::Impl> {
  asio::io_context& io;
  asio::signal_set sigchld;
  std::map<pid_t, std::shared_ptr<Child>> children;

  explicit Impl(asio::io_context& i) : io(i), sigchld(i, SIGCHLD) {}

  void wait_sigchld() {
    sigchld.async_wait([w = weak_from_this()](boost::system::error_code ec, int) {
      auto self = w.lock();
      if (!self || ec) return;
      self->reap();
      self->wait_sigchld();
    });
  }

  void reap() {
    for (auto& [pid, c] : children) {
      if (c->reaped) continue;
      int st = 0;
      const pid_t r = waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        c->reaped = true;
        if (WIFSIGNALED(st)) {
          c->status.signal = WTERMSIG(st);
        } else {
          c->status.exit_code = WEXITSTATUS(st);
        }
        if (c->kill_timer) c->kill_timer->cancel();
      }
    }
    finish_done();
  }

  void finish_done() {
    for (auto it = children.begin(); it != children.end();) {
      auto c = it->second;
      if (c->reaped && c->drained) {
        it = children.erase(it);
        if (c->on_exit) c->on_exit(c->status);
      } else {
        ++it;
      }
    }
  }

  void read_lines(const std::shared_ptr<Child>& c) {
    asio::async_read_until(*c->out, c->buf, '\n',
                           [w = weak_from_this(), c](boost::system::error_code ec, std::size_t n) {
                             auto self = w.lock();
                             if (!self) return;
                             if (!ec) {
                               std::string line(asio::buffers_begin(c->buf.data()),
                                                asio::buffers_begin(c->buf.data()) + static_cast<std::ptrdiff_t>(n - 1));
                               c->buf.consume(n);
                               if (c->on_line) c->on_line(line);
                               return self->read_lines(c);
                             }
                             if (ec == asio::error::not_found) {
                               // Line longer than the buffer: deliver what we have.
                               std::string line(asio::buffers_begin(c->buf.data()), asio::buffers_end(c->buf.data()));
                               c->buf.consume(c->buf.size());
                               if (c->on_line) c->on_line(line);
                               return self->read_lines(c);
                             }
                             if (c->buf.size() > 0 && c->on_line) {
                               std::string rest(asio::buffers_begin(c->buf.data()), asio::buffers_end(c->buf.data()));
                               c->buf.consume(c->buf.size());
                               c->on_line(rest);
                             }
                             c->drained = true;
                             boost::system::error_code ig;
                             c->out->close(ig);
                             // The child may have closed stdout before exiting; reap soon.
                             self->reap();
                             if (!c->reaped) {
                               auto t = std::make_shared<asio::steady_timer>(self->io, std::chrono::milliseconds(200));
                               t->async_wait([w, t](boost::system::error_code) {
                                 if (auto s = w.lock()) s->reap();
                               });
                             }
                           });
  }
};

Supervisor::Supervisor(asio::io_context& io) : impl_(std::make_shared<Impl>(io)) { impl_->wait_sigchld(); }

Supervisor::~Supervisor() {
  for (auto& [pid, c] : impl_->children) {
    if (!c->reaped) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      int st;
      waitpid(pid, &st, 0);
    }
  }
}

pid_t Supervisor::spawn(const ProcessSpec& spec, LineFn on_line, ExitFn on_exit) {
  if (spec.argv.empty()) throw IoError("spawn: empty argv");
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's environment, built before fork (only async-signal-safe calls after it):
  // the agent's, with spec.env's variables replaced or added.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    const auto name = var.substr(0, var.find('='));
    const bool replaced = std::any_of(spec.env.begin(), spec.env.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env_strings.emplace_back(var);
  }
  for (const auto& [name, value] : spec.env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw IoError(std::string("pipe2 failed: ") + std::strerror(errno));
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (log_fd < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw IoError("cannot open task log \"" + spec.log_path + "\": " + std::strerror(errno));
    }
  }
  const pid_t parent = getpid();
  // Every signal blocked across fork: until the child has reset the agent's handlers, a
  // signal for the child (a stop_task's SIGTERM to its group, right after the start) would
  // run the agent's handler in the child, which writes to the agent's own signal pipe
  // (inherited): the agent would take the child's SIGTERM for its own and shut down.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (log_fd >= 0) ::close(log_fd);
    throw IoError(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec. The agent's signal handlers
    // go back to the default (ignored signals stay ignored, as exec would keep them),
    // then the signals are unblocked.
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction cur {};
      if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, nullptr, &cur) != 0) continue;
      if ((cur.sa_flags & SA_SIGINFO) != 0 || (cur.sa_handler != SIG_IGN && cur.sa_handler != SIG_DFL)) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, nullptr);
      }
    }
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fds[1], 1);
    if (log_fd >= 0) dup2(log_fd, 2);
    if (!spec.work_dir.empty() && chdir(spec.work_dir.c_str()) != 0) _exit(126);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "dltrain: exec of the task executable failed\n";
    (void)!write(2, msg, sizeof msg - 1);
    (void)!write(2, argv[0], strlen(argv[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so a kill(-pid) right away finds the group
  ::close(fds[1]);
  if (log_fd >= 0) ::close(log_fd);
  auto c = std::make_shared<Child>();
  c->pid = pid;
  c->out = std::make_unique<asio::posix::stream_descriptor>(impl_->io, fds[0]);
  c->on_line = std::move(on_line);
  c->on_exit = std::move(on_exit);
  impl_->children[pid] = c;
  impl_->read_lines(c);
  return pid;
}

void Supervisor::stop(pid_t pid, std::chrono::milliseconds grace) {
  auto it = impl_->children.find(pid);
  if (it == impl_->children.end() || it->second->reaped) return;
  ::kill(-pid, SIGTERM);
  auto c = it->second;
  c->kill_timer = std::make_unique<asio::steady_timer>(impl_->io, grace);
  c->kill_timer->async_wait([c](boost::system::error_code ec) {
    if (ec || c->reaped) return;
    spdlog::warn("task pid {} ignored SIGTERM; sending SIGKILL", c->pid);
    ::kill(-c->pid, SIGKILL);
  });
}

void Supervisor::signal(pid_t pid, int sig) {
  auto it = impl_->children.find(pid);
  if (it == impl_->children.end() || it->second->reaped) return;
  ::kill(pid, sig);
}

void Supervisor::stop_all(std::chrono::milliseconds grace) {
  std::vector<pid_t> pids;
  for (auto& [pid, c] : impl_->children) pids.push_back(pid);
  for (pid_t pid : pids) stop(pid, grace);
}

void Supervisor::kill_now(pid_t pid) {
  auto it = impl_->children.find(pid);
  if (it == impl_->children.end() || it->second->reaped) return;
  ::kill(-pid, SIGKILL);
}

std::size_t Supervisor::running() const { return impl_->children.size(); }

}  // namespace dltrain::agent
