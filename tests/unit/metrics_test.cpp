// The metrics endpoint (control/metrics_server.h), what an agent makes of its tasks'
// events (agent/task_metrics.h) and how it names a failed exit (agent/failure.h),
// without a cluster: exact expositions written by hand, the access rule, a restart as a
// counter reset, causes and log tails.
#include <algorithm>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include "agent/failure.h"
#include "leader/job_record.h"
#include "config/options.h"
#include "agent/task_logs.h"
#include "agent/task_metrics.h"
#include "common/errors.h"
#include "control/metrics_server.h"
#include "support/prometheus.h"
#include "wire/control_bodies.h"
#include "wire/task_events.h"

namespace {

using dltrain::control::MetricsBuilder;
using dltrain::testing::parse_exposition;
using dltrain::testing::sum_samples;
namespace events = dltrain::wire::events;

TEST(MetricsBuilder, WritesTheTextExpositionFormat) {
  MetricsBuilder b;
  b.counter("dltrain_x_bytes_total", "Bytes sent", {{"job", "job-1"}, {"task", "worker-0"}}, 1536);
  b.gauge("dltrain_y", "A ratio", {}, 0.25);
  b.counter("dltrain_x_bytes_total", "ignored: the family has its help", {{"job", "job-1"}, {"task", "worker-1"}}, 2);
  EXPECT_EQ(b.serialize(),
            "# HELP dltrain_x_bytes_total Bytes sent\n"
            "# TYPE dltrain_x_bytes_total counter\n"
            "dltrain_x_bytes_total{job=\"job-1\",task=\"worker-0\"} 1536\n"
            "dltrain_x_bytes_total{job=\"job-1\",task=\"worker-1\"} 2\n"
            "# HELP dltrain_y A ratio\n"
            "# TYPE dltrain_y gauge\n"
            "dltrain_y 0.25\n");
}

// A server on its own io thread, stopped and joined at scope exit.
struct Served {
  explicit Served(dltrain::control::MetricsServerOptions o)
      : server(io, std::move(o), {[](MetricsBuilder& b) { b.gauge("dltrain_up", "Always 1", {}, 1); }}) {
    server.start();
    thread = std::thread([this] { io.run(); });
  }
  ~Served() {
    boost::asio::post(io, [this] { server.stop(); });
    work.reset();
    io.stop();
    thread.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server.port()); }
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  dltrain::control::MetricsServer server;
  std::thread thread;
};

TEST(MetricsServer, ServesTheExpositionOnlyWithTheTokenWhenOneIsSet) {
  Served s({"127.0.0.1", 0, "scrape-token-123"});
  ASSERT_NE(s.server.port(), 0);
  EXPECT_EQ(dltrain::testing::http_get(s.endpoint(), "/metrics").status, 401);
  EXPECT_EQ(dltrain::testing::http_get(s.endpoint(), "/metrics", "wrong-token-1234").status, 401);
  const auto ok = dltrain::testing::http_get(s.endpoint(), "/metrics", "scrape-token-123");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "# HELP dltrain_up Always 1\n# TYPE dltrain_up gauge\ndltrain_up 1\n");
  // Health needs no token and says nothing; other paths are unknown.
  const auto health = dltrain::testing::http_get(s.endpoint(), "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  EXPECT_EQ(dltrain::testing::http_get(s.endpoint(), "/metrics/../secret", "scrape-token-123").status, 404);
}

TEST(MetricsServer, ServesWithoutATokenOnLoopback) {
  Served s({"127.0.0.1", 0, ""});
  const auto ok = dltrain::testing::http_get(s.endpoint(), "/metrics?x=1");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(parse_exposition(ok.body).size(), 1u);
}

TEST(MetricsServer, RefusesANonLoopbackAddressWithoutAToken) {
  boost::asio::io_context io;
  dltrain::control::MetricsServer server(io, {"0.0.0.0", 0, ""}, {});
  try {
    server.start();
    FAIL() << "started on 0.0.0.0 without a token";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "metrics_token");
  }
  dltrain::control::MetricsServer bad(io, {"localhost", 0, "t"}, {});
  try {
    bad.start();
    FAIL() << "took a host name";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "metrics_address");
  }
}

