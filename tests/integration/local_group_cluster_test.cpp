// Local groups (docs/gpu.md, "Local groups") with real processes: a real leader, a real
// agent, and 2 or 3 dltrain-worker processes of one job on it that form a group over the
// agent's Unix socket (the CPU backend), so that only member 0 pushes to the PS shard.
// A member killed mid-training ends the others at once (naming it); the agent restarts
// them, they form the group again, and the job succeeds.
#include <signal.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/process.h"
#include "support/prometheus.h"
#include "support/names.h"

namespace {

const std::string kJob = R"(model = "mlp"
batch_size = 32
train_samples = 3000
test_samples = 1000
ps_shards = 1
local_group = true
[optimizer]
lr = 0.05
warmup_epochs = 0.2
)";

// The same with ten times the data, for the tests that kill something mid-training: an
// epoch of the MLP takes ~0.2 s on 3,000 images, too short for a test to act within.
std::string longer_job() {
  std::string j = kJob;
  j.replace(j.find("train_samples = 3000"), 20, "train_samples = 30000");
  return j;
}

class LocalGroupCluster : public ::testing::Test, protected LeaderAndAgents {
 protected:
  void SetUp() override { create_root("dltrain-local-group"); }
  void TearDown() override { tear_down(); }

  json agent_json(const std::string& name) {
    const auto r = run(client_ + " agents --json", 30);
    const auto reply = json::parse(r.out, nullptr, false);
    for (const auto& a : reply.is_object() ? reply.value("agents", json::array()) : json::array()) {
      if (a.is_object() && a.value("agent", "") == name) return a;
    }
    return json::object();
  }

  // A counter of one worker task from its agent's /metrics (0 when absent).
  static double worker_counter(const std::string& metrics, const std::string& family, const std::string& job,
                               const std::string& task) {
    const std::string key = family + "{";
    for (std::size_t at = metrics.find(key); at != std::string::npos; at = metrics.find(key, at + 1)) {
      const auto eol = metrics.find('\n', at);
      const std::string line = metrics.substr(at, eol - at);
      if (line.find("job=\"" + job + "\"") != std::string::npos &&
          line.find("task=\"" + task + "\"") != std::string::npos) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return 0;
  }

  std::string task_log(const std::string& job, const std::string& task) {
    return run(client_ + " logs " + job + " --task " + task + " 2>&1", 30).out;
  }
};

}  // namespace

TEST_F(LocalGroupCluster, ThreeWorkersOnOneAgentPushOnlyThroughMemberZero) {
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  start_agent("agent-a", "metrics_address = \"127.0.0.1\"\nmetrics_port = 0\n", "", 4);
  wait_agents(1);
  ASSERT_FALSE(HasFatalFailure());
  const std::string job = submit("group-of-three", "epochs = 2\nworkers = 3\n" + kJob);
  ASSERT_FALSE(job.empty());
  const auto st = wait_end(job);
  ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
  EXPECT_GE(st.value("test_accuracy", 0.0), 0.6) << st.dump();
  // Each member said where it stands; all three agreed on the steps of an epoch.
  for (int r = 0; r < 3; ++r) {
    const auto log = task_log(job, "worker-" + std::to_string(r));
    EXPECT_NE(log.find("local group: worker-" + std::to_string(r) + " (member " + std::to_string(r) +
                       " of 3) joined; 32 steps per epoch"),
              std::string::npos)
        << log;
  }
  // Members 1 and 2 sent the PS only their share of the initialisation (one offer of the
  // parameters); member 0 also pushed every step's summed gradient.
  const auto m = http_get(agent_json("agent-a").value("metrics_endpoint", ""), "/metrics");
  ASSERT_EQ(m.status, 200);
  const double push0 = worker_counter(m.body, "dltrain_worker_push_bytes_total", job, "worker-0");
  const double push1 = worker_counter(m.body, "dltrain_worker_push_bytes_total", job, "worker-1");
  const double push2 = worker_counter(m.body, "dltrain_worker_push_bytes_total", job, "worker-2");
  const double steps0 = worker_counter(m.body, "dltrain_worker_steps_total", job, "worker-0");
  EXPECT_EQ(steps0, 64) << m.body;  // 2 epochs x 32 steps (1000 images of each shard / 32)
  ASSERT_GT(push1, 0) << m.body;
  EXPECT_EQ(push1, push2);
  // 64 pushes of the dense gradient plus the offer: 65 times a member's offer, headers
  // aside (within 2 %).
  EXPECT_NEAR(push0 / push1, 65.0, 65.0 * 0.02) << push0 << " " << push1;
}

