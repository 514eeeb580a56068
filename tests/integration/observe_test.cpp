// Watching a standalone cluster (a leader and three agents on loopback). Prometheus
// metrics: every agent role's exposition passes `promtool check metrics` and counts what
// a short job really did, and a real Prometheus server (Debian's `prometheus`) scraping
// the cluster every second answers queries for a job's images/s and test accuracy. Task
// logs: `dltrain logs` prints a task's real log, `--tail` its end, `--follow` streams it.
// Step timelines: `dltrain trace` writes each worker's last steps as Chrome trace events.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/standalone_suite.h"
#include "support/process.h"
#include "support/prometheus.h"
#include "support/wait.h"
#include "support/jobs.h"
#include "support/names.h"

namespace {

class Observe : public dltrain::testing::StandaloneSuite<Observe> {
 public:
  static constexpr const char* kRootPrefix = "dltrain-metrics";
  static constexpr int kAgents = 3;
  static std::vector<std::string> agent_args() { return {"--progress-interval", "1"}; }

 protected:
  // The leader's metrics endpoint (client.json) and every agent's (`dltrain agents`).
  static std::string leader_endpoint() {
    std::ifstream in(root_ / "state" / "client.json");
    return json::parse(in).value("metrics_endpoint", "");
  }
  static std::vector<std::string> agent_endpoints() {
    auto r = run(client_ + " agents --json", 30);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<std::string> out;
    for (const auto& a : json::parse(r.out).value("agents", nlohmann::json::array())) {
      if (a["metrics_endpoint"].is_string()) out.push_back(a["metrics_endpoint"]);
    }
    return out;
  }
};

// `promtool check metrics` on `text`: its exit code and what it said.
dltrain::testing::Result promtool_check(const fs::path& dir, const std::string& name, const std::string& text) {
  const auto file = dir / (name + ".prom");
  std::ofstream(file) << text;
  return run("promtool check metrics < " + file.string() + " 2>&1", 30);
}

}  // namespace

TEST_F(Observe, EveryRolesExpositionPassesPromtoolAndCountsWhatTheJobDid) {
  ASSERT_EQ(run("promtool --version >/dev/null 2>&1").code, 0) << "promtool missing: scripts/setup installs prometheus";
  const auto path = write_job("metrics-small", kSmallDgc);
  const auto id = dltrain::testing::submit_job(client_, path);
  ASSERT_FALSE(id.empty());
  auto f = dltrain::testing::follow_to_end(client_, id);
  ASSERT_EQ(f.code, 0) << f.out;
  const auto summary = json::parse(dltrain::testing::last_line(f.out));
  ASSERT_EQ(summary["state"], "succeeded") << summary.dump();
  const std::string job = summary["job"];

  // Ended tasks keep their final values on their agent's endpoint (10 minutes).
  std::vector<dltrain::testing::Sample> all;
  int with_worker = 0, with_ps = 0;
  const auto agents = agent_endpoints();
  ASSERT_EQ(agents.size(), 3u);
  for (const auto& ep : agents) {
    const auto r = http_get(ep, "/metrics");
    ASSERT_EQ(r.status, 200) << ep;
    const auto check = promtool_check(root_, "agent-" + ep.substr(ep.rfind(':') + 1), r.body);
    EXPECT_EQ(check.code, 0) << ep << ": " << check.out;
    auto s = parse_exposition(r.body);
    with_worker += sum_samples(s, "dltrain_worker_steps_total", {{"job", job}}) > 0 ? 1 : 0;
    with_ps += sum_samples(s, "dltrain_ps_pushes_total", {{"job", job}}) > 0 ? 1 : 0;
    all.insert(all.end(), s.begin(), s.end());
  }
  EXPECT_EQ(with_worker, 2);
  EXPECT_EQ(with_ps, 1);
  const auto leader = http_get(leader_endpoint(), "/metrics");
  ASSERT_EQ(leader.status, 200);
  const auto check = promtool_check(root_, "leader", leader.body);
  EXPECT_EQ(check.code, 0) << check.out;

  const std::map<std::string, std::string> of_job{{"job", job}};
  // Images: every image of both shards, every epoch (no step was skipped).
  EXPECT_EQ(sum_samples(all, "dltrain_worker_skipped_steps_total", of_job), 0);
  EXPECT_EQ(sum_samples(all, "dltrain_worker_images_total", of_job), 2 * 3000);
  // Steps: 2 workers x 2 epochs x ceil(1500 / 32).
  EXPECT_EQ(sum_samples(all, "dltrain_worker_steps_total", of_job), 2 * 2 * 47);
  // Bytes: the workers' counts are the summary's, and the PS shard's the same bytes seen
  // from the other end of the sockets.
  const double pushed = summary["bytes_pushed"], pulled = summary["bytes_pulled"];
  EXPECT_EQ(sum_samples(all, "dltrain_worker_push_bytes_total", of_job), pushed);
  EXPECT_EQ(sum_samples(all, "dltrain_worker_pull_bytes_total", of_job), pulled);
  EXPECT_EQ(sum_samples(all, "dltrain_ps_receive_bytes_total", of_job), pushed);
  EXPECT_EQ(sum_samples(all, "dltrain_ps_transmit_bytes_total", of_job), pulled);
  // DGC spends time selecting; every phase was measured.
  for (const char* phase : {"data", "compute", "compress", "exchange"}) {
    EXPECT_GT(sum_samples(all, "dltrain_worker_step_phase_seconds_total", {{"job", job}, {"phase", phase}}), 0)
        << phase;
  }
  EXPECT_EQ(sum_samples(all, "dltrain_task_running", of_job), 0);  // all ended

  const auto ls = parse_exposition(leader.body);
  EXPECT_DOUBLE_EQ(sum_samples(ls, "dltrain_job_test_accuracy", of_job), summary["test_accuracy"].get<double>());
  EXPECT_EQ(sum_samples(ls, "dltrain_job_epochs_done", of_job), 2);
  EXPECT_EQ(sum_samples(ls, "dltrain_job_push_bytes_total", of_job), pushed);
  EXPECT_GE(sum_samples(ls, "dltrain_leader_jobs", {{"state", "succeeded"}}), 1);
  EXPECT_EQ(sum_samples(ls, "dltrain_leader_agents", {{"state", "ready"}}), 3);
  EXPECT_GT(sum_samples(ls, "dltrain_leader_control_requests_total", {{"peer", "client"}}), 0);
}

