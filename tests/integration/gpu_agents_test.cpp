// Agents report their GPUs: real dltrain-agent daemons and a real leader, each agent
// loading an NVML library at run time. The CI machine has no NVIDIA driver, so the
// library is tests/support/nvml_double.cpp (NVML's C ABI; the devices it reports come
// from the agent's environment); on a GPU machine scripts/gpu-check runs the same
// discovery against the driver's libnvidia-ml.so.1.
#include <dlfcn.h>
#include <signal.h>

#include <cstdlib>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/prometheus.h"
#include "support/names.h"

namespace {

class GpuAgents : public ::testing::Test, protected LeaderAndAgents {
 protected:
  void SetUp() override { create_root("dltrain-gpu-agents"); }
  void TearDown() override { tear_down(); }

  static std::string nvml(const std::string& extra) {
    return "nvml_library = \"" DLTRAIN_NVML_DOUBLE "\"\nmetrics_address = \"127.0.0.1\"\nmetrics_port = 0\n" + extra;
  }

  json agent(const std::string& name) {
    const auto r = run(client_ + " agents --json", 30);
    EXPECT_EQ(r.code, 0) << r.out;
    const auto reply = json::parse(r.out, nullptr, false);
    for (const auto& a : reply.is_object() ? reply.value("agents", json::array()) : json::array()) {
      if (a.is_object() && a.value("agent", "") == name) return a;
    }
    return json::object();
  }
};

}  // namespace

