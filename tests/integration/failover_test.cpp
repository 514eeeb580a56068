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

#include "support/cluster.h"
#include "support/process.h"
#include "support/wait.h"
#include "support/names.h"

namespace {

using Clock = std::chrono::steady_clock;
const std::string kBin = dltrain::testing::kBinDir;

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

// A leader and agents of 1 core each as separate processes (support/cluster.h).
class Failover : public ::testing::Test, protected dltrain::testing::LeaderAndAgents {
 protected:
  void SetUp() override { create_root("dltrain-failover"); }
  void TearDown() override { tear_down(); }

  /// The agent of `job`'s worker-1 once it trains (at most 180 s), checked right before
  /// the caller acts on it to have at least half of its work left; "" (with a failed
  /// expectation saying why) when not.
  std::string agent_of_training_worker1(const std::string& job) {
    const auto st = dltrain::testing::wait_task_trains(client_, job, "worker-1", 180);
    EXPECT_EQ(st.value("state", ""), "running") << st.dump();
    if (st.value("state", "") != "running") return "";
    const std::string agent = task(st, "worker-1")["agent"];
    const bool left = dltrain::testing::has_work_left(status(job), "worker-1", 0.5);
    EXPECT_TRUE(left) << "worker-1 has less than half of its work left";
    return left ? agent : "";
  }
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
  // The follower is subscribed once it relays an event (the workers report progress
  // every second), so that it sees the re-assignment.
  ASSERT_TRUE(wait_until([&] { return !follow.lines().empty(); }, 60s, 50ms)) << "the follower relayed nothing";
  // The premise, right before the act: both workers still train, so the shard's loss
  // interrupts a job that has work left.
  st = status(job);
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.3));
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.3));
  const auto t_kill = Clock::now();
  kill_daemon(victim);

  auto end = wait_end(job);
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

TEST_F(Failover, PsShardsSpreadBesideTheWorkersAndAShardLostWithItsAgentIsRebuilt) {
  // Two agents of 2 cores. A job that leaves ps_shards and [ps] partition_size out (both
  // "auto"): its cnn (60,986 floats, one partition of the default 262,144) may be cut in
  // partitions down to 16,384 floats, 8 of them: more than it can have shards. place():
  // ps-0 on agent-0 (a tie: the first), worker-0 on agent-1 (2 free against 1),
  // worker-1 on agent-0 (a tie at 1). agent-1 keeps a core beside worker-0: ps-1 goes
  // there (leader/placement.h, spread_shards). Every core is then taken.
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  for (const char* name : {"agent-0", "agent-1"}) start_agent(name, "", "", 2);
  wait_agents(2);
  const std::string body = std::regex_replace(job_toml(6), std::regex("ps_shards = 1\n"), "");
  ASSERT_EQ(body.find("partition_size"), std::string::npos) << body;
  const std::string file = dltrain::testing::write_job_file(root_, "spread", body);
  Background submitted(client_ + " submit " + file + " --follow --json", (root_ / "submit.jsonl").string());
  std::string job;
  ASSERT_TRUE(wait_until(
      [&] {
        for (const auto& line : submitted.lines()) {
          const auto e = json::parse(line, nullptr, false);
          if (e.is_object() && e.value("event", "") == "submitted") job = e.value("job", "");
        }
        return !job.empty();
      },
      60s, 50ms))
      << "no submitted line";
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  EXPECT_EQ(task(st, "ps-0")["agent"], "agent-0") << st.dump();
  EXPECT_EQ(task(st, "ps-1")["agent"], "agent-1") << st.dump();
  EXPECT_EQ(task(st, "worker-0")["agent"], "agent-1") << st.dump();
  EXPECT_EQ(task(st, "worker-1")["agent"], "agent-0") << st.dump();
  EXPECT_EQ(st["ps_shards"], 2) << st.dump();
  // Both shards hold parameters: each worker pushes to and pulls from both.
  json spread;
  for (const auto& line : submitted.lines()) {
    const auto e = json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == "ps_shards") spread = e;
  }
  ASSERT_TRUE(spread.is_object()) << "no ps_shards event";
  EXPECT_EQ(spread["ps_shards"], 2);
  EXPECT_EQ(spread["agents"], json({"agent-0", "agent-1"}));
  // The cnn's even cut for 2 shards (tests/unit/ps_memory_test.cpp works it by hand):
  // 30,266 and 30,720 floats a shard.
  EXPECT_EQ(spread["partition_size"], 16384);

  // A machine joins with room for what agent-1 holds; then agent-1 goes, with worker-0
  // and ps-1, while both workers have work left.
  start_agent("agent-2", "", "", 2);
  wait_agents(3);
  st = status(job);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.3));
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.3));
  kill_daemon("agent-1");

  // Recovery is what it is for one shard: both lost tasks placed again (on agent-2, the
  // only agent with room), ps-1 rebuilt, the job ends well with its two shards.
  auto end = wait_end(job);
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();  // chance is 0.10
  EXPECT_EQ(end["generation"], 2) << end.dump();
  EXPECT_EQ(end["reassignments"], 1) << end.dump();
  EXPECT_EQ(end["ps_shards"], 2) << end.dump();
  EXPECT_EQ(task(end, "ps-1")["agent"], "agent-2") << end.dump();
  EXPECT_EQ(task(end, "worker-0")["agent"], "agent-2") << end.dump();
  EXPECT_EQ(task(end, "ps-0")["agent"], "agent-0") << end.dump();
  std::cout << "[ figures  ] spread shards, agent-1 lost: job " << end["state"] << ", test accuracy "
            << end["test_accuracy"] << ", wall " << end["wall_seconds"] << " s" << std::endl;
}