namespace {

// A TCP port free on 127.0.0.1 now (bound to port 0, read back, released), for a server
// that cannot be told to bind port 0 and report it, as Prometheus's web listener.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// The value of an instant query's first series, or NaN when there is none yet.
double prom_query(const std::string& server, const std::string& promql) {
  const auto r = http_get(server, "/api/v1/query?query=" + url_encode(promql));
  if (r.status != 200) return std::nan("");
  const auto j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || j.value("status", "") != "success" || j["data"]["result"].empty()) return std::nan("");
  return std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
}

}  // namespace

TEST_F(Observe, APrometheusServerScrapingTheClusterAnswersForImagesPerSecondAndAccuracy) {
  ASSERT_EQ(run("prometheus --version >/dev/null 2>&1").code, 0) << "prometheus missing: scripts/setup installs it";
  const fs::path dir = root_ / "prometheus";
  fs::create_directories(dir);
  std::string targets = "'" + leader_endpoint() + "'";
  for (const auto& ep : agent_endpoints()) targets += ", '" + ep + "'";
  // honor_labels: the samples' own `job` label (the dltrain job) wins over the scrape
  // job's name (docs/operations.md, "Metrics").
  std::ofstream(dir / "prometheus.yml") << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                                        << "scrape_configs:\n  - job_name: dltrain\n    honor_labels: true\n"
                                        << "    static_configs:\n      - targets: [" << targets << "]\n";
  const int port = free_loopback_port();
  ASSERT_NE(port, 0);
  const std::string server = "127.0.0.1:" + std::to_string(port);
  dltrain::testing::Background prom("prometheus --config.file=" + (dir / "prometheus.yml").string() +
                                        " --storage.tsdb.path=" + (dir / "data").string() +
                                        " --web.listen-address=" + server + " --log.level=warn",
                                    (dir / "prometheus.log").string());
  ASSERT_TRUE(wait_until([&] { return http_get(server, "/-/ready").status == 200; }, std::chrono::seconds(60),
                         std::chrono::milliseconds(200)))
      << "Prometheus did not become ready; see " << (dir / "prometheus.log");

  // Six epochs, not two: Prometheus must scrape a worker's images/s while the job runs.
  std::string longer = kCnn8000;
  longer.replace(longer.find("epochs = 2"), 10, "epochs = 6");
  const auto path = write_job("metrics-scraped", longer);
  const std::string job = dltrain::testing::submit_job(client_, path);
  ASSERT_FALSE(job.empty());
  const std::string ips_query = "sum(dltrain_worker_images_per_second{job=\"" + job + "\"})";
  double ips = std::nan("");
  std::string state_then;
  wait_until(
      [&] {
        ips = prom_query(server, ips_query);
        if (!(ips > 0)) return false;
        state_then = dltrain::testing::job_status(client_, job).value("state", "");
        return true;
      },
      std::chrono::seconds(180), std::chrono::milliseconds(500));
  EXPECT_GT(ips, 0) << ips_query;
  EXPECT_EQ(state_then, "running") << "images/s was only answered once the job had ended";

  // The test accuracy: after the job, Prometheus's latest sample is the final figure of
  // `dltrain status` (the leader's metric is scraped again within a second or two).
  const auto final_status = dltrain::testing::wait_job_end(client_, job);
  ASSERT_EQ(final_status.value("state", ""), "succeeded") << final_status.dump();
  const double acc = final_status["test_accuracy"];
  const std::string acc_query = "dltrain_job_test_accuracy{job=\"" + job + "\"}";
  double got = std::nan("");
  wait_until(
      [&] {
        got = prom_query(server, acc_query);
        return got == acc;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(500));
  EXPECT_DOUBLE_EQ(got, acc) << acc_query;
  // The images counter agrees that the job trained on its images (6 epochs of 8,000). The agents keep an
  // ended worker's final values, but the last scrape before the job ended may predate the
  // worker's final figures (under load, 15,296 of 16,000 once, for two epochs): wait for the next scrapes.
  const std::string images_query = "sum(max_over_time(dltrain_worker_images_total{job=\"" + job + "\"}[10m]))";
  double images = std::nan("");
  wait_until(
      [&] {
        images = prom_query(server, images_query);
        return images == 6 * 8000;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(500));
  EXPECT_EQ(images, 6 * 8000) << "images counted by Prometheus";
  ::kill(prom.pid(), SIGTERM);
  EXPECT_EQ(prom.wait(30), 0) << "Prometheus did not stop cleanly";
}

namespace {

// The last `n` non-empty lines of a file, read here independently of the agent.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::vector<std::string> file_tail(const fs::path& p, std::size_t n) {
  auto lines = split_lines(dltrain::testing::slurp(p));
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines;
}

}  // namespace

TEST_F(Observe, LogsPrintATasksRealLogAndFollowStreamsItUntilTheTaskEnds) {
  const auto path = write_job("logs-cnn", kCnn8000);
  const std::string job = dltrain::testing::submit_job(client_, path);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(dltrain::testing::wait_all_tasks_running(client_, job, 3, 120)) << "the job's tasks did not start";
  dltrain::testing::Background follower(client_ + " logs " + job + " --task worker-0 --follow",
                                        (root_ / (job + "-worker-0.log")).string());
  // While the job trains, the follower has printed the worker's progress events as its
  // log has them.
  bool streamed = false;
  wait_until(
      [&] {
        const auto st = dltrain::testing::job_status(client_, job);
        if (st.value("state", "") != "running") return true;
        for (const auto& l : follower.lines()) streamed |= l.find("\"event\":\"progress\"") != std::string::npos;
        return streamed;
      },
      std::chrono::seconds(180), std::chrono::milliseconds(200));
  EXPECT_TRUE(streamed) << "no progress line reached the follower while the job ran";
  const auto st = dltrain::testing::wait_job_end(client_, job);
  ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
  // The task ended: the follower drains the log and exits by itself.
  EXPECT_EQ(follower.wait(30), 0) << "dltrain logs --follow did not end with its task";
  int epoch_ends = 0, done = 0;
  for (const auto& l : follower.lines()) {
    epoch_ends += l.find("\"event\":\"epoch_end\"") != std::string::npos ? 1 : 0;
    done += l.find("\"event\":\"done\"") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(epoch_ends, 2);
  EXPECT_EQ(done, 1);

  // --tail: the end of the PS shard's log, as the file on its agent has it.
  const std::string agent = dltrain::testing::task_of(st, "ps-0").value("agent", "");
  ASSERT_EQ(agent.rfind("local-", 0), 0u) << st.dump();
  const fs::path file =
      root_ / "state" / ("agent-" + agent.substr(6)) / "tasks" / job / "ps-0-g1" / "task.log";
  const auto expected = file_tail(file, 5);
  ASSERT_FALSE(expected.empty()) << file;
  const auto r = run(client_ + " logs " + job + " --task ps-0 --tail 5", 30);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(split_lines(r.out), expected);

  // Bad input names what is wrong; the leader carries on.
  const auto bad_task = run(client_ + " logs " + job + " --task worker-9 2>&1", 30);
  EXPECT_EQ(bad_task.code, 2) << bad_task.out;
  EXPECT_NE(bad_task.out.find("has no task \"worker-9\" (its tasks: ps-0, worker-0, worker-1)"), std::string::npos)
      << bad_task.out;
  const auto bad_job = run(client_ + " logs job-999 2>&1", 30);
  EXPECT_EQ(bad_job.code, 2) << bad_job.out;
  EXPECT_NE(bad_job.out.find("no job \"job-999\""), std::string::npos) << bad_job.out;
}

// `dltrain trace` on a short dense MLP job of its own (2 workers × 1,000 images, batch
// 50: 20 steps per epoch each, 2 epochs = 40 steps per worker; a few seconds).
TEST_F(Observe, TraceWritesEachWorkersLastStepsAsChromeTraceEvents) {
  const auto path = write_job("trace-mlp", R"(model = "mlp"
workers = 2
ps_shards = 1
batch_size = 50
epochs = 2
train_samples = 2000
test_samples = 500
)");
  const std::string job = dltrain::testing::submit_job(client_, path);
  ASSERT_FALSE(job.empty());
  const auto st = dltrain::testing::wait_job_end(client_, job);
  ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
  constexpr int kStepsRun = 40;

  // The phases of a worker's step, and per worker (pid) its steps' complete events.
  const std::vector<std::string> phases{"data", "forward", "backward", "compress", "push_pull", "apply"};
  struct Step {
    std::int64_t ts = 0, dur = 0, phase_sum = 0;
    int phases = 0;
  };
  auto parse = [&](const std::string& out) {
    std::map<std::string, std::map<std::int64_t, Step>> by_task;  // task → step number → step
    const json doc = json::parse(out);
    std::map<int, std::string> names;
    for (const auto& e : doc.at("traceEvents")) {
      if (e.at("ph") == "M" && e.at("name") == "process_name") names[e.at("pid")] = e.at("args").at("name");
    }
    for (const auto& e : doc.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      auto& s = by_task[names.at(e.at("pid"))][e.at("args").at("step").get<std::int64_t>()];
      if (e.at("name") == "step") {
        s.ts = e.at("ts");
        s.dur = e.at("dur");
      } else {
        EXPECT_NE(std::find(phases.begin(), phases.end(), e.at("name").get<std::string>()), phases.end()) << e;
        EXPECT_GE(e.at("dur").get<std::int64_t>(), 0) << e;
        s.phase_sum += e.at("dur").get<std::int64_t>();
        ++s.phases;
      }
    }
    return by_task;
  };

  // Every worker, the last 10 steps: steps 31..40 of each, each with its six phases,
  // which add up to the step; a step ends before the next begins.
  auto r = run(client_ + " trace " + job + " --steps 10 2>" + (root_ / "trace-stderr.log").string(), 30);
  ASSERT_EQ(r.code, 0) << r.out << dltrain::testing::slurp(root_ / "trace-stderr.log");
  auto tasks = parse(r.out);
  ASSERT_EQ(tasks.size(), 2u) << r.out.substr(0, 2000);
  for (const auto& [task, steps] : tasks) {
    ASSERT_EQ(steps.size(), 10u) << task;
    EXPECT_EQ(steps.begin()->first, kStepsRun - 9) << task;
    EXPECT_EQ(steps.rbegin()->first, kStepsRun) << task;
    for (auto it = steps.begin(); it != steps.end(); ++it) {
      const Step& s = it->second;
      EXPECT_EQ(s.phases, 6) << task << " step " << it->first;
      EXPECT_EQ(s.phase_sum, s.dur) << task << " step " << it->first;
      EXPECT_GT(s.dur, 0) << task << " step " << it->first;
      const auto next = std::next(it);
      if (next != steps.end()) {
        EXPECT_LE(s.phase_sum, next->second.ts - s.ts) << task << " step " << it->first;
      }
    }
  }

  // More steps asked for than ran: all 40 of one worker.
  r = run(client_ + " trace " + job + " --task worker-1 --steps 4096", 30);
  ASSERT_EQ(r.code, 0) << r.out;
  tasks = parse(r.out);
  ASSERT_EQ(tasks.size(), 1u);
  ASSERT_EQ(tasks.count("worker-1"), 1u);
  EXPECT_EQ(tasks["worker-1"].size(), static_cast<std::size_t>(kStepsRun));
  EXPECT_EQ(tasks["worker-1"].begin()->first, 1);

  // A PS shard keeps no timeline; unknown tasks and jobs are named.
  const auto ps = run(client_ + " trace " + job + " --task ps-0 2>&1", 30);
  EXPECT_EQ(ps.code, 2) << ps.out;
  EXPECT_NE(ps.out.find("ps-0 of " + job + " has no step timeline on agent local-"), std::string::npos) << ps.out;
  const auto bad_task = run(client_ + " trace " + job + " --task worker-9 2>&1", 30);
  EXPECT_EQ(bad_task.code, 2) << bad_task.out;
  EXPECT_NE(bad_task.out.find("has no task \"worker-9\""), std::string::npos) << bad_task.out;
  const auto bad_job = run(client_ + " trace job-999 2>&1", 30);
  EXPECT_EQ(bad_job.code, 2) << bad_job.out;
  EXPECT_NE(bad_job.out.find("no job \"job-999\""), std::string::npos) << bad_job.out;
  const auto bad_steps = run(client_ + " trace " + job + " --steps 0 2>&1", 30);
  EXPECT_EQ(bad_steps.code, 2) << bad_steps.out;
}