TEST(MetricsOptions, AgentConfigRefusesAPublicMetricsAddressWithoutAToken) {
  const std::string base = "agent_token = \"agent-token-0123456789\"\n";
  try {
    dltrain::config::parse_agent_options(base + "metrics_address = \"0.0.0.0\"\n", ".");
    FAIL() << "accepted";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "metrics_token");
  }
  const auto o = dltrain::config::parse_agent_options(
      base + "metrics_address = \"0.0.0.0\"\nmetrics_port = 9500\nmetrics_token = \"m-token\"\n", ".");
  EXPECT_EQ(o.metrics_address, "0.0.0.0");
  EXPECT_EQ(o.metrics_port, 9500);
  EXPECT_EQ(o.metrics_token, "m-token");
  const auto local = dltrain::config::parse_agent_options(base + "metrics_address = \"::1\"\n", ".");
  EXPECT_EQ(local.metrics_port, 9464);  // the default
  EXPECT_TRUE(local.metrics_token.empty());
}

dltrain::agent::TaskMetrics worker_task() {
  dltrain::agent::TaskMetrics t;
  t.job = "job-7";
  t.task = "worker-1";
  t.role = dltrain::wire::TaskKind::kWorker;
  t.start_unix = 1000;
  return t;
}

TEST(TaskMetrics, AWorkersEventsBecomeItsSamples) {
  auto t = worker_task();
  events::Progress p{.epoch = 2, .loss = 0.5, .lr = 0.05, .images_per_sec = 812.5, .bytes_pushed = 4096,
                     .bytes_pulled = 8192, .density = 0.01, .compression_ratio = 12.5, .skipped_steps = 1};
  p.counters = events::StepCounters{};
  p.counters->images = 640;
  p.counters->steps = 20;
  p.counters->data_seconds = 0.25;
  p.counters->compute_seconds = 1.5;
  p.counters->compress_seconds = 0.125;
  p.counters->exchange_seconds = 0.75;
  p.counters->resyncs = 2;
  t.on_event(p);
  MetricsBuilder b;
  t.add_to(b, "host-a", 2000);
  const auto s = parse_exposition(b.serialize());
  const std::map<std::string, std::string> who{{"agent", "host-a"}, {"job", "job-7"}, {"task", "worker-1"},
                                               {"role", "worker"}};
  EXPECT_EQ(sum_samples(s, "dltrain_worker_images_total", who), 640);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_steps_total", who), 20);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_push_bytes_total", who), 4096);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_pull_bytes_total", who), 8192);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_images_per_second", who), 812.5);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_loss", who), 0.5);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_learning_rate", who), 0.05);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_compression_ratio", who), 12.5);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_skipped_steps_total", who), 1);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_resyncs_total", who), 2);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_epoch", who), 2);
  int phases = 0;
  EXPECT_EQ(sum_samples(s, "dltrain_worker_step_phase_seconds_total", who, &phases), 0.25 + 1.5 + 0.125 + 0.75);
  EXPECT_EQ(phases, 4);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_step_phase_seconds_total", {{"phase", "compress"}}), 0.125);
  EXPECT_EQ(sum_samples(s, "dltrain_task_start_time_seconds", who), 1000);

  // Its done event carries the final counts.
  events::Done d;
  d.bytes_pushed = 5000;
  d.bytes_pulled = 9000;
  d.counters = events::StepCounters{};
  d.counters->images = 700;
  d.counters->steps = 22;
  t.on_event(d);
  MetricsBuilder after;
  t.add_to(after, "host-a", 2000);
  const auto s2 = parse_exposition(after.serialize());
  EXPECT_EQ(sum_samples(s2, "dltrain_worker_images_total", who), 700);
  EXPECT_EQ(sum_samples(s2, "dltrain_worker_push_bytes_total", who), 5000);
  EXPECT_EQ(sum_samples(s2, "dltrain_worker_images_per_second", who), 0);
}

