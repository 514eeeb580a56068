// The Slurm launcher's decisions (lib/launch/slurm.h): node lists expanded by Slurm's own
// scontrol (a minimal slurm.conf of the test's own, no daemon needed), the allocation
// and each node's grant read from the environment Slurm gives, the plan carried through
// the environment, each node's agent configuration (parsed back by the agent's own
// parser), and whether a job fits what the agents offer, each failure with its message.
// The real allocation (slurmctld, slurmd, munge) is tests/integration/slurm_test.py's.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/secret.h"
#include "config/options.h"
#include "job/job_spec.h"
#include "launch/command.h"
#include "launch/slurm.h"
#include "support/temp_dir.h"

using namespace dltrain;
using namespace dltrain::launch;
namespace fs = std::filesystem;

namespace {

bool have_scontrol() { return std::system("command -v scontrol >/dev/null 2>&1") == 0; }

/// A slurm.conf of the test's own: scontrol reads it to expand host lists (the grammar
/// is Slurm's); nothing contacts a controller.
class Hostlists : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_scontrol()) GTEST_SKIP() << "scontrol (Debian's slurm-client) is not installed";
    dir_ = fs::temp_directory_path() / ("dltrain-slurm-unit-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "slurm.conf") << "ClusterName=unit\nSlurmctldHost=localhost\n"
                                          "NodeName=n[1-3] CPUs=1\nPartitionName=p Nodes=ALL Default=YES\n";
    old_ = std::getenv("SLURM_CONF") ? std::getenv("SLURM_CONF") : "";
    ::setenv("SLURM_CONF", (dir_ / "slurm.conf").c_str(), 1);
  }
  void TearDown() override {
    if (dir_.empty()) return;
    if (old_.empty()) {
      ::unsetenv("SLURM_CONF");
    } else {
      ::setenv("SLURM_CONF", old_.c_str(), 1);
    }
    fs::remove_all(dir_);
  }
  fs::path dir_;
  std::string old_;
};

std::string launch_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "(no LaunchError)";
}

Environment allocation() {
  return {{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_JOB_NUM_NODES", "3"},
          {"SLURM_SUBMIT_DIR", "/home/u/run"}};
}

Environment step_task() {
  return {{"SLURMD_NODENAME", "n2"}, {"SLURM_NODEID", "1"}, {"SLURM_CPUS_ON_NODE", "8"}};
}

LaunchPlan plan_of_three() {
  LaunchPlan p;
  p.job_id = "42";
  p.leader_node = "n1";
  p.port = 7171;
  p.addresses = {{"n1", "10.0.0.1"}, {"n2", "10.0.0.2"}, {"n3", "10.0.0.3"}};
  p.agent_token = std::string(64, 'a');
  p.client_token = std::string(64, 'c');
  p.state_root = "/scratch";
  return p;
}

JobSpec job(const std::string& extra) {
  return parse_job_toml("data_dir = \"/usr/share/datasets/fashion-mnist\"\n" + extra, "/tmp", true);
}

}  // namespace

