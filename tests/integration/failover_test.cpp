// Failures of whole daemons, as real processes on loopback: a leader (that hosts no
// tasks) and separate agent processes, each with its own configuration, state directory
// and log, as on separate machines. The test kills an agent or the leader with SIGKILL,
// the way a crashed or rebooted machine goes, and drives the cluster with the real
// `dltrain` client.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/process.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using dltrain::testing::Background;
using dltrain::testing::last_line;
using dltrain::testing::run;

namespace {

const std::string kBin = DLTRAIN_BIN_DIR;
using Clock = std::chrono::steady_clock;
const std::string kClientToken = "failover-client-token-0123456789abcdef";

// 2 workers + 1 PS shard, 1 core each, on `samples` training images.
std::string job_toml(int epochs, int samples = 8000) {
  return R"(data_dir = "/usr/share/datasets/fashion-mnist"
model = "cnn"
workers = 2
ps_shards = 1
batch_size = 32
test_samples = 2000
epochs = )" + std::to_string(epochs) + "\ntrain_samples = " + std::to_string(samples) + R"(
[optimizer]
lr = 0.05
warmup_epochs = 0.2
)";
}

// A leader and `agents` agents of 1 core each, every one a separate dltrain-agent process
// with its own configuration file. The leader listens on an ephemeral port; restarted, it
// listens on the same port again (its agents' leader_url names it).
class Failover : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dltrain-failover-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
    write_private(root_ / "agent.token", "failover-agent-token-0123456789abcdef\n");
    write_private(root_ / "client.token", kClientToken + "\n");
  }

  void TearDown() override {
    // SIGTERM: agents stop their tasks; the leader flushes its store.
    for (auto& [name, d] : daemons_) {
      if (d) ::kill(d->pid(), SIGTERM);
    }
    for (auto& [name, d] : daemons_) {
      if (d) EXPECT_NE(d->wait(30), -1) << name << " did not stop within 30 s";
    }
    daemons_.clear();
    // Nothing a daemon started may outlive it.
    EXPECT_TRUE(dltrain::testing::processes_mentioning(root_.string()).empty()) << "processes left running";
    if (!HasFailure()) fs::remove_all(root_);
  }

  static void write_private(const fs::path& p, const std::string& text) {
    std::ofstream(p) << text;
    fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
  }

  // The settings every daemon shares: quick heartbeats so that a lost agent is noticed in
  // seconds.
  std::string common(const std::string& name) const {
    return "name = \"" + name + "\"\nagent_token_file = \"" + (root_ / "agent.token").string() +
           "\"\nstate_dir = \"" + (root_ / name).string() +
           "\"\nheartbeat_interval = \"500ms\"\nheartbeat_timeout = \"3s\"\ntask_stop_grace = \"5s\"\n"
           "ps_checkpoint_interval = \"2s\"\nlog_level = \"info\"\n";
  }

  // Starts (or starts again) the leader; returns once it listens.
  void start_leader(const std::string& extra = "") {
    const fs::path cfg = root_ / "leader.toml";
    if (!fs::exists(cfg)) {
      write_private(cfg, common("leader") + "leader = true\nhost_tasks = false\nlisten_address = \"127.0.0.1\"\n" +
                             "listen_port = 0\nclient_token_file = \"" + (root_ / "client.token").string() + "\"\n" +
                             tls_leader_keys() + extra);
    } else {
      // Restarted: the port it had (the agents' leader_url); the rest unchanged.
      std::ifstream in(cfg);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      text = std::regex_replace(text, std::regex("listen_port = \\d+"), "listen_port = " + std::to_string(port_));
      write_private(cfg, text);
    }
    const fs::path log = root_ / ("leader-" + std::to_string(++leader_starts_) + ".log");
    daemons_["leader"] = std::make_unique<Background>(kBin + "/dltrain-agent -c " + cfg.string(), log.string());
    const std::regex listening("leader listening on 127\\.0\\.0\\.1:(\\d+)");
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline) {
      for (const auto& line : daemons_["leader"]->lines()) {
        std::smatch m;
        if (std::regex_search(line, m, listening)) {
          port_ = std::stoi(m[1]);
          client_ = kBin + "/dltrain --leader " + scheme() + "://127.0.0.1:" + std::to_string(port_) + " --token " +
                    kClientToken + (tls_ ? " --ca-file " + (root_ / "ca.pem").string() : "");
          return;
        }
      }
      std::this_thread::sleep_for(100ms);
    }
    FAIL() << "the leader did not listen; its log is " << log;
  }

  void start_agent(const std::string& name) {
    const fs::path cfg = root_ / (name + ".toml");
    write_private(cfg, common(name) + tls_agent_keys() + "leader_url = \"" + scheme() + "://127.0.0.1:" +
                           std::to_string(port_) +
                           "\"\nadvertise_address = \"127.0.0.1\"\ntask_bind_address = \"127.0.0.1\"\ncores = 1\n" +
                           "task_bin_dir = \"" + kBin + "\"\n");
    daemons_[name] = std::make_unique<Background>(kBin + "/dltrain-agent -c " + cfg.string(),
                                                  (root_ / (name + ".log")).string());
  }

  // Waits until `n` agents are registered and ready.
  void wait_agents(std::size_t n) {
    const auto deadline = Clock::now() + 60s;
    std::size_t ready = 0;
    while (Clock::now() < deadline) {
      auto r = run(client_ + " agents --json", 30);
      if (r.code == 0) {
        ready = 0;
        for (const auto& a : json::parse(r.out)) ready += a["state"] == "ready" ? 1 : 0;
        if (ready == n) return;
      }
      std::this_thread::sleep_for(200ms);
    }
    FAIL() << ready << " of " << n << " agents registered";
  }

  void start_cluster(int agents, const std::string& leader_extra = "") {
    start_leader(leader_extra);
    for (int i = 0; i < agents; ++i) start_agent("agent-" + std::to_string(i));
    wait_agents(static_cast<std::size_t>(agents));
  }

  // SIGKILL, then reap.
  void kill_daemon(const std::string& name) {
    ASSERT_TRUE(daemons_[name]);
    ASSERT_EQ(::kill(daemons_[name]->pid(), SIGKILL), 0);
    daemons_[name]->wait(10);
    daemons_.erase(name);
  }

  std::string submit(const std::string& name, const std::string& body) {
    const fs::path p = root_ / (name + ".toml");
    std::ofstream(p) << "name = \"" << name << "\"\n" << body;
    auto r = run(client_ + " submit " + p.string() + " --json", 30);
    EXPECT_EQ(r.code, 0) << r.out;
    return json::parse(last_line(r.out))["job"].get<std::string>();
  }

  json status(const std::string& job) {
    auto r = run(client_ + " status " + job + " --json", 30);
    if (r.code != 0) return json::object();  // the leader is away
    return json::parse(r.out);
  }

  // Polls until the job is in one of `states`; returns its last status.
  json wait_state(const std::string& job, const std::vector<std::string>& states, int timeout_s) {
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    json st;
    while (Clock::now() < deadline) {
      st = status(job);
      const auto s = st.value("state", "");
      if (std::find(states.begin(), states.end(), s) != states.end()) return st;
      std::this_thread::sleep_for(250ms);
    }
    return st;
  }

  // Polls until worker 0 has reported `epochs` epochs.
  json wait_epochs(const std::string& job, int epochs, int timeout_s) {
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    json st;
    while (Clock::now() < deadline) {
      st = status(job);
      const auto state = st.value("state", "");
      if (st.value("epochs", 0) >= epochs || (state != "running" && state != "starting" && state != "queued")) {
        return st;
      }
      std::this_thread::sleep_for(250ms);
    }
    return st;
  }

  static json task(const json& st, const std::string& name) {
    for (const auto& t : st["tasks"]) {
      if (t["task"] == name) return t;
    }
    return json::object();
  }

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
  std::string tls_agent_keys() const {
    return tls_ ? "tls_ca_file = \"" + (root_ / "ca.pem").string() + "\"\n" : "";
  }

  fs::path root_;
  bool tls_ = false;
  int port_ = 0;
  int leader_starts_ = 0;
  std::string client_;
  std::map<std::string, std::unique_ptr<Background>> daemons_;
};

}  // namespace