TEST(TaskMetrics, ARestartIsACounterResetWithANewStartTime) {
  auto t = worker_task();
  events::Progress p;
  p.bytes_pushed = 4096;
  p.counters = events::StepCounters{};
  p.counters->images = 640;
  t.on_event(p);
  t.restarts = 1;
  t.restarted(1500);
  MetricsBuilder b;
  t.add_to(b, "host-a", 2000);
  const auto s = parse_exposition(b.serialize());
  EXPECT_EQ(sum_samples(s, "dltrain_worker_images_total", {}), 0);
  EXPECT_EQ(sum_samples(s, "dltrain_worker_push_bytes_total", {}), 0);
  EXPECT_EQ(sum_samples(s, "dltrain_task_restarts_total", {}), 1);
  EXPECT_EQ(sum_samples(s, "dltrain_task_start_time_seconds", {}), 1500);
  EXPECT_EQ(sum_samples(s, "dltrain_task_running", {}), 1);
}

TEST(TaskMetrics, APsShardsStatsAndCheckpointAge) {
  dltrain::agent::TaskMetrics t;
  t.job = "job-7";
  t.task = "ps-0";
  t.role = dltrain::wire::TaskKind::kPs;
  events::PsStats st;
  st.pushes = 300;
  st.pulls = 310;
  st.apply_seconds = 0.5;
  st.bytes_in = 1000;
  st.bytes_out = 2000;
  st.connections = 2;
  st.refused_handshakes = 1;
  st.rejected_connections = 3;
  st.checkpoints = 4;
  st.last_checkpoint_unix = 1990.0;
  t.on_event(st);
  MetricsBuilder b;
  t.add_to(b, "host-b", 2000);
  const auto s = parse_exposition(b.serialize());
  EXPECT_EQ(sum_samples(s, "dltrain_ps_pushes_total", {{"task", "ps-0"}}), 300);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_pulls_total", {}), 310);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_apply_seconds_total", {}), 0.5);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_receive_bytes_total", {}), 1000);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_transmit_bytes_total", {}), 2000);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_connections", {}), 2);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_refused_handshakes_total", {}), 1);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_rejected_connections_total", {}), 3);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_checkpoints_total", {}), 4);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_checkpoint_age_seconds", {}), 10);
  EXPECT_TRUE(std::none_of(s.begin(), s.end(), [](const auto& x) { return x.name.rfind("dltrain_ps_barrier", 0) == 0; }))
      << "an async shard has no barrier metrics";
}

TEST(TaskMetrics, AnSspShardsBarrierRecord) {
  dltrain::agent::TaskMetrics t;
  t.job = "job-8";
  t.task = "ps-0";
  t.role = dltrain::wire::TaskKind::kPs;
  events::PsStats st;
  st.sync = dltrain::ps::SyncMode::kSsp;
  st.sync_waits = 12;
  st.sync_wait_seconds = 1.5;
  st.workers_dropped = 1;
  st.max_lead = 2;
  t.on_event(st);
  MetricsBuilder b;
  t.add_to(b, "host-b", 2000);
  const auto s = parse_exposition(b.serialize());
  EXPECT_EQ(sum_samples(s, "dltrain_ps_barrier_waits_total", {{"task", "ps-0"}}), 12);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_barrier_wait_seconds_total", {}), 1.5);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_barrier_dropped_workers_total", {}), 1);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_max_lead_steps", {}), 2);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_sync_steps_total", {}), 0);
  EXPECT_EQ(sum_samples(s, "dltrain_ps_late_pushes_total", {}), 0);
}

TEST(AgentMetrics, CoresFreeAreTheOfferedLessTheHeld) {
  dltrain::agent::AgentFigures a;
  a.agent = "host-c";
  a.cores = 8;
  a.cores_used = 3;
  a.memory_mb = 2;
  a.workers_running = 2;
  a.ps_running = 1;
  MetricsBuilder b;
  add_agent_metrics(b, a);
  const auto s = parse_exposition(b.serialize());
  EXPECT_EQ(sum_samples(s, "dltrain_agent_cores", {{"agent", "host-c"}}), 8);
  EXPECT_EQ(sum_samples(s, "dltrain_agent_cores_free", {}), 5);
  EXPECT_EQ(sum_samples(s, "dltrain_agent_memory_bytes", {}), 2.0 * 1024 * 1024);
  EXPECT_EQ(sum_samples(s, "dltrain_agent_tasks_running", {{"role", "worker"}}), 2);
  EXPECT_EQ(sum_samples(s, "dltrain_agent_tasks_running", {{"role", "ps"}}), 1);
}

}  // namespace

