// A standalone cluster as real processes on loopback: the leader, three agents, PS and
// worker tasks, driven through the real `dltrain` client: jobs that train, queue, are
// cancelled or refused, and where their secret goes. Faults: cluster_faults_test.cpp.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cluster_fixture.h"
#include "support/cluster.h"
#include "support/process.h"
#include "support/jobs.h"
#include "support/names.h"

const std::string kBin = dltrain::testing::kBinDir;
// The CNN for 20 epochs on every image: minutes, so it still runs when a test acts on it.
const std::string kLongCnn = "model = \"cnn\"\nepochs = 20\nworkers = 2\nps_shards = 1\n";

TEST_F(Cluster, TrainsAShortJobWhileASecondWaitsQueued) {
  // 3 agents × 1 core; job A needs all 3 (1 PS + 2 workers), so B must wait.
  auto a = write_job("short-cnn", kShortCnn + "epochs = 2\n" + kShortOptimizer);
  auto b = write_job("tiny-mlp", kOneWorkerMlp + "test_samples = 1000\n");
  const std::string job_a = submit(a);
  ASSERT_FALSE(job_a.empty());
  const std::string job_b = submit(b);
  ASSERT_FALSE(job_b.empty());
  auto sb = status(job_b);
  EXPECT_EQ(sb["state"], "queued");
  EXPECT_EQ(sb["queue_position"], 1);
  // Followed while it waits: a follower sees only what happens after it attaches, and
  // job B starts the moment job A's tasks give their cores back, which may be before a
  // client following A has its summary.
  auto follow_b = follow_in_background(job_b);

  auto fa = follow_to_end(job_a);
  ASSERT_EQ(fa.code, 0) << fa.out;
  auto summary = json::parse(last_line(fa.out));
  EXPECT_EQ(summary["event"], "summary");
  EXPECT_EQ(summary["state"], "succeeded");
  // Well above chance (0.1), as the other short jobs here: two asynchronous epochs on
  // 8,000 images depend on how the workers' pushes interleave (one run ended at 0.685).
  EXPECT_GE(summary["test_accuracy"].get<double>(), 0.60) << summary.dump();
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_GT(summary["bytes_pushed"].get<double>(), 0);
  EXPECT_GT(summary["bytes_pulled"].get<double>(), 0);
  EXPECT_GT(summary["wall_seconds"].get<double>(), 0);
  // Per-epoch progress reached the client.
  EXPECT_NE(fa.out.find("\"event\":\"epoch_end\""), std::string::npos);

  ASSERT_EQ(follow_b.wait(300), 0) << "dltrain follow " << job_b << " did not end with the job";
  std::string b_out;
  for (const auto& line : follow_b.lines()) b_out += line + "\n";
  auto sum_b = json::parse(last_line(b_out));
  EXPECT_EQ(sum_b["state"], "succeeded");
  EXPECT_GE(sum_b["test_accuracy"].get<double>(), 0.5) << sum_b.dump();
  // Job b (one worker) was followed from before its start: its worker said which malloc and BLAS
  // LibTorch runs on, and the shipped build's are tcmalloc and an optimised BLAS
  // (docs/training.md, "CPU speed: malloc and BLAS").
  int started = 0;
  std::istringstream lines(b_out);
  for (std::string line; std::getline(lines, line);) {
    const auto e = json::parse(line, nullptr, false);
    if (!e.is_object() || e.value("event", "") != "started") continue;
    ++started;
    EXPECT_EQ(e.value("allocator", "").rfind("tcmalloc", 0), 0u) << e.dump();
    EXPECT_NE(e.value("blas", "reference BLAS"), "reference BLAS") << e.dump();
  }
  EXPECT_EQ(started, 1) << b_out;
}

TEST_F(Cluster, DgcJobTrainsAndCompressesBothDirections) {
  auto d = write_job("short-dgc", kShortCnn + "epochs = 3\n" + kShortOptimizer + kDgcCompression);
  const auto job = submit(d);
  ASSERT_FALSE(job.empty());
  auto r = follow_to_end(job);
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = json::parse(last_line(r.out));
  EXPECT_EQ(s["state"], "succeeded");
  EXPECT_EQ(s["compression"], "dgc");
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.50) << s.dump();  // chance is 0.10
  // Measured at the sockets, headers and indices included, after the warm-up epoch.
  EXPECT_GT(s["compression_ratio_after_warmup"].get<double>(), 50.0) << s.dump();
  EXPECT_GT(s["compression_ratio_up_after_warmup"].get<double>(), 100.0) << s.dump();
  EXPECT_GT(s["compression_ratio_down_after_warmup"].get<double>(), 20.0) << s.dump();
}