TEST_F(LocalGroupCluster, AKilledMemberFailsItsGroupAtOnceAndTheRestartedGroupFinishesTheJob) {
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  start_agent("agent-a", "", "", 3);
  wait_agents(1);
  ASSERT_FALSE(HasFatalFailure());
  const std::string job = submit("group-of-two", "epochs = 4\nworkers = 2\n" + longer_job());
  ASSERT_FALSE(job.empty());
  // Once member 1 trains (its progress reaches the leader), it is killed.
  int victim = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        const auto st = status(job);
        if (st.value("state", "") != "running") return false;
        bool progressed = false;
        for (const auto& t : st.value("tasks", json::array())) {
          progressed |= t.value("task", "") == "worker-1" && t.value("state", "") == "running";
        }
        if (!progressed) return false;
        // This test's member 1: its command line names this test's directory too.
        for (const int pid : processes_mentioning("--local-group-rank 1")) {
          for (const int other : processes_mentioning(root_.string())) victim = pid == other ? pid : victim;
        }
        if (victim < 0) return false;
        return st.value("epochs", 0) >= 1;
      },
      180s, 100ms))
      << status(job).dump();
  ASSERT_GT(victim, 0);
  // The premise, right before the act: member 1 runs and has work left.
  ASSERT_TRUE(dltrain::testing::has_work_left(status(job), "worker-1", 0.3));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto st = wait_end(job);
  ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
  int restarts0 = 0, restarts1 = 0;
  for (const auto& t : st["tasks"]) {
    if (t.value("task", "") == "worker-0") restarts0 = t.value("restarts", 0);
    if (t.value("task", "") == "worker-1") restarts1 = t.value("restarts", 0);
  }
  EXPECT_EQ(restarts1, 1) << st.dump();
  EXPECT_EQ(restarts0, 1) << "member 0 ended with its group and was restarted: " << st.dump();
  // Member 0 named the member that left, and the group formed again.
  const auto log = task_log(job, "worker-0");
  EXPECT_NE(log.find("local group: worker-1 (member 1 of 2) left the group"), std::string::npos) << log;
  EXPECT_GE(st.value("test_accuracy", 0.0), 0.6) << st.dump();
}

// The PS shard's agent dies (SIGKILL: its shard with it) while a local group trains: the
// leader re-assigns the job, the shard is rebuilt elsewhere from one member's replica
// (that member starts first and initialises it; its group-mate follows), the group forms
// again and the job succeeds.
TEST_F(LocalGroupCluster, AShardLostWithItsAgentIsRebuiltAndTheGroupFormsAgain) {
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  start_agent("agent-a", "", "", 2);  // the two workers
  start_agent("agent-p", "", "", 1);  // the PS shard
  start_agent("agent-s", "", "", 1);  // spare: where it moves
  wait_agents(3);
  ASSERT_FALSE(HasFatalFailure());
  const std::string job = submit("group-shard-lost", "epochs = 6\nworkers = 2\n" + longer_job());
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return status(job).value("epochs", 0) >= 1; }, 180s, 100ms)) << status(job).dump();
  const auto before = status(job);
  EXPECT_EQ(task(before, "ps-0").value("agent", ""), "agent-p") << before.dump();
  EXPECT_EQ(task(before, "worker-0").value("agent", ""), "agent-a") << before.dump();
  EXPECT_EQ(task(before, "worker-1").value("agent", ""), "agent-a") << before.dump();
  // The premise, right before the act: the group has work left for the shard.
  ASSERT_TRUE(dltrain::testing::has_work_left(before, "worker-0", 0.3));
  ASSERT_TRUE(dltrain::testing::has_work_left(before, "worker-1", 0.3));
  kill_daemon("agent-p");
  const auto st = wait_end(job);
  ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
  EXPECT_GE(st.value("generation", 0), 2) << st.dump();
  EXPECT_EQ(task(st, "ps-0").value("agent", ""), "agent-s") << st.dump();
  EXPECT_GE(st.value("test_accuracy", 0.0), 0.6) << st.dump();
  // The path this is about: one member (the seed) started alone and rebuilt the shard.
  EXPECT_NE(slurp(root_ / "leader-1.log").find("initialised the shards from its replica; starting the other workers"),
            std::string::npos);
}