TEST_F(Failover, AnAgentHoldingAPsShardIsLostAndTheShardIsRebuiltOnAFreeAgent) {
  start_cluster(4);  // the job takes 3 of the 4 cores
  const std::string job = submit("lose-ps-agent", job_toml(5));
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  ASSERT_GE(st.value("epochs", 0), 1) << st.dump();
  const std::string victim = task(st, "ps-0")["agent"];
  Background follow(client_ + " follow " + job + " --json", (root_ / "follow.jsonl").string());
  std::this_thread::sleep_for(500ms);
  const auto t_kill = Clock::now();
  kill_daemon(victim);

  auto end = wait_state(job, {"succeeded", "failed", "cancelled"}, 300);
  const double recovery_wall = std::chrono::duration<double>(Clock::now() - t_kill).count();
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();  // chance is 0.10
  EXPECT_EQ(end["generation"], 2) << end.dump();
  EXPECT_EQ(end["reassignments"], 1) << end.dump();
  EXPECT_NE(end.value("recovery_reason", "").find("agent " + victim + " was lost"), std::string::npos) << end.dump();
  const json ps = task(end, "ps-0");
  EXPECT_NE(ps["agent"], victim) << end.dump();
  for (const auto& t : end["tasks"]) EXPECT_NE(t["agent"], victim) << end.dump();

  // The follower saw the re-assignment: the lost shard was rebuilt from a surviving
  // worker's replica, which that worker loaded before the other one started.
  ASSERT_EQ(follow.wait(30), 0);
  json reassigned, loaded;
  for (const auto& line : follow.lines()) {
    const auto e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    if (e.value("event", "") == "reassigned") reassigned = e;
    if (e.value("event", "") == "replica_loaded") loaded = e;
  }
  ASSERT_TRUE(reassigned.is_object()) << "no reassigned event";
  EXPECT_EQ(reassigned["generation"], 2);
  ASSERT_TRUE(reassigned.contains("replica_from")) << reassigned.dump();
  ASSERT_TRUE(loaded.is_object()) << "no replica_loaded event";
  EXPECT_EQ(loaded["task"], reassigned["replica_from"]);
  EXPECT_GT(loaded["steps"].get<int>(), 0);
  std::cout << "[ figures  ] agent with the PS shard lost: job " << end["state"] << ", test accuracy "
            << end["test_accuracy"] << ", wall " << end["wall_seconds"] << " s (" << recovery_wall
            << " s after the kill); " << reassigned.dump() << std::endl;
}