TEST_F(Cluster, CancelledJobLeavesNoChildProcess) {
  const std::string job = submit_running("to-cancel", kLongCnn);
  ASSERT_FALSE(job.empty());
  // Wait until every task reported it runs, and its process is there.
  ASSERT_TRUE(wait_all_tasks_running(job, 3, 60)) << status(job).dump();
  EXPECT_EQ(task_pids(job).size(), 3u);  // 1 PS shard + 2 workers
  auto cancel = run(client_ + " cancel " + job, 30);
  EXPECT_EQ(cancel.code, 0) << cancel.out;
  EXPECT_EQ(wait_state(job, {"cancelled", "failed", "succeeded"}, 60), "cancelled");
  // Every PS and worker process of the job is gone (cwd or command line in its task dir).
  EXPECT_TRUE(task_pids(job).empty()) << task_pids(job).size() << " task processes outlived the cancel";
  // A follower of a finished job gets its summary and the client's exit code says cancelled.
  auto f = run(client_ + " follow " + job + " --json", 30);
  EXPECT_EQ(f.code, 1);
  EXPECT_EQ(json::parse(last_line(f.out))["state"], "cancelled");
}

TEST_F(Cluster, TheJobSecretReachesItsTasksOnlyAsPrivateFiles) {
  const std::string job = submit("secret", kLongCnn);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_all_tasks_running(job, 3, 90)) << status(job).dump();

  // Every task directory of the job holds the same secret, in a file of mode 0600.
  std::vector<fs::path> dirs;
  for (int i = 0; i < 3; ++i) {
    const auto jd = state_ / ("agent-" + std::to_string(i)) / "tasks" / job;
    if (!fs::exists(jd)) continue;
    for (const auto& e : fs::directory_iterator(jd)) dirs.push_back(e.path());
  }
  ASSERT_EQ(dirs.size(), 3u);
  std::set<std::string> secrets;
  for (const auto& d : dirs) {
    struct stat st {};
    ASSERT_EQ(::stat((d / "job.secret").c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << d;
    std::ifstream in(d / "job.secret");
    std::string line;
    std::getline(in, line);
    secrets.insert(line);
  }
  ASSERT_EQ(secrets.size(), 1u);
  const std::string secret = *secrets.begin();
  EXPECT_EQ(secret.size(), 64u);
  // Not on any task's command line (readable by every local user), only the file's path.
  const auto pids = task_pids(job);
  EXPECT_EQ(pids.size(), 3u);
  for (int pid : pids) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(cmd.find(secret), std::string::npos) << "pid " << pid;
    EXPECT_NE(cmd.find("--secret-file"), std::string::npos) << "pid " << pid;
  }
  // Not in what clients see.
  EXPECT_EQ(status(job).dump().find(secret), std::string::npos);
  auto list = run(client_ + " list --json", 30);
  EXPECT_EQ(list.out.find(secret), std::string::npos);

  ASSERT_EQ(run(client_ + " cancel " + job, 30).code, 0);
  EXPECT_EQ(wait_state(job, {"cancelled", "failed", "succeeded"}, 60), "cancelled");
  // The files go with the tasks; no log holds the secret.
  using dltrain::testing::slurp;
  for (const auto& d : dirs) {
    EXPECT_FALSE(fs::exists(d / "job.secret")) << d;
    EXPECT_EQ(slurp(d / "task.log").find(secret), std::string::npos) << d;
  }
  EXPECT_EQ(slurp(root_ / "standalone.log").find(secret), std::string::npos);
  // (RocksDB's write-ahead log files under db/ are also *.log: the store keeps a live job's
  // secret by design.)
  for (const auto& e : fs::recursive_directory_iterator(state_)) {
    if (e.is_regular_file() && e.path().extension() == ".log" && e.path().parent_path().filename() != "db") {
      EXPECT_EQ(slurp(e.path()).find(secret), std::string::npos) << e.path();
    }
  }
}

TEST_F(Cluster, AnUnreachableLeaderIsNamedWithItsOwnExitCode) {
  auto unreachable = run(kBin + "/dltrain --leader ws://127.0.0.1:1 --token x list 2>&1", 30);
  EXPECT_EQ(unreachable.code, 3) << unreachable.out;
  EXPECT_NE(unreachable.out.find("cannot reach the leader"), std::string::npos) << unreachable.out;
}

