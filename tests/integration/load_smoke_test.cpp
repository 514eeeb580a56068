// The control-plane load tool (bench/load, control_load) against a real leader process,
// small and short, so that the tool does not rot: its simulated agents must register,
// heartbeat and run every job its clients submit, with no error and no agent lost, and
// its report must say so with the right counts.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/names.h"

namespace {

class LoadSmoke : public ::testing::Test, protected LeaderAndAgents {
 protected:
  void SetUp() override { create_root("dltrain-load-smoke"); }
  void TearDown() override { tear_down(); }
};

// The leader keeps job_retention finished jobs: the simulated agents run short jobs, and
// the older ones are removed from memory and from the store.
class JobRetention : public ::testing::Test, protected LeaderAndAgents {
 protected:
  void SetUp() override { create_root("dltrain-retention"); }
  void TearDown() override { tear_down(); }
  std::vector<std::string> listed(const std::string& flags = "") {
    const auto r = run(client_ + " list --json " + flags + " 2>/dev/null", 30);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<std::string> ids;
    const auto reply = json::parse(r.out, nullptr, false);
    const auto j = reply.is_object() ? reply.value("jobs", json()) : json();
    if (j.is_array()) {
      for (const auto& job : j) ids.push_back(job.value("job", ""));
    }
    return ids;
  }
};

}  // namespace

TEST_F(JobRetention, OnlyTheLatestFinishedJobsAreKeptAcrossALeaderRestartAndListHonoursItsLimit) {
  start_leader("job_retention = 3\n");
  ASSERT_FALSE(HasFatalFailure());
  // Two jobs a second for 4 s, each 1 epoch of 0.3 s; the clients only list (a status
  // of a job that was retired meanwhile would be an error the tool counts).
  const std::string cmd = kBinDir + "/control_load --leader ws://127.0.0.1:" + std::to_string(port_) +
                          " --agent-token-file " + (root_ / "agent.token").string() + " --client-token-file " +
                          (root_ / "client.token").string() +
                          " --agents 4 --clients 1 --duration 4 --submit-rate 2 --job-epochs 1 --epoch-seconds 0.3"
                          " --progress-interval 0.2 --task-start 0.1 --client-interval 0.5 --drain-timeout 15"
                          " --weight-status 0 --weight-follow 0 --weight-list 1 --out " +
                          (root_ / "load.json").string();
  run(cmd, 60);
  const json rep = json::parse(slurp(root_ / "load.json"), nullptr, false);
  ASSERT_TRUE(rep.is_object()) << cmd;
  const int submitted = rep["jobs"]["submitted"].get<int>();
  ASSERT_GE(submitted, 5) << rep["jobs"].dump();
  EXPECT_EQ(rep["jobs"]["succeeded"], submitted) << rep["jobs"].dump();

  // The last three, newest last; the first is gone from status too.
  const auto latest = [&] {
    std::vector<std::string> ids;
    for (int n = submitted - 2; n <= submitted; ++n) ids.push_back("job-" + std::to_string(n));
    return ids;
  }();
  EXPECT_EQ(listed(), latest);
  const auto gone = run(client_ + " status job-1 2>&1", 30);
  EXPECT_NE(gone.code, 0);
  EXPECT_NE(gone.out.find("no job \"job-1\""), std::string::npos) << gone.out;
  EXPECT_NE(slurp(root_ / "leader-1.log").find("job retention (3 finished jobs kept): removed"), std::string::npos);
  // list --limit 2: the newest two, and a note of what was left out.
  EXPECT_EQ(listed("--limit 2"), (std::vector<std::string>{latest[1], latest[2]}));
  const auto text = run(client_ + " list --limit 2 2>&1", 30);
  EXPECT_NE(text.out.find("(the latest 2 of 3 jobs the leader keeps; --limit N shows more)"), std::string::npos)
      << text.out;

  // Restarted, the leader has the same three: the removed ones are gone from its store.
  ASSERT_EQ(::kill(daemons_["leader"]->pid(), SIGTERM), 0);
  EXPECT_EQ(daemons_["leader"]->wait(30), 0);
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(listed(), latest);
  // A new job continues the numbering.
  const auto path = write_job_file(root_, "after-restart",
                                    "data_dir = \"/usr/share/datasets/fashion-mnist\"\nmodel = \"cnn\"\n"
                                    "workers = 1\nps_shards = 1\nepochs = 1\n");
  EXPECT_EQ(submit_job(client_, path), "job-" + std::to_string(submitted + 1));
}