TEST_F(Hostlists, SlurmExpandsRangesListsAndZeroPadding) {
  const auto run = default_runner();
  EXPECT_EQ(expand_hostlist("n[1-3]", run), (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_EQ(expand_hostlist("gpu[01-02,7],x", run), (std::vector<std::string>{"gpu01", "gpu02", "gpu7", "x"}));
  EXPECT_EQ(expand_hostlist("node-[008-011]", run),
            (std::vector<std::string>{"node-008", "node-009", "node-010", "node-011"}));
  EXPECT_EQ(expand_hostlist("node-0", run), (std::vector<std::string>{"node-0"}));
  // Two ranges in one name: the cross product, first range outermost.
  EXPECT_EQ(expand_hostlist("r[1-2]c[1-2]", run), (std::vector<std::string>{"r1c1", "r1c2", "r2c1", "r2c2"}));
}

TEST_F(Hostlists, AMalformedListIsRejectedWithScontrolsReason) {
  // A range that runs backwards: scontrol exits 0 but prints no host, and says why on stderr.
  const auto msg = launch_error([] { expand_hostlist("n[3-1]", default_runner()); });
  EXPECT_NE(msg.find("cannot expand the node list \"n[3-1]\": `scontrol show hostnames n[3-1]` printed no host names: "),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("Invalid range: `3-1'"), std::string::npos) << msg;
}

TEST(SlurmLaunch, WithoutScontrolTheMessageSaysSo) {
  const CommandRunner run = [](const std::vector<std::string>& argv) {
    auto a = argv;
    a[0] = "scontrol-that-is-not-installed";
    return run_command(a, std::chrono::seconds(5));
  };
  try {
    expand_hostlist("n[1-3]", run);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "scontrol-that-is-not-installed: not found on PATH");
  }
}

TEST(SlurmLaunch, RunCommandReturnsStatusAndBothStreamsAndBoundsTime) {
  const auto r = run_command({"sh", "-c", "echo out; echo err >&2; exit 3"}, std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(run_command({"sh", "-c", "kill -TERM $$"}, std::chrono::seconds(10)).exit_code, 128 + 15);
  EXPECT_THROW(run_command({"sleep", "30"}, std::chrono::milliseconds(200)), TimeoutError);
}

TEST(SlurmLaunch, ReadsTheAllocation) {
  const auto j = read_slurm_job(allocation());
  EXPECT_EQ(j.job_id, "42");
  EXPECT_EQ(j.nodelist, "n[1-3]");
  EXPECT_EQ(j.num_nodes, 3);
  EXPECT_EQ(j.submit_dir, "/home/u/run");
  auto old = allocation();
  old.erase("SLURM_JOB_NUM_NODES");
  old["SLURM_NNODES"] = "2";  // what Slurm before 20.02 sets
  EXPECT_EQ(read_slurm_job(old).num_nodes, 2);
}

TEST(SlurmLaunch, MissingOrMalformedAllocationVariablesAreNamed) {
  for (const char* name : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST"}) {
    auto env = allocation();
    env.erase(name);
    EXPECT_EQ(launch_error([&] { read_slurm_job(env); }),
              std::string(name) + " is not set: run dltrain slurm inside a Slurm allocation (sbatch or salloc)");
  }
  auto env = allocation();
  env.erase("SLURM_JOB_NUM_NODES");
  EXPECT_EQ(launch_error([&] { read_slurm_job(env); }),
            "SLURM_NNODES is not set: run dltrain slurm inside a Slurm allocation (sbatch or salloc)");
  env["SLURM_JOB_NUM_NODES"] = "three";
  EXPECT_EQ(launch_error([&] { read_slurm_job(env); }), "SLURM_JOB_NUM_NODES: expected a positive integer, got \"three\"");
  env["SLURM_JOB_NUM_NODES"] = "0";
  EXPECT_EQ(launch_error([&] { read_slurm_job(env); }), "SLURM_JOB_NUM_NODES: expected a positive integer, got \"0\"");
}

TEST(SlurmLaunch, ReadsEachNodesGrantGpusFromSlurmFirst) {
  auto env = step_task();
  auto g = read_node_grant(env);
  EXPECT_EQ(g.node, "n2");
  EXPECT_EQ(g.node_id, 1);
  EXPECT_EQ(g.cpus, 8);
  EXPECT_TRUE(g.gpus.empty());
  EXPECT_EQ(g.memory_mb, 0);
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  env["SLURM_JOB_GPUS"] = "2,3";
  env["SLURM_MEM_PER_NODE"] = "64000";
  g = read_node_grant(env);
  EXPECT_EQ(g.gpus, (std::vector<int>{2, 3}));  // the job's GRES, not the process's view
  EXPECT_EQ(g.memory_mb, 64000);
  env["SLURM_STEP_GPUS"] = "3";
  EXPECT_EQ(read_node_grant(env).gpus, (std::vector<int>{3}));
  // Slurm's value for a step that was granted no GPU on a GRES node.
  env.erase("SLURM_STEP_GPUS");
  env.erase("SLURM_JOB_GPUS");
  env["CUDA_VISIBLE_DEVICES"] = "NoDevFiles";
  EXPECT_TRUE(read_node_grant(env).gpus.empty());
}

TEST(SlurmLaunch, MissingOrMalformedStepVariablesAreNamed) {
  for (const char* name : {"SLURMD_NODENAME", "SLURM_NODEID", "SLURM_CPUS_ON_NODE"}) {
    auto env = step_task();
    env.erase(name);
    EXPECT_EQ(launch_error([&] { read_node_grant(env); }),
              std::string(name) + " is not set: dltrain slurm agent runs as a task of the launcher's srun step");
  }
  auto env = step_task();
  env["SLURM_JOB_GPUS"] = "0,gpu1";
  EXPECT_EQ(launch_error([&] { read_node_grant(env); }),
            "SLURM_JOB_GPUS: expected GPU indices separated by commas (\"0,1\"), got \"0,gpu1\"");
  env.erase("SLURM_JOB_GPUS");
  env["SLURM_CPUS_ON_NODE"] = "-2";
  EXPECT_EQ(launch_error([&] { read_node_grant(env); }), "SLURM_CPUS_ON_NODE: expected a positive integer, got \"-2\"");
}

TEST(SlurmLaunch, ParsesScontrolShowNodeLines) {
  // Two lines as `scontrol show node -o` of Slurm 22.05 prints them (shortened).
  const std::string out =
      "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUTot=2 NodeAddr=10.201.0.2 NodeHostName=n1 "
      "State=ALLOCATED ThreadsPerCore=1\n"
      "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUTot=2 NodeAddr=10.201.0.3 NodeHostName=n2 "
      "State=MIXED+DRAIN ThreadsPerCore=1\n";
  const auto states = scontrol_node_field(out, "State");
  EXPECT_EQ(states.at("n1"), "ALLOCATED");
  EXPECT_EQ(states.at("n2"), "MIXED+DRAIN");
  const CommandRunner run = [&](const std::vector<std::string>& argv) {
    EXPECT_EQ(argv, (std::vector<std::string>{"scontrol", "show", "node", "-o", "n[1-2]"}));
    return CommandResult{0, out, ""};
  };
  EXPECT_EQ(node_addresses({"n1", "n2"}, "n[1-2]", run),
            (std::map<std::string, std::string>{{"n1", "10.201.0.2"}, {"n2", "10.201.0.3"}}));
  EXPECT_EQ(launch_error([&] { node_addresses({"n1", "n3"}, "n[1-2]", run); }),
            "scontrol show node -o n[1-2] does not list node n3");
}

TEST(SlurmLaunch, ThePlanTravelsThroughTheEnvironment) {
  auto p = plan_of_three();
  p.leader_state_dir = "/shared/dltrain";
  p.drain_poll = std::chrono::seconds(5);
  const auto back = LaunchPlan::from_environment(p.to_environment());
  EXPECT_EQ(back.job_id, "42");
  EXPECT_EQ(back.leader_node, "n1");
  EXPECT_EQ(back.port, 7171);
  EXPECT_EQ(back.addresses, p.addresses);
  EXPECT_EQ(back.agent_token, p.agent_token);
  EXPECT_EQ(back.client_token, p.client_token);
  EXPECT_EQ(back.state_root, "/scratch");
  EXPECT_EQ(back.leader_state_dir, "/shared/dltrain");
  EXPECT_EQ(back.drain_poll, std::chrono::seconds(5));
  EXPECT_EQ(back.leader_url(), "ws://10.0.0.1:7171");
  auto env = p.to_environment();
  env["DLTRAIN_SLURM_PORT"] = "70000";
  EXPECT_EQ(launch_error([&] { LaunchPlan::from_environment(env); }),
            "DLTRAIN_SLURM_PORT: expected a port in [1, 65535], got \"70000\"");
  env = p.to_environment();
  env["DLTRAIN_SLURM_ADDRESSES"] = "n1=10.0.0.1,n2";
  EXPECT_EQ(launch_error([&] { LaunchPlan::from_environment(env); }),
            "DLTRAIN_SLURM_ADDRESSES: expected NODE=ADDRESS items separated by commas, got \"n2\"");
  p.addresses["n1"] = "fd00::1";
  EXPECT_EQ(p.leader_url(), "ws://[fd00::1]:7171");
}

TEST(SlurmLaunch, EachNodesAgentOffersWhatSlurmGrantedAndTheFirstLeads) {
  const dltrain::testing::TempDir tmp("dltrain-slurm-cfg");  // removed however the test ends
  const auto& dir = tmp.path;
  const auto p = plan_of_three();
  write_private_file((dir / "agent.token").string(), p.agent_token + "\n");  // 0600, as the launcher writes them
  write_private_file((dir / "client.token").string(), p.client_token + "\n");

  NodeGrant first{"n1", 0, 4, {}, 0};
  const auto leader = config::parse_agent_options(agent_config_toml(p, first, dir.string()), dir.string());
  EXPECT_EQ(leader.name, "n1");
  EXPECT_TRUE(leader.leader);
  EXPECT_TRUE(leader.host_tasks);
  EXPECT_EQ(leader.listen_address, "10.0.0.1");
  EXPECT_EQ(leader.listen_port, 7171);
  EXPECT_EQ(leader.advertise_address, "10.0.0.1");
  EXPECT_EQ(leader.task_bind_address, "10.0.0.1");
  EXPECT_EQ(leader.cores, 4);
  ASSERT_TRUE(leader.gpus.has_value());
  EXPECT_TRUE(leader.gpus->empty());  // "none": not every GPU NVML finds
  EXPECT_EQ(leader.agent_token, p.agent_token);
  EXPECT_EQ(leader.client_token, p.client_token);
  EXPECT_EQ(leader.state_dir, dir.string());
  EXPECT_EQ(leader.metrics_address, "127.0.0.1");
  EXPECT_EQ(leader.metrics_port, 0);
  EXPECT_EQ(leader.task_stop_grace, std::chrono::seconds(10));

  NodeGrant third{"n3", 2, 16, {1, 3}, 32000};
  const auto agent = config::parse_agent_options(agent_config_toml(p, third, dir.string()), dir.string());
  EXPECT_FALSE(agent.leader);
  EXPECT_EQ(agent.leader_url, "ws://10.0.0.1:7171");
  EXPECT_EQ(agent.advertise_address, "10.0.0.3");
  EXPECT_EQ(agent.cores, 16);
  EXPECT_EQ(agent.memory_mb, 32000);
  EXPECT_EQ(agent.gpus, (std::optional<std::vector<int>>{std::vector<int>{1, 3}}));
  EXPECT_TRUE(agent.client_token.empty());

  auto kept = p;
  kept.leader_state_dir = "/shared/leader";
  EXPECT_EQ(config::parse_agent_options(agent_config_toml(kept, first, dir.string()), dir.string()).state_dir,
            "/shared/leader");
  EXPECT_EQ(config::parse_agent_options(agent_config_toml(kept, third, dir.string()), dir.string()).state_dir, dir.string());

  NodeGrant stranger{"n9", 3, 1, {}, 0};
  EXPECT_EQ(launch_error([&] { agent_config_toml(p, stranger, dir.string()); }),
            "node n9 is not among the launcher's nodes (DLTRAIN_SLURM_ADDRESSES)");
}

TEST(SlurmLaunch, AJobThatFitsTheAllocationPasses) {
  const std::vector<AgentOffer> three{{"n1", 2, 0}, {"n2", 2, 0}, {"n3", 2, 0}};
  // (2 workers + 1 PS shard) × 2 threads = 6 cores: exactly the allocation.
  EXPECT_NO_THROW(check_job_fits(job("workers = 2\nps_shards = 1\nthreads_per_task = 2\n"), three, "job.toml"));
  EXPECT_NO_THROW(check_job_fits(job("workers = \"auto\"\nps_shards = 1\n"), three, "job.toml"));
}

TEST(SlurmLaunch, AJobNeedingMoreCoresThanGrantedSaysWhatToAskFor) {
  const std::vector<AgentOffer> three{{"n1", 2, 0}, {"n2", 2, 0}, {"n3", 2, 0}};
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("workers = 4\nps_shards = 2\nthreads_per_task = 2\n"), three, "big.toml");
            }),
            "big.toml: the job needs 12 cores ((4 workers + 2 PS shards) × 2 threads), but the allocation's 3 agents "
            "offer 6 cores in all (n1 2, n2 2, n3 2): ask Slurm for more (sbatch -N, --cpus-per-task or --exclusive) "
            "or lower workers, ps_shards or threads_per_task");
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("workers = 1\nps_shards = 1\nthreads_per_task = 3\n"), three, "wide.toml");
            }),
            "wide.toml: each task needs threads_per_task = 3 cores on one node, but no node has more than 2 (n1 2, n2 "
            "2, n3 2): ask Slurm for more cores per node (--cpus-per-task, --exclusive) or lower threads_per_task");
  const std::vector<AgentOffer> one{{"n1", 1, 0}};
  EXPECT_EQ(launch_error([&] { check_job_fits(job("workers = \"auto\"\nps_shards = 1\n"), one, "auto.toml"); }),
            "auto.toml: the job needs 2 cores ((at least 1 worker + 1 PS shard) × 1 thread), but the allocation's 1 "
            "agent offers 1 core in all (n1 1): ask Slurm for more (sbatch -N, --cpus-per-task or --exclusive) or "
            "lower workers, ps_shards or threads_per_task");
}