namespace {

TEST(Failure, TheCauseOfAnExit) {
  using dltrain::wire::events::classify_exit;
  EXPECT_EQ(classify_exit(1, 0, "divergence", false), "divergence");
  EXPECT_EQ(classify_exit(1, 0, "timeout", false), "timeout");
  EXPECT_EQ(classify_exit(-1, SIGKILL, "", true), "oom");
  EXPECT_EQ(classify_exit(-1, SIGKILL, "", false), "signal");
  EXPECT_EQ(classify_exit(-1, SIGSEGV, "", true), "signal");  // only SIGKILL is the OOM killer's
  EXPECT_EQ(classify_exit(126, 0, "", false), "start");
  EXPECT_EQ(classify_exit(3, 0, "", false), "exit_code");
}

TEST(Failure, OomKillsFromACgroupsMemoryEvents) {
  EXPECT_EQ(dltrain::agent::parse_oom_kills("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 2u);
  EXPECT_FALSE(dltrain::agent::parse_oom_kills("low 0\nhigh 0\n").has_value());
}

TEST(Failure, OomKillsFromACgroupV1MemoryOomControl) {
  EXPECT_EQ(dltrain::agent::parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3u);
}

TEST(Failure, TheOomCounterIsV2sMemoryEventsWhereItsControllerIsOnElseV1sOomControl) {
  const auto root = std::filesystem::temp_directory_path() / ("dltrain-cgroup-" + std::to_string(::getpid()));
  const auto v2 = root / "unified", v1 = root / "memory";
  std::filesystem::create_directories(v2 / "svc");
  std::filesystem::create_directories(v1 / "process_api" / "x");
  std::ofstream(v1 / "process_api" / "x" / "memory.oom_control") << "oom_kill 0\n";
  // A hybrid host (this project's CI machine): cgroup2 without the memory controller.
  const std::string mountinfo =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "35 31 0:32 / " + v1.string() + " rw,relatime shared:9 - cgroup cgroup rw,memory\n"
      "41 31 0:38 / " + v2.string() + " rw,relatime - cgroup2 cgroup2 rw\n";
  const std::string self = "8:pids:/\n4:memory:/process_api/x\n1:cpu:/\n0::/svc\n";
  using dltrain::agent::memory_cgroup_counter_file;
  EXPECT_EQ(memory_cgroup_counter_file(self, mountinfo), (v1 / "process_api" / "x" / "memory.oom_control").string());
  // With the memory controller on in v2, v2's count.
  std::ofstream(v2 / "svc" / "memory.events") << "oom_kill 0\n";
  EXPECT_EQ(memory_cgroup_counter_file(self, mountinfo), (v2 / "svc" / "memory.events").string());
  // A combined v1 hierarchy ("cpu,memory"), and none at all.
  std::filesystem::remove(v2 / "svc" / "memory.events");
  EXPECT_EQ(memory_cgroup_counter_file("4:cpu,memory:/process_api/x\n", mountinfo),
            (v1 / "process_api" / "x" / "memory.oom_control").string());
  EXPECT_FALSE(memory_cgroup_counter_file("0::/svc\n", mountinfo).has_value());
  // A container without a cgroup namespace: its hierarchy's subtree /process_api is
  // mounted, and its cgroup path is given from the hierarchy's root.
  const std::string sub = "35 31 0:32 /process_api " + v1.string() + " rw - cgroup cgroup rw,memory\n";
  std::filesystem::create_directories(v1 / "x");
  std::ofstream(v1 / "x" / "memory.oom_control") << "oom_kill 0\n";
  EXPECT_EQ(memory_cgroup_counter_file("4:memory:/process_api/x\n", sub), (v1 / "x" / "memory.oom_control").string());
  EXPECT_FALSE(memory_cgroup_counter_file(self, "").has_value());
  std::filesystem::remove_all(root);
}

TEST(Failure, TheLastLinesOfALog) {
  const auto dir = std::filesystem::temp_directory_path() / ("dltrain-lastlines-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "task.log").string();
  {
    std::ofstream out(path);
    for (int i = 1; i <= 30; ++i) out << "line " << i << "\n\n";
    out << std::string(2000, 'x') << "\n";
  }
  const auto lines = dltrain::agent::last_lines(path, 3, 100);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "line 29");
  EXPECT_EQ(lines[1], "line 30");
  EXPECT_EQ(lines[2], std::string(100, 'x') + "...");
  // A log larger than the 64 KiB window: only whole lines from its end.
  {
    std::ofstream out(path);
    for (int i = 1; i <= 20000; ++i) out << "entry " << i << "\n";
  }
  const auto tail = dltrain::agent::last_lines(path, 2);
  EXPECT_EQ(tail, (std::vector<std::string>{"entry 19999", "entry 20000"}));
  EXPECT_TRUE(dltrain::agent::last_lines((dir / "absent.log").string(), 5).empty());
  std::filesystem::remove_all(dir);
}

TEST(Failure, ATasksErrorEventNamesItsCauseByType) {
  EXPECT_EQ(events::TaskError::of(dltrain::DivergedError("nan")).cause, "divergence");
  EXPECT_EQ(events::TaskError::of(dltrain::TimeoutError("slow")).cause, "timeout");
  EXPECT_EQ(events::TaskError::of(dltrain::ConfigError("--ps", "bad")).cause, "config");
  EXPECT_FALSE(events::TaskError::of(std::runtime_error("other")).cause.has_value());
  EXPECT_EQ(events::TaskError::of(dltrain::DivergedError("nan")).message, "nan");
}

}  // namespace

namespace {

TEST(TaskLogs, WindowsOfALogAndItsRotation) {
  const auto dir = std::filesystem::temp_directory_path() / ("dltrain-logwin-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "task.log").string();
  std::ofstream(path) << "one\ntwo\nthree\n";
  // The tail: whole lines; where to continue is the end.
  auto w = dltrain::agent::read_log_window(path, std::nullopt, 2, 1024);
  EXPECT_TRUE(w.exists);
  EXPECT_EQ(w.text, "two\nthree\n");
  EXPECT_EQ(w.size, 14);
  EXPECT_EQ(w.next_offset, 14);
  // From an offset, at most max_bytes.
  w = dltrain::agent::read_log_window(path, 4, 0, 5);
  EXPECT_EQ(w.text, "two\nt");
  EXPECT_EQ(w.offset, 4);
  EXPECT_EQ(w.next_offset, 9);
  // Rotation: larger than the bound, it is copied to .1 and truncated; a follower's
  // offset is then past the end and reading starts again at 0.
  EXPECT_FALSE(dltrain::agent::rotate_log_if_larger(path, 100));
  EXPECT_TRUE(dltrain::agent::rotate_log_if_larger(path, 10));
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
  std::ifstream rotated(path + ".1");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(rotated)), {}), "one\ntwo\nthree\n");
  std::ofstream(path, std::ios::app) << "four\n";
  w = dltrain::agent::read_log_window(path, 14, 0, 1024);
  EXPECT_TRUE(w.rotated);
  EXPECT_EQ(w.text, "four\n");
  EXPECT_EQ(w.offset, 0);
  EXPECT_FALSE(dltrain::agent::read_log_window((dir / "none").string(), std::nullopt, 5, 10).exists);
  std::filesystem::remove_all(dir);
}

TEST(TaskLogs, ALogRequestOutOfRangeNamesTheField) {
  dltrain::wire::Envelope env;
  env.type = "logs";
  env.body = {{"job", "job-1"}, {"task", "../etc"}};
  try {
    dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env);
    FAIL() << "accepted a task name that leaves the job's directory";
  } catch (const dltrain::wire::BodyError& e) {
    EXPECT_EQ(e.field(), "task");
  }
  env.body = {{"job", "job-1"}, {"tail", 20000}};
  try {
    dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env);
    FAIL() << "accepted tail 20000";
  } catch (const dltrain::wire::BodyError& e) {
    EXPECT_EQ(e.field(), "tail");
  }
  env.body = {{"job", "job-1"}, {"offset", -1}};
  EXPECT_THROW(dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env), dltrain::wire::BodyError);
  env.body = {{"job", "job-1"}, {"task", "ps-0"}, {"offset", 10}};
  const auto b = dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env);
  EXPECT_EQ(b.task, "ps-0");
  EXPECT_EQ(b.offset, 10);
  EXPECT_EQ(b.max_bytes, 256 << 10);
  EXPECT_EQ(b.file, "log");
  // Which of the task's files: its log or its step timeline, nothing else.
  env.body = {{"job", "job-1"}, {"file", "trace"}};
  EXPECT_EQ(dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env).file, "trace");
  env.body = {{"job", "job-1"}, {"file", "job.secret"}};
  try {
    dltrain::wire::parse_body<dltrain::wire::LogRequestBody>(env);
    FAIL() << "accepted file job.secret";
  } catch (const dltrain::wire::BodyError& e) {
    EXPECT_EQ(e.field(), "file");
    EXPECT_EQ(std::string(e.what()), "logs field \"file\": expected log or trace, got \"job.secret\"");
  }
}

}  // namespace