TEST_F(LoadSmoke, FiveAgentsAndThreeClientsRunEveryJobWithoutAnErrorOrALostAgent) {
  start_leader();  // loopback, port 0; heartbeat every 500 ms, an agent lost after 3 s
  ASSERT_FALSE(HasFatalFailure());
  const auto out = root_ / "load.json";
  // 6 s measured; a job submitted every second: 1 PS shard + 2 workers of 2 epochs of 1 s.
  const std::string cmd = kBinDir + "/control_load --leader ws://127.0.0.1:" + std::to_string(port_) +
                          " --agent-token-file " + (root_ / "agent.token").string() + " --client-token-file " +
                          (root_ / "client.token").string() +
                          " --agents 5 --clients 3 --duration 6 --submit-rate 1 --epoch-seconds 1"
                          " --progress-interval 0.5 --task-start 0.2 --client-interval 0.5 --drain-timeout 15"
                          " --monitor-interval 1 --leader-pid " +
                          std::to_string(daemons_["leader"]->pid()) + " --out " + out.string();
  const auto r = run(cmd, 60);
  const json rep = json::parse(slurp(out), nullptr, false);
  ASSERT_TRUE(rep.is_object()) << "no report from: " << cmd;
  EXPECT_EQ(r.code, 0) << rep.dump(1);

  EXPECT_EQ(rep["errors"]["total"], 0) << rep["errors"].dump(1);
  EXPECT_EQ(rep["sessions"]["agents"]["registered"], 5);
  EXPECT_EQ(rep["sessions"]["clients"]["connected"], 3);
  // The leader's own view, read over a client session before the tool closed anything.
  EXPECT_TRUE(rep["agents_lost"]["final_view_read"].get<bool>());
  EXPECT_EQ(rep["agents_lost"]["lost"], 0);
  EXPECT_EQ(rep["agents_lost"]["max_lost_seen"], 0);
  EXPECT_EQ(rep["agents_lost"]["ready_at_end"], 5);
  EXPECT_EQ(slurp(root_ / "leader-1.log").find(" lost: "), std::string::npos) << "the leader declared an agent lost";
  // The leader said 500 ms (register reply): 5 agents x 12 per 6 s, each answered.
  const auto& hb = rep["heartbeats"];
  EXPECT_GE(hb["sent"].get<int>(), 50);
  EXPECT_LE(hb["sent"].get<int>(), 65);
  EXPECT_EQ(hb["acked"], hb["sent"]);
  EXPECT_EQ(rep["latency_ms"]["heartbeat"]["n"], hb["acked"]);
  EXPECT_LT(hb["leader_max_silence_s"].get<double>(), 3.0);  // its heartbeat_timeout

  // About one job per second, every one succeeded; three tasks each, all ended.
  const auto& jobs = rep["jobs"];
  EXPECT_GE(jobs["submitted"].get<int>(), 4);
  EXPECT_LE(jobs["submitted"].get<int>(), 7);
  EXPECT_EQ(jobs["succeeded"], jobs["submitted"]) << jobs.dump(1);
  EXPECT_EQ(jobs["tasks_started"].get<int>(), 3 * jobs["submitted"].get<int>());
  EXPECT_EQ(jobs["tasks_finished"], jobs["tasks_started"]);
  // A job's wall time: the leader starts the workers once the shard listens (0.2 s), then
  // 0.2 s to their first event and 2 epochs of 1 s.
  EXPECT_GE(jobs["wall_s"]["p50"].get<double>(), 2.4);
  EXPECT_LT(jobs["wall_s"]["max"].get<double>(), 10.0);
  EXPECT_EQ(rep["latency_ms"]["submit"]["n"], jobs["submitted"]);

  // Every request kind was measured, and followers got the relayed task events.
  for (const char* kind : {"register", "heartbeat", "task_event", "status", "agents"}) {
    EXPECT_GT(rep["latency_ms"].value(kind, json::object()).value("n", 0), 0) << kind;
  }
  EXPECT_GT(rep["messages"]["events_to_followers"].get<int>(), 0);
  EXPECT_GT(rep["leader"]["rss_mb_max"].get<double>(), 1.0);  // read from /proc/PID
  EXPECT_TRUE(rep["passed"].get<bool>());
}