namespace {

// A job file the client refuses at submit: its body (below the data_dir line) and what
// the refusal must say (the field and the problem). The file written holds a name line
// and a data_dir line above the body.
struct Refusal {
  std::string name;
  std::string body;
  std::string says;
};

// Its name in GoogleTest's output (not its bytes).
void PrintTo(const Refusal& b, std::ostream* os) { *os << b.name; }

const std::vector<Refusal> kRefusals = {
    {"UnknownModel", "model = \"resnet\"\n",
     "model: expected one of cnn | mlp | mlp-large | resnet20 | resnet18 | torchscript, got \"resnet\""},
    {"UnknownKey", "model = \"cnn\"\nepochz = 3\n", "epochz: unknown key"},
    {"SyntaxError", "model = \"cnn\"\nepochs = \n", "TOML syntax error at line 4, column 10"},
    {"OutOfRange", "model = \"cnn\"\nbatch_size = -3\n", "batch_size: expected an integer in [1, 65536], got -3"},
    {"FieldOfAnotherMode", "model = \"cnn\"\nstaleness = 4\n",
     "staleness: applies only to sync = \"ssp\" (this job has sync = \"async\")"},
};

// The same three agents as Cluster, for the parametrised refusals.
class ClusterRefusals
    : public dltrain::testing::StandaloneSuite<ClusterRefusals, ::testing::TestWithParam<Refusal>> {
 public:
  static constexpr const char* kRootPrefix = "dltrain-refusals";
  static constexpr int kAgents = 3;
};

}  // namespace

// A bad job file is refused by `dltrain submit` (exit code 2) with the field and the
// problem; nothing of it is kept and the leader carries on with every agent.
TEST_P(ClusterRefusals, IsRefusedAtSubmitNamingTheFieldAndTheLeaderCarriesOn) {
  const Refusal& c = GetParam();
  auto bad = write_job("bad-" + c.name, c.body);
  auto r = run(client_ + " submit " + bad.string() + " 2>&1", 30);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
  auto list = run(client_ + " list --json", 30);
  ASSERT_EQ(list.code, 0) << list.out;
  EXPECT_EQ(json::parse(list.out)["jobs"].size(), 0u) << list.out;
  auto agents = run(client_ + " agents --json", 30);
  ASSERT_EQ(agents.code, 0);
  EXPECT_EQ(json::parse(agents.out)["agents"].size(), 3u);
  // --json carries the leader line the text form has.
  EXPECT_EQ(json::parse(agents.out)["leader"]["name"], json::parse(list.out)["leader"]["name"]) << agents.out;
  EXPECT_EQ(json::parse(list.out)["leader"]["ha"], false) << list.out;
}

INSTANTIATE_TEST_SUITE_P(JobFiles, ClusterRefusals, ::testing::ValuesIn(kRefusals),
                         [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

// BSP (sync = "sync"): worker 1 is SIGKILLed mid-training. Its connection closes, so the
// shard stops waiting for it at once (no worker is dropped by the barrier timeout, which
// is set to 20 s here); its agent restarts it, the replacement rejoins at the current
// step, and the job succeeds.

TEST_F(Cluster, AJobWhosePsShardOutgrowsEveryAgentIsRefusedAtSubmit) {
  // resnet18 for 10 classes and one input channel (Fashion-MNIST) has n = 11,181,642 −
  // 2·64·7·7 = 11,175,370 parameters; on one shard with sparse pulls
  // every worker adds its x_seen (4·n = 44,701,480 bytes) and its connection's two
  // buffers of one 262,144-float partition (2,097,152 bytes), on top of the parameters
  // and the pull scratch (4·n each; dgc keeps no momentum at the PS): planner/ps_memory.h.
  const double n = 11175370, per_worker = 4 * n + 2097152, fixed = 8 * n;
  auto agents = run(client_ + " agents --json", 30);
  ASSERT_EQ(agents.code, 0);
  std::int64_t largest_mb = 0;
  for (const auto& a : json::parse(agents.out).value("agents", nlohmann::json::array())) largest_mb = std::max<std::int64_t>(largest_mb, a.value("memory_mb", 0));
  const double limit = static_cast<double>(largest_mb) * 1024 * 1024;
  if (limit >= fixed + 1024 * per_worker) GTEST_SKIP() << "agents offer " << largest_mb << " MiB: 1,024 workers fit";
  auto big = write_job("outgrown", R"(model = "resnet18"
workers = 1024
ps_shards = 1

[compression]
method = "dgc"
ratio = 0.01
downlink_ratio = 0.01
)");
  auto r = run(client_ + " submit " + big.string() + " 2>&1", 30);
  EXPECT_EQ(r.code, 2) << r.out;
  const auto fit = static_cast<long long>((limit - fixed) / per_worker);
  EXPECT_NE(r.out.find("at most " + std::to_string(fit) + " workers fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ps_shards"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compression.downlink_ratio = 1"), std::string::npos) << r.out;
  // Nothing of it was kept.
  auto list = run(client_ + " list --json", 30);
  ASSERT_EQ(list.code, 0);
  EXPECT_EQ(list.out.find("outgrown"), std::string::npos) << list.out;
}