namespace {

dltrain::leader::TaskRec worker_at(int rank, std::int64_t step,
                                   dltrain::leader::TaskState state = dltrain::leader::TaskState::kRunning) {
  dltrain::leader::TaskRec t;
  t.name = "worker-" + std::to_string(rank);
  t.kind = dltrain::leader::TaskKind::kWorker;
  t.index = rank;
  t.state = state;
  t.global_step = step;
  return t;
}

TEST(Stragglers, AWorkerMoreThanTheFactorBehindTheLeadIsFlagged) {
  dltrain::leader::JobRec j;
  dltrain::leader::TaskRec ps;
  ps.name = "ps-0";
  ps.kind = dltrain::leader::TaskKind::kPs;
  ps.state = dltrain::leader::TaskState::kRunning;
  j.tasks = {ps, worker_at(0, 100), worker_at(1, 49), worker_at(2, 50), worker_at(3, 10, dltrain::leader::TaskState::kExited)};
  dltrain::leader::mark_stragglers(j, 2.0);
  EXPECT_FALSE(j.tasks[1].straggler);  // the lead
  EXPECT_TRUE(j.tasks[2].straggler);   // 49 x 2 < 100
  EXPECT_FALSE(j.tasks[3].straggler);  // 50 x 2 = 100: not more than twice behind
  EXPECT_FALSE(j.tasks[4].straggler);  // finished or dead: not running
  EXPECT_FALSE(j.tasks[0].straggler);
  // Off, and too early to tell.
  dltrain::leader::mark_stragglers(j, 0);
  EXPECT_FALSE(j.tasks[2].straggler);
  j.tasks = {worker_at(0, dltrain::leader::kMinStepsForStragglers - 1), worker_at(1, 0)};
  dltrain::leader::mark_stragglers(j, 2.0);
  EXPECT_FALSE(j.tasks[1].straggler);
  j.tasks[0].global_step = dltrain::leader::kMinStepsForStragglers;
  dltrain::leader::mark_stragglers(j, 2.0);
  EXPECT_TRUE(j.tasks[1].straggler);
}

TEST(Stragglers, TheFactorIsZeroOrMoreThanOne) {
  const std::string base = "agent_token = \"agent-token-0123456789\"\n";
  EXPECT_EQ(dltrain::config::parse_agent_options(base, ".").straggler_factor, 2.0);
  EXPECT_EQ(dltrain::config::parse_agent_options(base + "straggler_factor = 0\n", ".").straggler_factor, 0.0);
  EXPECT_EQ(dltrain::config::parse_agent_options(base + "straggler_factor = 3.5\n", ".").straggler_factor, 3.5);
  try {
    dltrain::config::parse_agent_options(base + "straggler_factor = 0.5\n", ".");
    FAIL() << "accepted 0.5";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "straggler_factor");
  }
}

}  // namespace