TEST_F(GpuAgents, RegistrationAgentsListingAndMetricsShowTheSelectedGpus) {
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  const std::string three = "NVML_DOUBLE_DEVICES='NVIDIA H200:143771;NVIDIA H200:143771;NVIDIA A100-SXM4-80GB:81920'";
  start_agent("agent-auto", nvml(""), three);
  start_agent("agent-some", nvml("gpus = [2, 0]\n"), three);
  start_agent("agent-none", nvml("gpus = \"none\"\n"), three);
  start_agent("agent-nodriver",
              "nvml_library = \"libdltrain-no-such-nvml.so.1\"\nmetrics_address = \"127.0.0.1\"\nmetrics_port = 0\n");
  wait_agents(4);
  ASSERT_FALSE(HasFatalFailure());

  const auto a = agent("agent-auto");
  ASSERT_EQ(a["gpus"].size(), 3u) << a.dump();
  EXPECT_EQ(a["gpus"][0]["name"], "NVIDIA H200");
  EXPECT_EQ(a["gpus"][2]["name"], "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(a["gpus"][2]["memory_mb"], 81920);
  EXPECT_EQ(a["gpus_free"], 3);
  const auto s = agent("agent-some");
  ASSERT_EQ(s["gpus"].size(), 2u) << s.dump();
  EXPECT_EQ(s["gpus"][0]["index"], 2);
  EXPECT_EQ(s["gpus"][1]["index"], 0);
  for (const char* name : {"agent-none", "agent-nodriver"}) {
    const auto n = agent(name);
    ASSERT_TRUE(n.contains("gpus") && n["gpus"].is_array()) << n.dump();
    EXPECT_TRUE(n["gpus"].empty()) << n.dump();
    EXPECT_EQ(n["gpus_free"], 0);
  }
  EXPECT_NE(slurp(root_ / "agent-none.log").find("no GPUs (gpus = \"none\")"), std::string::npos);

  // The text listing names them; the agents' logs say what was found and why not.
  const auto text = run(client_ + " agents", 30);
  EXPECT_NE(text.out.find("2/2 GPUs free: 2 NVIDIA A100-SXM4-80GB (81920 MiB) 0 NVIDIA H200 (143771 MiB)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(slurp(root_ / "agent-auto.log").find("3 GPUs: 0 NVIDIA H200 (143771 MiB)"), std::string::npos);
  EXPECT_NE(slurp(root_ / "agent-nodriver.log").find("no GPUs (NVML could not be loaded"), std::string::npos);
  EXPECT_NE(slurp(root_ / "leader-1.log").find("agent agent-some registered"), std::string::npos);

  // Prometheus families on the agent's own endpoint.
  const auto m = http_get(s.value("metrics_endpoint", ""), "/metrics");
  ASSERT_EQ(m.status, 200) << s.dump();
  EXPECT_NE(m.body.find("dltrain_agent_gpus{agent=\"agent-some\"} 2"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("dltrain_agent_gpus_free{agent=\"agent-some\"} 2"), std::string::npos);
  EXPECT_NE(m.body.find("dltrain_agent_gpu_memory_bytes{agent=\"agent-some\",gpu=\"2\",model=\"NVIDIA A100-SXM4-80GB\"} "
                        "85899345920"),
            std::string::npos)
      << m.body;
  const auto none = http_get(agent("agent-nodriver").value("metrics_endpoint", ""), "/metrics");
  EXPECT_NE(none.body.find("dltrain_agent_gpus{agent=\"agent-nodriver\"} 0"), std::string::npos) << none.body;
}

TEST_F(GpuAgents, AnAgentConfiguredForAGpuItDoesNotHaveRefusesToStartAndSaysWhich) {
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  start_agent("agent-x", nvml("gpus = [0, 4]\n"), "NVML_DOUBLE_DEVICES='NVIDIA H200:143771;NVIDIA H200:143771'");
  auto* d = daemon("agent-x");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->wait(30), 2);  // a configuration error
  EXPECT_NE(slurp(root_ / "agent-x.log").find("gpus: GPU 4 is not on this machine (NVML found 2: 0, 1)"),
            std::string::npos)
      << slurp(root_ / "agent-x.log");
}

TEST(GpuAgentCli, ListGpusPrintsWhatNvmlFoundAndWhatTheConfigurationOffers) {
  const auto dir = make_temp_root("dltrain-list-gpus");
  const auto cfg = dir / "agent.toml";
  write_private(cfg, "agent_token = \"list-gpus-agent-token-0123456789abcdef\"\ngpus = [1]\nnvml_library = \"" +
                         std::string(DLTRAIN_NVML_DOUBLE) + "\"\n");
  const auto r = run("env NVML_DOUBLE_DEVICES='NVIDIA H200:143771;NVIDIA L4:23034' " + kBinDir +
                         "/dltrain-agent --list-gpus -c " + cfg.string() + " 2>/dev/null",
                     30);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["found"].size(), 2u);
  ASSERT_EQ(j["offered"].size(), 1u);
  EXPECT_EQ(j["offered"][0]["name"], "NVIDIA L4");
  EXPECT_EQ(j["offered"][0]["memory_mb"], 23034);
  EXPECT_EQ(j["driver_version"], "580.65.06");
  EXPECT_EQ(j["problem"], "");
  // Without a configuration: the driver's library; on a machine without one, nothing
  // found, and why.
  const auto none = run(kBinDir + "/dltrain-agent --list-gpus -c " + (dir / "absent.toml").string() + " 2>&1", 30);
  EXPECT_EQ(none.code, 0);
  if (void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);  // a GPU machine: what it found is scripts/gpu-check's to judge
  } else {
    EXPECT_NE(none.out.find("no GPUs (NVML could not be loaded: libnvidia-ml.so.1"), std::string::npos) << none.out;
  }
  std::filesystem::remove_all(dir);
}

// GPU jobs (docs/gpu.md): a cuda job that can never fit is refused at submit with the
// numbers; one that fits waits for free GPUs with them in its status; a worker is placed
// on a free GPU, started with CUDA_VISIBLE_DEVICES naming it, and — with this build's
// CPU-only LibTorch — fails at start saying so, not restarted, its GPU given back.
TEST_F(GpuAgents, GpuJobsAreRefusedQueuedAndPlacedByTheirFreeGpus) {
  // agent-cpu is stopped (SIGSTOP) below while several commands run: not long enough for
  // the leader to call it lost.
  heartbeat_timeout_ = "60s";
  start_leader();
  ASSERT_FALSE(HasFatalFailure());
  start_agent("agent-g2", nvml(""), "NVML_DOUBLE_DEVICES='NVIDIA H200:143771;NVIDIA H200:143771'", 3);
  start_agent("agent-cpu", nvml("gpus = \"none\"\n"), "", 2);
  wait_agents(2);
  ASSERT_FALSE(HasFatalFailure());
  const std::string base = "model = \"mlp\"\nepochs = 1\nbatch_size = 64\ntrain_samples = 512\ntest_samples = 256\n"
                           "device = \"cuda\"\nps_shards = 1\n";

  // Never fits: refused at once, naming the numbers.
  auto big = run(client_ + " submit " + write_job_file(root_, "big", base + "workers = 1\ngpus_per_worker = 3\n").string() + " 2>&1", 30);
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.out.find("gpus_per_worker = 3: no agent offers that many GPUs (the most on one agent is 2; 2 agents "
                         "(agent-cpu: 0, agent-g2: 2 GPUs))"),
            std::string::npos)
      << big.out;
  auto many = run(client_ + " submit " + write_job_file(root_, "many", base + "workers = 3\n").string() + " 2>&1", 30);
  EXPECT_NE(many.code, 0);
  EXPECT_NE(many.out.find("3 workers x 1 GPUs = 3 GPUs, more than the cluster can give (2 GPUs on 2 agents"),
            std::string::npos)
      << many.out;

  // Job a takes both GPUs. Its PS shard goes to agent-cpu (the most free cores once the
  // workers are placed), which is stopped (SIGSTOP) for a few seconds: a stays
  // "starting", its workers placed and pending, holding their GPUs.
  auto* cpu_agent = daemon("agent-cpu");
  ASSERT_NE(cpu_agent, nullptr);
  ASSERT_EQ(::kill(cpu_agent->pid(), SIGSTOP), 0);
  const std::string a = submit("a", base + "workers = 2\n");
  ASSERT_FALSE(a.empty());
  auto sa = status(a);
  for (int w = 0; w < 2; ++w) {
    const auto t = task(sa, "worker-" + std::to_string(w));
    EXPECT_EQ(t.value("agent", ""), "agent-g2") << sa.dump();
    EXPECT_EQ(t["gpus"], json::array({w})) << sa.dump();
  }
  EXPECT_EQ(task(sa, "ps-0").value("agent", ""), "agent-cpu") << sa.dump();
  EXPECT_EQ(agent("agent-g2")["gpus_free"], 0);

  // Job b needs one GPU: none is free, so it waits, and says what for.
  const std::string b = submit("b", base + "workers = 1\n");
  ASSERT_FALSE(b.empty());
  const auto sb = status(b);
  EXPECT_EQ(sb.value("state", ""), "queued") << sb.dump();
  EXPECT_EQ(sb.value("gpus_needed", -1), 1) << sb.dump();
  EXPECT_EQ(sb.value("gpus_free", -1), 0) << sb.dump();
  EXPECT_EQ(sb.value("gpus_total", -1), 2) << sb.dump();
  const auto text = run(client_ + " status " + b, 30);
  EXPECT_NE(text.out.find("needs 1 GPUs, 0 free, 2 in the cluster"), std::string::npos) << text.out;

  // a is cancelled: its GPUs come back, b gets GPU 0 and its worker fails at start.
  EXPECT_EQ(run(client_ + " cancel " + a, 30).code, 0);
  ASSERT_EQ(::kill(cpu_agent->pid(), SIGCONT), 0);
  EXPECT_EQ(wait_state(a, {"cancelled"}, 60).value("state", ""), "cancelled");
  const auto fb = wait_state(b, {"failed", "succeeded"}, 120);
  ASSERT_EQ(fb.value("state", ""), "failed") << fb.dump();
  const auto w = task(fb, "worker-0");
  EXPECT_EQ(w["gpus"], json::array({0})) << fb.dump();
  const std::string error = w.value("error", "");
  if (error.find("built without CUDA") != std::string::npos) {
    EXPECT_NE(error.find("CUDA_VISIBLE_DEVICES=\"0\""), std::string::npos) << error;
  } else {
    // A CUDA-enabled LibTorch: the stand-in's GPU 0 is not a CUDA device here.
    EXPECT_NE(error.find("no CUDA device is visible to this worker"), std::string::npos) << error;
  }
  EXPECT_EQ(w.value("restarts", 0), 0) << "a configuration error is not restarted: " << fb.dump();
  EXPECT_TRUE(wait_until([&] { return agent("agent-g2").value("gpus_free", -1) == 2; }, std::chrono::seconds(30),
                         std::chrono::milliseconds(200)));
}