TEST_F(Failover, TheLeaderIsKilledAndStartedAgainAndTheRunningJobSucceeds) {
  start_cluster(3);
  const std::string queued_before = submit("history-row", job_toml(1, 2000));
  ASSERT_EQ(wait_state(queued_before, {"succeeded"}, 180).value("state", ""), "succeeded");
  const std::string job = submit("survive-leader", job_toml(4));
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  const auto generation = st["generation"];

  kill_daemon("leader");
  std::this_thread::sleep_for(3s);  // the workers train on without it
  start_leader();

  // Jobs and their records came back from the store; the running job's tasks were
  // adopted (not re-assigned) and it ends well.
  EXPECT_EQ(status(queued_before).value("state", ""), "succeeded");
  auto end = wait_state(job, {"succeeded", "failed", "cancelled"}, 300);
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();
  EXPECT_EQ(end["generation"], generation) << end.dump();
  EXPECT_EQ(end["reassignments"], 0) << end.dump();
  EXPECT_EQ(end["epochs"], 4) << end.dump();
  EXPECT_GT(end["bytes_pushed"].get<double>(), 0) << end.dump();
  // A job submitted to the restarted leader runs as usual, with the next job number.
  const std::string after = submit("after-restart", job_toml(1, 2000));
  EXPECT_GT(std::stoi(after.substr(4)), std::stoi(job.substr(4)));
  EXPECT_EQ(wait_state(after, {"succeeded", "failed"}, 180).value("state", ""), "succeeded");
  std::cout << "[ figures  ] leader killed and restarted: job " << end["state"] << ", test accuracy "
            << end["test_accuracy"] << ", wall " << end["wall_seconds"] << " s" << std::endl;
}