TEST(SlurmLaunch, ACudaJobNeedsTheGpusSlurmGranted) {
  const std::vector<AgentOffer> gpus{{"g1", 8, 2}, {"g2", 8, 2}};
  EXPECT_NO_THROW(
      check_job_fits(job("device = \"cuda\"\nworkers = 4\nps_shards = 1\ngpus_per_worker = 1\n"), gpus, "gpu.toml"));
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("device = \"cuda\"\nworkers = 5\nps_shards = 1\ngpus_per_worker = 1\n"), gpus,
                             "gpu.toml");
            }),
            "gpu.toml: the job needs 5 GPUs (5 workers × 1 per worker), but the allocation's agents offer 4 GPUs "
            "(g1 8 + 2 GPUs, g2 8 + 2 GPUs): ask Slurm for GPUs (sbatch --gres=gpu:N or --gpus-per-node) or lower "
            "workers");
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("device = \"cuda\"\nworkers = 1\nps_shards = 1\ngpus_per_worker = 4\n"), gpus,
                             "gpu.toml");
            }),
            "gpu.toml: each worker needs gpus_per_worker = 4 GPUs on one node, but no node has more than 2 (g1 8 + 2 "
            "GPUs, g2 8 + 2 GPUs)");
}

TEST(SlurmLaunch, TasksMustFitWholeOnNodesNotJustInTheTotal) {
  // 8 cores needed of 9 granted, but a node of 3 cores holds one task of 2 threads: 3 slots
  // for 4 tasks (the leader's placement rule, leader/placement.cpp).
  const std::vector<AgentOffer> three{{"n1", 3, 0}, {"n2", 3, 0}, {"n3", 3, 0}};
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("workers = 3\nps_shards = 1\nthreads_per_task = 2\n"), three, "slots.toml");
            }),
            "slots.toml: the job's 4 tasks (3 workers + 1 PS shard) take threads_per_task = 2 cores each on one node, "
            "but the nodes hold only 3 such tasks (n1 1, n2 1, n3 1): ask Slurm for more cores per node "
            "(--cpus-per-task, --exclusive) or more nodes, or lower workers, ps_shards or threads_per_task");
  EXPECT_NO_THROW(check_job_fits(job("workers = 2\nps_shards = 1\nthreads_per_task = 2\n"), three, "slots.toml"));
  // GPUs likewise: 3 GPUs on each of two nodes hold two workers of 2 GPUs, not three.
  const std::vector<AgentOffer> gpus{{"g1", 8, 3}, {"g2", 8, 3}};
  EXPECT_EQ(launch_error([&] {
              check_job_fits(job("device = \"cuda\"\nworkers = 3\nps_shards = 1\ngpus_per_worker = 2\n"), gpus,
                             "gpu.toml");
            }),
            "gpu.toml: the job's 3 workers take gpus_per_worker = 2 GPUs each on one node, but the nodes hold only 2 "
            "such workers (g1 8 + 3 GPUs, g2 8 + 3 GPUs): ask Slurm for more GPUs per node or lower workers or "
            "gpus_per_worker");
}