// A standalone cluster on a GPU machine: --gpus gives its first agent the GPUs (the
// others share the machine and offer none); a bad --gpus stops it before it starts.
TEST(GpuStandalone, TheFirstAgentOffersTheGpusOfGpusAndTheOthersNone) {
  const auto dir = make_temp_root("dltrain-gpu-standalone");
  ::setenv("NVML_DOUBLE_DEVICES", "NVIDIA H200:143771;NVIDIA H200:143771", 1);
  {
    Standalone cluster(dir / "state", dir / "xdg", 2, {"--gpus", "1", "--nvml-library", DLTRAIN_NVML_DOUBLE});
    ASSERT_FALSE(cluster.client.empty()) << slurp(dir / "standalone.log");
    const auto r = run(cluster.client + " agents --json", 30);
    const auto reply = json::parse(r.out, nullptr, false);
    const auto agents = reply.is_object() ? reply.value("agents", json()) : json();
    ASSERT_TRUE(agents.is_array()) << r.out;
    std::map<std::string, json> by_name;
    for (const auto& a : agents) by_name[a.value("agent", "")] = a;
    ASSERT_EQ(by_name["local-0"]["gpus"].size(), 1u) << r.out;
    EXPECT_EQ(by_name["local-0"]["gpus"][0]["index"], 1);
    EXPECT_TRUE(by_name["local-1"]["gpus"].empty()) << r.out;
    EXPECT_EQ(cluster.stop(), 0);
  }
  // A GPU the machine does not have: the first agent refuses to start, and the cluster
  // stops at once with its reason (not after waiting 60 s for it to register).
  const auto missing = run("env NVML_DOUBLE_DEVICES='NVIDIA H200:143771;NVIDIA H200:143771' " + kBinDir +
                               "/dltrain-agent --standalone --agents 2 --gpus 5 --nvml-library " + DLTRAIN_NVML_DOUBLE +
                               " --state-dir " + (dir / "missing").string() + " 2>&1",
                           30);
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("agent local-0: dltrain-agent: configuration error: gpus: GPU 5 is not on this machine "
                             "(NVML found 2: 0, 1)"),
            std::string::npos)
      << missing.out;
  ::unsetenv("NVML_DOUBLE_DEVICES");
  const auto bad = run(kBinDir + "/dltrain-agent --standalone --gpus most --state-dir " + (dir / "bad").string() +
                           " 2>&1",
                       30);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--gpus: expected none, auto or GPU indices 0-63 separated by commas (0,1), got \"most\""),
            std::string::npos)
      << bad.out;
  std::filesystem::remove_all(dir);
}