TEST_F(Failover, TheLeaderIsKilledAndStartedAgainAndTheRunningJobSucceeds) {
  start_cluster(3);
  const std::string queued_before = submit("history-row", job_toml(1, 2000));
  ASSERT_EQ(wait_end(queued_before).value("state", ""), "succeeded");
  const std::string job = submit("survive-leader", job_toml(6));
  auto st = wait_epochs(job, 1, 180);
  ASSERT_EQ(st.value("state", ""), "running") << st.dump();
  const auto generation = st["generation"];
  // The premise, right before the act: both workers have work left to do without a leader.
  st = status(job);
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.3));
  ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.3));

  // The shard's checkpoint (rewritten every 2 s, ps_checkpoint_interval) holds the
  // parameters; once it changes after the kill, the workers have pushed without a leader.
  const fs::path checkpoint = root_ / task(st, "ps-0")["agent"].get<std::string>() / "tasks" / job /
                              ("ps-0-g" + std::to_string(generation.get<int>())) / "shard.ckpt";
  kill_daemon("leader");
  const std::string at_kill = dltrain::testing::slurp(checkpoint);
  ASSERT_TRUE(wait_until([&] { return dltrain::testing::slurp(checkpoint) != at_kill; }, 60s, 50ms))
      << "the workers did not train on without the leader: " << checkpoint << " did not change";
  start_leader();

  // Jobs and their records came back from the store; the running job's tasks were
  // adopted (not re-assigned) and it ends well.
  EXPECT_EQ(status(queued_before).value("state", ""), "succeeded");
  auto end = wait_end(job);
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();
  EXPECT_EQ(end["generation"], generation) << end.dump();
  EXPECT_EQ(end["reassignments"], 0) << end.dump();
  EXPECT_EQ(end["epochs"], 6) << end.dump();
  EXPECT_GT(end["bytes_pushed"].get<double>(), 0) << end.dump();
  // A job submitted to the restarted leader runs as usual, with the next job number.
  const std::string after = submit("after-restart", job_toml(1, 2000));
  EXPECT_GT(std::stoi(after.substr(4)), std::stoi(job.substr(4)));
  EXPECT_EQ(wait_end(after).value("state", ""), "succeeded");
  std::cout << "[ figures  ] leader killed and restarted: job " << end["state"] << ", test accuracy "
            << end["test_accuracy"] << ", wall " << end["wall_seconds"] << " s" << std::endl;
}

TEST_F(Failover, AnAgentLostWithNoFreeAgentFailsTheJobWithinTheBound) {
  start_cluster(3, "reassign_timeout = \"4s\"\n");  // the job takes every core
  // The job fails here, so its length costs nothing: long enough that worker 1 is far
  // from done when its agent is lost, whatever the relative speed of the processes.
  const std::string job = submit("no-spare", job_toml(20));
  // The premise, right before the act: worker 1 runs and has most of its work left.
  const std::string victim = agent_of_training_worker1(job);
  ASSERT_FALSE(victim.empty());
  const auto t_kill = Clock::now();
  kill_daemon(victim);
  auto mid = wait_state(job, {"recovering"}, 20);
  EXPECT_EQ(mid.value("state", ""), "recovering") << mid.dump();
  EXPECT_GE(mid.value("recovering_seconds", -1.0), 0.0) << mid.dump();
  // The text status says so too, with the reason (the job stays recovering for the 4 s
  // of reassign_timeout).
  const auto text = run(client_ + " status " + job + " 2>&1", 30);
  EXPECT_NE(text.out.find("  recovering for "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("because agent " + victim + " was lost"), std::string::npos) << text.out;
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
  EXPECT_EQ(wait_end(job).value("state", ""), "succeeded");
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
  EXPECT_EQ(json::parse(ok.out)["agents"].size(), 3u);
}

// An agent stopped cleanly (systemctl stop or restart, an upgrade: SIGTERM) stops its
// tasks and says so; the leader re-assigns the job at once, placing nothing on the
// stopping agent, and the job succeeds.
TEST_F(Failover, AnAgentThatShutsDownHasItsTasksReassigned) {
  start_cluster(4);
  const std::string job = submit("agent-stops", job_toml(4));
  // The premise, right before the act: worker 1 runs and has most of its work left (it
  // is stopped at its first report, within a second or two of its start).
  const std::string victim = agent_of_training_worker1(job);
  ASSERT_FALSE(victim.empty());
  ASSERT_EQ(::kill(daemons_[victim]->pid(), SIGTERM), 0);
  EXPECT_EQ(daemons_[victim]->wait(30), 0) << victim << " did not exit 0 on SIGTERM";
  daemons_.erase(victim);
  auto end = wait_end(job);
  ASSERT_EQ(end.value("state", ""), "succeeded") << end.dump();
  EXPECT_GE(end["test_accuracy"].get<double>(), 0.6) << end.dump();
  EXPECT_EQ(end["generation"], 2) << end.dump();
  EXPECT_NE(end.value("recovery_reason", "").find("stopped with its agent " + victim + ", which is shutting down"),
            std::string::npos)
      << end.dump();
  for (const auto& t : end["tasks"]) EXPECT_NE(t["agent"], victim) << end.dump();
}