TEST(SlurmLaunch, GrantedGpusMapToNvmlIndicesConstrainedOrNot) {
  // A device-constrained step sees only its 2 GPUs, numbered from 0.
  EXPECT_EQ(nvml_indices_of_grant({4, 5}, 2), (std::vector<int>{0, 1}));
  // An unconstrained step sees the node's 8, numbered as Slurm numbers them.
  EXPECT_EQ(nvml_indices_of_grant({4, 5}, 8), (std::vector<int>{4, 5}));
  EXPECT_EQ(nvml_indices_of_grant({}, 8), (std::vector<int>{}));
  EXPECT_EQ(launch_error([] { nvml_indices_of_grant({4, 5}, 3); }),
            "Slurm granted GPUs 4,5 but NVML sees 3 GPUs on this node: neither a device-constrained step (as many "
            "GPUs as granted) nor the whole node (GPU 5 among them); check gres.conf and `nvidia-smi` inside a step");
}

TEST(SlurmLaunch, NodeAddressesAreIpAddressesHostNamesResolved) {
  EXPECT_EQ(numeric_address("n1", "10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(numeric_address("n1", "fd00::7"), "fd00::7");
  EXPECT_EQ(numeric_address("n1", "localhost"), "127.0.0.1");  // /etc/hosts, no DNS
  const auto msg = launch_error([] { numeric_address("n4", "no-such-node.invalid"); });
  EXPECT_EQ(msg.rfind("node n4: its address \"no-such-node.invalid\" (NodeAddr, else NodeHostName) does not resolve: ", 0),
            0u) << msg;
  // scontrol's recorded answer for a cluster that leaves NodeAddr unset: the node's name.
  const CommandRunner recorded = [](const std::vector<std::string>&) {
    return CommandResult{0, "NodeName=n1 Arch=x86_64 NodeAddr=localhost NodeHostName=localhost State=IDLE\n", ""};
  };
  EXPECT_EQ(node_addresses({"n1"}, "n1", recorded), (std::map<std::string, std::string>{{"n1", "127.0.0.1"}}));
}

TEST(SlurmLaunch, TheLeaderPortFollowsTheJobId) {
  EXPECT_EQ(port_for_job("42"), 20042);
  EXPECT_EQ(port_for_job("40042"), 20042);
  EXPECT_EQ(port_for_job("123456"), 20000 + 123456 % 40000);
  EXPECT_EQ(port_for_job("x"), 7070);
}
