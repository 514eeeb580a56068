// A dltrain cluster as real processes on loopback, for the integration tests: a
// standalone cluster (`dltrain-agent --standalone`: a leader and N agents from one
// process), or a leader and separate agent processes with their own configuration files
// (LeaderAndAgents), driven through the real `dltrain` client. Tear-down checks that
// nothing the cluster started outlives it.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/process.h"
#include "support/wait.h"

namespace dltrain::testing {

/// Where the tests' build put dltrain, dltrain-agent, dltrain-ps and dltrain-worker.
inline const std::string kBinDir = DLTRAIN_BIN_DIR;

/// A new empty directory under the system's temporary directory, named `prefix`-XXXXXX.
inline std::filesystem::path make_temp_root(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  return mkdtemp(tmpl.data());
}

/// Writes `text` to `p` with mode 0600 (token files must be private).
inline void write_private(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
  std::filesystem::permissions(p, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

/// Writes the job file `dir`/`name`.toml: `name = "NAME"` and then `body`.
inline std::filesystem::path write_job_file(const std::filesystem::path& dir, const std::string& name,
                                            const std::string& body) {
  const auto p = dir / (name + ".toml");
  std::ofstream(p) << "name = \"" << name << "\"\n" << body;
  return p;
}

/// Submits the job file `path` with the client command `client`; returns the job id
/// ("" when the submit failed, with a failed expectation saying why).
inline std::string submit_job(const std::string& client, const std::filesystem::path& path) {
  auto r = run(client + " submit " + path.string() + " --json", 30);
  EXPECT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(last_line(r.out), nullptr, false);
  return j.is_object() ? j.value("job", "") : "";
}

/// `dltrain status JOB --json`; an empty object when the client failed (the leader is
/// away, say). With `expect_ok`, a failure is also a failed expectation.
inline nlohmann::json job_status(const std::string& client, const std::string& job, bool expect_ok = false) {
  auto r = run(client + " status " + job + " --json", 30);
  if (expect_ok) EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return nlohmann::json::object();
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

/// Polls until `job` is in one of `states`; returns its last status (bounded by
/// `timeout_s`; the caller asserts on the state).
inline nlohmann::json wait_state(const std::string& client, const std::string& job,
                                 const std::vector<std::string>& states, int timeout_s) {
  nlohmann::json st;
  wait_until(
      [&] {
        st = job_status(client, job);
        return std::find(states.begin(), states.end(), st.value("state", "")) != states.end();
      },
      std::chrono::seconds(timeout_s), std::chrono::milliseconds(200));
  return st;
}

/// Polls until worker 0 of `job` has reported `epochs` epochs, or the job is past
/// running; returns its last status.
inline nlohmann::json wait_epochs(const std::string& client, const std::string& job, int epochs, int timeout_s) {
  nlohmann::json st;
  wait_until(
      [&] {
        st = job_status(client, job);
        const auto state = st.value("state", "");
        return st.value("epochs", 0) >= epochs || (state != "running" && state != "starting" && state != "queued");
      },
      std::chrono::seconds(timeout_s), std::chrono::milliseconds(200));
  return st;
}

/// Waits until `job` has `tasks` tasks and every one of them reports it runs; false
/// after `timeout_s`.
inline bool wait_all_tasks_running(const std::string& client, const std::string& job, std::size_t tasks,
                                   int timeout_s) {
  return wait_until(
      [&] {
        auto st = job_status(client, job);
        return st.contains("tasks") && st["tasks"].size() == tasks &&
               std::all_of(st["tasks"].begin(), st["tasks"].end(),
                           [](const nlohmann::json& t) { return t["state"] == "running"; });
      },
      std::chrono::seconds(timeout_s), std::chrono::milliseconds(200));
}

/// The entry of task `name` ("ps-0", "worker-1") in a status; an empty object if none.
inline nlohmann::json task_of(const nlohmann::json& st, const std::string& name) {
  if (st.contains("tasks")) {
    for (const auto& t : st["tasks"]) {
      if (t["task"] == name) return t;
    }
  }
  return nlohmann::json::object();
}

/// The premise of a test about to kill, stop or disconnect something of a job: in status
/// `st` (taken right before the act), worker `name` runs and has at least `min_left` (a
/// fraction in [0, 1]) of its steps left by its latest report, so that the act meets a
/// job with work to recover (a worker that already finished has nothing to lose).
inline ::testing::AssertionResult has_work_left(const nlohmann::json& st, const std::string& name, double min_left) {
  const auto t = task_of(st, name);
  if (t.empty()) return ::testing::AssertionFailure() << "no task " << name << " in " << st.dump();
  if (t.value("state", "") != "running") {
    return ::testing::AssertionFailure() << name << " is " << t.value("state", "?") << ", not running: " << st.dump();
  }
  const auto total = t.value("steps_total", std::int64_t{0});
  if (total <= 0) return ::testing::AssertionFailure() << name << " has not reported its steps yet: " << st.dump();
  const double left = 1.0 - static_cast<double>(t.value("step", std::int64_t{0})) / static_cast<double>(total);
  if (left < min_left) {
    return ::testing::AssertionFailure() << name << " has only " << left * 100 << " % of its steps left (at least "
                                         << min_left * 100 << " % wanted): the job is too short for this test on "
                                         << "this machine; " << st.dump();
  }
  return ::testing::AssertionSuccess();
}

/// Polls until worker `name` of `job` runs and has reported progress (a step > 0), or
/// `timeout_s` passed; returns the last status.
inline nlohmann::json wait_task_trains(const std::string& client, const std::string& job, const std::string& name,
                                       int timeout_s) {
  nlohmann::json st;
  wait_until(
      [&] {
        st = job_status(client, job);
        const auto t = task_of(st, name);
        return t.value("state", "") == "running" && t.value("step", std::int64_t{0}) > 0;
      },
      std::chrono::seconds(timeout_s), std::chrono::milliseconds(100));
  return st;
}

/// What of a status shows that a job moves: its state and generation, and each task's
/// state, restarts, step and epochs (not the clocks, which change on every call).
inline std::string progress_signature(const nlohmann::json& st) {
  std::string sig = st.value("state", "") + "/" + std::to_string(st.value("generation", 0));
  if (st.contains("tasks")) {
    for (const auto& t : st["tasks"]) {
      sig += "|" + t.value("task", "") + ":" + t.value("state", "") + ":" + std::to_string(t.value("restarts", 0)) +
             ":" + std::to_string(t.value("step", std::int64_t{0})) + ":" + std::to_string(t.value("epochs", 0));
    }
  }
  return sig;
}

/// Waits for `job` to end (succeeded, failed or cancelled) for as long as it moves: the
/// wait fails only when its status showed no change (progress_signature) for `stall_s`
/// seconds, or after `cap_s` in all (below CTest's 900 s, so that the test fails with its
/// own message). A job's length is then no bet on this machine's speed: a slow machine
/// takes longer, a stuck job still fails within `stall_s`. Returns the last status; the
/// caller asserts on its state.
inline nlohmann::json wait_job_end(const std::string& client, const std::string& job, int stall_s = 120,
                                   int cap_s = 780) {
  auto last_change = std::chrono::steady_clock::now();
  std::string last_sig;
  nlohmann::json st;
  wait_until(
      [&] {
        st = job_status(client, job);
        const auto state = st.value("state", "");
        if (state == "succeeded" || state == "failed" || state == "cancelled") return true;
        const auto now = std::chrono::steady_clock::now();
        if (auto sig = progress_signature(st); sig != last_sig) {
          last_sig = std::move(sig);
          last_change = now;
        }
        return now - last_change > std::chrono::seconds(stall_s);  // stalled: the caller sees the state
      },
      std::chrono::seconds(cap_s), std::chrono::milliseconds(500));
  return st;
}

/// `dltrain follow JOB --json`, started now and read once `job` has ended (wait_job_end's
/// bounds), so that it prints every event from now on as it did with a fixed timeout: its
/// exit code and output (stdout), or code 124 and the last status when the job stalled or
/// ran past the cap.
inline Result follow_to_end(const std::string& client, const std::string& job, int stall_s = 120,
                            int cap_s = 780) {
  const auto out = std::filesystem::temp_directory_path() /
                   ("dltrain-follow-" + std::to_string(::getpid()) + "-" + job + ".jsonl");
  Result r;
  {
    Background follower(client + " follow " + job + " --json 2>/dev/null", out.string());
    const auto st = wait_job_end(client, job, stall_s, cap_s);
    const auto state = st.value("state", "");
    if (state != "succeeded" && state != "failed" && state != "cancelled") {
      r = Result{124, "job " + job + " did not end: no change in its status for " + std::to_string(stall_s) +
                          " s or past " + std::to_string(cap_s) + " s in all; last status " + st.dump()};
    } else {
      r.code = follower.wait(60);
    }
  }
  const auto text = slurp(out);
  std::filesystem::remove(out);
  if (r.code != 124) r.out = text;
  else r.out += "\n" + text;
  return r;
}

/// The JSON events a follower (`dltrain follow JOB --json` in a Background) has written
/// so far; lines that are not JSON objects are left out.
inline std::vector<nlohmann::json> follower_events(const Background& follower) {
  std::vector<nlohmann::json> out;
  for (const auto& line : follower.lines()) {
    auto e = nlohmann::json::parse(line, nullptr, false);
    if (e.is_object()) out.push_back(std::move(e));
  }
  return out;
}

/// The highest global step `task`'s progress events reported (-1: none yet).
inline std::int64_t progress_steps(const std::vector<nlohmann::json>& events, const std::string& task) {
  std::int64_t best = -1;
  for (const auto& e : events) {
    if (e.value("task", "") == task && e.value("event", "") == "progress") {
      best = std::max(best, e.value("global_step", std::int64_t{-1}));
    }
  }
  return best;
}

/// Processes of a job's tasks in the agents' state directories `agent_dirs`: their
/// working directory or command line is under AGENT_DIR/tasks/JOB (`task` narrows to one
/// task directory, e.g. "worker-1-g1").
inline std::vector<int> task_pids(const std::vector<std::filesystem::path>& agent_dirs, const std::string& job,
                                  const std::string& task = "") {
  std::vector<int> pids;
  for (const auto& a : agent_dirs) {
    auto dir = a / "tasks" / job;
    if (!task.empty()) dir /= task;
    for (int pid : processes_mentioning(dir.string())) pids.push_back(pid);
  }
  return pids;
}

/// `dltrain-agent --standalone --agents N --state-dir STATE`, its stdout and stderr
/// appended to STATE/../standalone.log and XDG_STATE_HOME set to `xdg` (the user's
/// default client file is left alone). The constructor returns once the cluster wrote
/// STATE/client.json (a stale one is removed first), at most 60 s; `client` is then the
/// `dltrain` command line that reaches it, and stays empty when it did not start.
/// Destroyed while running, the cluster is killed (SIGKILL). `extra` are further
/// `dltrain-agent` flags (e.g. {"--ps-checkpoint-interval", "2"}).
class Standalone {
 public:
  Standalone(std::filesystem::path state_dir, std::filesystem::path xdg_dir, int agents = 3,
             std::vector<std::string> extra = {})
      : state(std::move(state_dir)), xdg(std::move(xdg_dir)), agents_(agents) {
    namespace fs = std::filesystem;
    fs::create_directories(state);
    fs::remove(state / "client.json");
    pid_ = fork();
    if (pid_ == 0) {
      setenv("XDG_STATE_HOME", xdg.c_str(), 1);
      const std::string log = (state.parent_path() / "standalone.log").string();
      freopen(log.c_str(), "a", stdout);
      freopen(log.c_str(), "a", stderr);
      std::vector<std::string> args{"dltrain-agent", "--standalone", "--agents", std::to_string(agents),
                                    "--state-dir", state.string()};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv((kBinDir + "/dltrain-agent").c_str(), argv.data());
      _exit(127);
    }
    wait_until([&] { return fs::exists(state / "client.json"); }, std::chrono::seconds(60),
               std::chrono::milliseconds(100));
    if (fs::exists(state / "client.json")) {
      std::ifstream in(state / "client.json");
      auto j = nlohmann::json::parse(in);
      client = kBinDir + "/dltrain --leader " + j["leader"].get<std::string>() + " --token " +
               j["client_token"].get<std::string>();
    }
  }
  ~Standalone() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Standalone(const Standalone&) = delete;
  Standalone& operator=(const Standalone&) = delete;

  /// SIGTERM, then waits up to 30 s; returns the exit code (-1: killed, or not running).
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int st = 0;
    pid_t r = 0;
    for (int i = 0; i < 300 && (r = waitpid(pid_, &st, WNOHANG)) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (r == 0) return -1;  // still running: the destructor kills it
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  /// Processes that mention the state directory (none may outlive stop()).
  std::vector<int> leftover_processes() const { return processes_mentioning(state.string()); }

  /// The agents' state directories, STATE/agent-I.
  std::vector<std::filesystem::path> agent_dirs() const {
    std::vector<std::filesystem::path> out;
    for (int i = 0; i < agents_; ++i) out.push_back(state / ("agent-" + std::to_string(i)));
    return out;
  }

  /// Processes of `job`'s tasks (see testing::task_pids).
  std::vector<int> task_pids(const std::string& job, const std::string& task = "") const {
    return testing::task_pids(agent_dirs(), job, task);
  }

  std::filesystem::path state;
  std::filesystem::path xdg;
  std::string client;

 private:
  int agents_;
  pid_t pid_ = -1;
};

/// A leader that hosts no tasks and `agents` agents of 1 core each, every one a separate
/// dltrain-agent process with its own configuration file, state directory ROOT/NAME and
/// log, as on separate machines, for a test fixture to derive from. The leader listens
/// on an ephemeral port, which it writes to ROOT/leader/leader.json; restarted, it
/// listens on the same port again (its agents' leader_url names it). Optionally TLS on
/// the control channel (use_tls before start_cluster).
class LeaderAndAgents {
 protected:
  static inline const std::string kClientToken = "failover-client-token-0123456789abcdef";

  /// Creates the root directory and the token files.
  void create_root(const std::string& prefix) {
    root_ = make_temp_root(prefix);
    write_private(root_ / "agent.token", "failover-agent-token-0123456789abcdef\n");
    write_private(root_ / "client.token", kClientToken + "\n");
  }

  /// SIGTERM to every daemon (agents stop their tasks; the leader flushes its store),
  /// then checks that each stopped within 30 s and that nothing a daemon started
  /// outlives it. Removes the root unless the test failed.
  void tear_down() {
    for (auto& [name, d] : daemons_) {
      if (d) ::kill(d->pid(), SIGTERM);
    }
    for (auto& [name, d] : daemons_) {
      if (d) EXPECT_NE(d->wait(30), -1) << name << " did not stop within 30 s";
    }
    daemons_.clear();
    EXPECT_TRUE(processes_mentioning(root_.string()).empty()) << "processes left running";
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(root_);
  }

  /// Every daemon's heartbeat_timeout (set before starting them).
  std::string heartbeat_timeout_ = "3s";

  // The settings every daemon shares: quick heartbeats so that a lost agent is noticed in
  // seconds, and progress every second so that a test's premise (has_work_left) reads a
  // fresh step count.
  std::string common(const std::string& name) const {
    return "name = \"" + name + "\"\nagent_token_file = \"" + (root_ / "agent.token").string() +
           "\"\nstate_dir = \"" + (root_ / name).string() +
           "\"\nheartbeat_interval = \"500ms\"\nheartbeat_timeout = \"" + heartbeat_timeout_ +
           "\"\ntask_stop_grace = \"5s\"\n"
           "ps_checkpoint_interval = \"2s\"\nprogress_interval = \"1s\"\nlog_level = \"info\"\n";
  }

  /// Starts (or starts again) the leader; returns once it wrote the port it listens on
  /// to ROOT/leader/leader.json (at most 30 s).
  void start_leader(const std::string& extra = "") {
    namespace fs = std::filesystem;
    const fs::path cfg = root_ / "leader.toml";
    if (!fs::exists(cfg)) {
      write_private(cfg, common("leader") + "leader = true\nhost_tasks = false\nlisten_address = \"127.0.0.1\"\n" +
                             "listen_port = 0\nclient_token_file = \"" + (root_ / "client.token").string() + "\"\n" +
                             tls_leader_keys() + extra);
    } else {
      // Restarted: the port it had (the agents' leader_url); the rest unchanged.
      std::string text = slurp(cfg);
      text = std::regex_replace(text, std::regex("listen_port = \\d+"), "listen_port = " + std::to_string(port_));
      write_private(cfg, text);
    }
    const fs::path endpoint = root_ / "leader" / "leader.json";
    fs::remove(endpoint);  // the last run's
    const fs::path log = root_ / ("leader-" + std::to_string(++leader_starts_) + ".log");
    daemons_["leader"] = std::make_unique<Background>(kBinDir + "/dltrain-agent -c " + cfg.string(), log.string());
    nlohmann::json ep;
    wait_until(
        [&] {
          ep = nlohmann::json::parse(slurp(endpoint), nullptr, false);  // written atomically
          return ep.is_object() && ep.contains("port");
        },
        std::chrono::seconds(30), std::chrono::milliseconds(50));
    ASSERT_TRUE(ep.is_object() && ep.contains("port")) << "the leader wrote no " << endpoint << "; its log is " << log;
    port_ = ep["port"].get<int>();
    EXPECT_EQ(ep.value("url", ""), scheme() + "://127.0.0.1:" + std::to_string(port_)) << ep.dump();
    client_ = kBinDir + "/dltrain --leader " + scheme() + "://127.0.0.1:" + std::to_string(port_) + " --token " +
              kClientToken + (tls_ ? " --ca-file " + (root_ / "ca.pem").string() : "");
  }

  /// Starts agent `name` (`cores` cores); `extra` are more configuration lines, `env` is
  /// "VAR=value ..." set in its environment.
  void start_agent(const std::string& name, const std::string& extra = "", const std::string& env = "",
                   int cores = 1) {
    const std::filesystem::path cfg = root_ / (name + ".toml");
    write_private(cfg, common(name) + tls_agent_keys() + "leader_url = \"" + scheme() + "://127.0.0.1:" +
                           std::to_string(port_) +
                           "\"\nadvertise_address = \"127.0.0.1\"\ntask_bind_address = \"127.0.0.1\"\ncores = " +
                           std::to_string(cores) + "\n" +
                           "task_bin_dir = \"" + kBinDir + "\"\n" + extra);
    daemons_[name] = std::make_unique<Background>(
        (env.empty() ? "" : "env " + env + " ") + kBinDir + "/dltrain-agent -c " + cfg.string(),
        (root_ / (name + ".log")).string());
  }

  /// The daemon `name` started (nullptr when none is).
  Background* daemon(const std::string& name) {
    const auto it = daemons_.find(name);
    return it == daemons_.end() ? nullptr : it->second.get();
  }

  /// Waits until `n` agents are registered and ready (at most 60 s).
  void wait_agents(std::size_t n) {
    std::size_t ready = 0;
    wait_until(
        [&] {
          auto r = run(client_ + " agents --json", 30);
          if (r.code != 0) return false;
          ready = 0;
          for (const auto& a : nlohmann::json::parse(r.out).value("agents", nlohmann::json::array())) ready += a["state"] == "ready" ? 1 : 0;
          return ready == n;
        },
        std::chrono::seconds(60), std::chrono::milliseconds(200));
    ASSERT_EQ(ready, n) << ready << " of " << n << " agents registered";
  }

  void start_cluster(int agents, const std::string& leader_extra = "") {
    start_leader(leader_extra);
    if (::testing::Test::HasFatalFailure()) return;
    for (int i = 0; i < agents; ++i) start_agent("agent-" + std::to_string(i));
    wait_agents(static_cast<std::size_t>(agents));
  }

  /// SIGKILL, then reap.
  void kill_daemon(const std::string& name) {
    ASSERT_TRUE(daemons_[name]);
    ASSERT_EQ(::kill(daemons_[name]->pid(), SIGKILL), 0);
    daemons_[name]->wait(10);
    daemons_.erase(name);
  }

  std::string submit(const std::string& name, const std::string& body) {
    return submit_job(client_, write_job_file(root_, name, body));
  }
  nlohmann::json status(const std::string& job) { return job_status(client_, job); }
  nlohmann::json wait_state(const std::string& job, const std::vector<std::string>& states, int timeout_s) {
    return testing::wait_state(client_, job, states, timeout_s);
  }
  nlohmann::json wait_epochs(const std::string& job, int epochs, int timeout_s) {
    return testing::wait_epochs(client_, job, epochs, timeout_s);
  }
  /// The job's status once it ended, waiting for as long as it moves (wait_job_end).
  nlohmann::json wait_end(const std::string& job) { return wait_job_end(client_, job); }
  static nlohmann::json task(const nlohmann::json& st, const std::string& name) { return task_of(st, name); }

  // TLS on the control channel: a CA and a leader certificate for 127.0.0.1 made with
  // the openssl command-line tool; the leader serves wss://, agents and the client
  // verify it against the CA.
  void use_tls() {
    tls_ = true;
    const std::string d = root_.string();
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    const std::string cmd =
        "cd " + d + " && openssl req -x509" + ec + "-days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem && " +
        "openssl req" + ec + "-subj /CN=leader -keyout leader.key -out leader.csr && " +
        "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && " +
        "openssl x509 -req -in leader.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext " +
        "-out leader.pem && chmod 600 leader.key ca.key";
    ASSERT_EQ(std::system((cmd + " 2>/dev/null").c_str()), 0) << cmd;
  }
  std::string scheme() const { return tls_ ? "wss" : "ws"; }
  std::string tls_leader_keys() const {
    return tls_ ? "tls_cert_file = \"" + (root_ / "leader.pem").string() + "\"\ntls_key_file = \"" +
                      (root_ / "leader.key").string() + "\"\n"
                : "";
  }
  std::string tls_agent_keys() const { return tls_ ? "tls_ca_file = \"" + (root_ / "ca.pem").string() + "\"\n" : ""; }

  std::filesystem::path root_;
  bool tls_ = false;
  int port_ = 0;
  int leader_starts_ = 0;
  std::string client_;
  std::map<std::string, std::unique_ptr<Background>> daemons_;
};

}  // namespace dltrain::testing