TEST_F(Failover, AnAgentLostWithNoFreeAgentFailsTheJobWithinTheBound) {
  start_cluster(3, "reassign_timeout = \"4s\"\n");  // the job takes every core
  const std::string job = submit("no-spare", job_toml(5));
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  const std::string victim = task(st, "worker-1")["agent"];
  const auto t_kill = Clock::now();
  kill_daemon(victim);
  auto mid = wait_state(job, {"recovering"}, 20);
  EXPECT_EQ(mid.value("state", ""), "recovering") << mid.dump();
  auto end = wait_state(job, {"succeeded", "failed", "cancelled"}, 60);
  const double waited = std::chrono::duration<double>(Clock::now() - t_kill).count();
  ASSERT_EQ(end.value("state", ""), "failed") << end.dump();
  const std::string error = end.value("error", "");
  EXPECT_NE(error.find("agent " + victim + " was lost"), std::string::npos) << error;
  EXPECT_NE(error.find("no agent had free cores for worker-1 within 4 s (reassign_timeout)"), std::string::npos)
      << error;
  // The bound: noticing the loss (at once: its connection closed) + 4 s + the other
  // tasks' stop; well under the heartbeat timeout plus the stop grace plus the bound.
  EXPECT_LT(waited, 3 + 5 + 4 + 5) << end.dump();
  for (const auto& t : end["tasks"]) EXPECT_EQ(t["state"], "exited") << end.dump();
  std::cout << "[ figures  ] no free agent: failed " << waited << " s after the kill: " << error << std::endl;
}

// The same daemons with TLS on the control channel: agents verify the leader's
// certificate against the CA named in their configuration, and so does the client; a
// client that does not trust the CA is refused with the reason, and the cluster carries
// on. A job trains through it.
TEST_F(Failover, ATlsLeaderServesAgentsAndClientsThatTrustItsCa) {
  use_tls();
  start_cluster(3);
  const std::string job = submit("over-tls", job_toml(1, 2000));
  EXPECT_EQ(wait_state(job, {"succeeded", "failed"}, 180).value("state", ""), "succeeded");
  const std::string untrusting =
      kBin + "/dltrain --leader wss://127.0.0.1:" + std::to_string(port_) + " --token " + kClientToken + " agents 2>&1";
  auto r = run(untrusting, 30);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("certificate verify failed"), std::string::npos) << r.out;
  auto plain = run(kBin + "/dltrain --leader ws://127.0.0.1:" + std::to_string(port_) + " --token " + kClientToken +
                       " --timeout 5 agents 2>&1",
                   30);
  EXPECT_EQ(plain.code, 3) << plain.out;
  auto ok = run(client_ + " agents --json", 30);
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_EQ(json::parse(ok.out).size(), 3u);
}

// An agent stopped cleanly (systemctl stop or restart, an upgrade: SIGTERM) stops its
// tasks and says so; the leader re-assigns the job at once, placing nothing on the
// stopping agent, and the job succeeds.
TEST_F(Failover, AnAgentThatShutsDownHasItsTasksReassigned) {
  start_cluster(4);
  const std::string job = submit("agent-stops", job_toml(4));
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  const std::string victim = task(st, "worker-1")["agent"];
  ASSERT_EQ(::kill(daemons_[victim]->pid(), SIGTERM), 0);
  EXPECT_EQ(daemons_[victim]->wait(30), 0) << victim << " did not exit 0 on SIGTERM";
  daemons_.erase(victim);
  auto end = wait_state(job, {"succeeded", "failed", "cancelled"}, 300);
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();
  EXPECT_EQ(end["generation"], 2) << end.dump();
  EXPECT_NE(end.value("recovery_reason", "").find("stopped with its agent " + victim + ", which is shutting down"),
            std::string::npos)
      << end.dump();
  for (const auto& t : end["tasks"]) EXPECT_NE(t["agent"], victim) << end.dump();
}
