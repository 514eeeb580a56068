// An agent's task table (agent/task_table.h) without processes: the restart decision and
// its back-off (0.5 s doubling, capped at 32 s; none after a clean exit, a stop, a
// shutdown, a configuration error or the last allowed restart), what a task's events
// leave on it, what a registration lists, and how long ended tasks' metrics stay, each
// figure worked out by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "agent/task_table.h"
#include "control/metrics_server.h"

using namespace dltrain;
using namespace dltrain::agent;
using std::chrono::milliseconds;

namespace {

Task task(const std::string& job, const std::string& name, wire::TaskKind kind, std::uint32_t generation = 1) {
  Task t;
  t.job = job;
  t.name = name;
  t.kind = kind;
  t.generation = generation;
  t.launch.threads = 2;
  t.metrics.job = job;
  t.metrics.task = name;
  t.metrics.role = kind;
  return t;
}

// How many samples of `name` the exposition has (one per task carrying it).
int samples(const control::MetricsBuilder& out, const std::string& name) {
  for (const auto& f : out.families()) {
    if (f.name == name) return static_cast<int>(f.metric.size());
  }
  return 0;
}

}  // namespace

TEST(TaskTable, ADyingTaskRestartsAfterHalfASecondDoublingToThirtyTwoAndNotPastItsLimit) {
  TaskTable tt;
  tt.add(task("job-1", "worker-0", wire::TaskKind::kWorker));
  Task& t = *tt.find("job-1/worker-0");
  const ExitStatus killed{-1, 9};
  const milliseconds expected[] = {milliseconds(500),   milliseconds(1000),  milliseconds(2000),
                                   milliseconds(4000),  milliseconds(8000),  milliseconds(16000),
                                   milliseconds(32000), milliseconds(32000)};
  for (int i = 0; i < 8; ++i) {
    const auto plan = tt.plan_restart(t, killed, false, 8);
    ASSERT_TRUE(plan.has_value()) << "restart " << i + 1;
    EXPECT_EQ(plan->attempt, i + 1);
    EXPECT_EQ(plan->delay, expected[i]) << "restart " << i + 1;
  }
  EXPECT_FALSE(tt.plan_restart(t, killed, false, 8).has_value());  // the ninth: over the limit
  EXPECT_EQ(t.restarts, 8);
  EXPECT_EQ(tt.restarts(), 8u);
}

TEST(TaskTable, NoRestartAfterACleanExitAStopAShutdownOrAConfigurationError) {
  TaskTable tt;
  tt.add(task("job-1", "ps-0", wire::TaskKind::kPs));
  Task& t = *tt.find("job-1/ps-0");
  EXPECT_FALSE(tt.plan_restart(t, ExitStatus{0, 0}, false, 3));
  EXPECT_FALSE(tt.plan_restart(t, ExitStatus{TaskTable::kConfigErrorExit, 0}, false, 3));
  EXPECT_FALSE(tt.plan_restart(t, ExitStatus{1, 0}, true, 3));  // the agent shuts down
  t.stop_requested = true;
  EXPECT_FALSE(tt.plan_restart(t, ExitStatus{-1, 15}, false, 3));
  t.stop_requested = false;
  // Exit code 2 from a signal's death is not a configuration error.
  EXPECT_TRUE(tt.plan_restart(t, ExitStatus{2, 9}, false, 3));
  EXPECT_EQ(tt.restarts(), 1u);
}

TEST(TaskTable, EventsLeaveThePortTheFinishedEpochsAndTheLastError) {
  Task t = task("job-1", "worker-1", wire::TaskKind::kWorker);
  wire::events::EpochEnd e;
  e.epoch = 3;
  t.on_event(e);
  e.epoch = 2;  // a late, older epoch_end never lowers where a restart resumes
  t.on_event(e);
  EXPECT_EQ(t.epochs_done, 3);
  wire::events::TaskError err;
  err.message = "the model diverged";
  err.cause = "divergence";
  t.on_event(err);
  EXPECT_EQ(t.last_error, "the model diverged");
  EXPECT_EQ(t.last_cause, "divergence");
  Task ps = task("job-1", "ps-0", wire::TaskKind::kPs);
  wire::events::Listening l;
  l.port = 40123;
  ps.on_event(l);
  EXPECT_EQ(ps.port, 40123);
}

TEST(TaskTable, ARegistrationListsTheRunningTasksAndTheExitsStillOnTheirWay) {
  TaskTable tt;
  tt.add(task("job-2", "worker-0", wire::TaskKind::kWorker, 3));
  tt.add(task("job-2", "ps-0", wire::TaskKind::kPs, 3));
  ASSERT_TRUE(tt.end("job-2/ps-0", 100.0).has_value());
  EXPECT_FALSE(tt.end("job-2/ps-0", 100.0).has_value());  // ended once
  tt.exit_pending("job-2/ps-0", 3);
  const auto listed = tt.registered();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].task, "worker-0");
  EXPECT_FALSE(listed[0].exited);
  EXPECT_EQ(listed[0].threads, 2);
  EXPECT_EQ(listed[1].job, "job-2");
  EXPECT_EQ(listed[1].task, "ps-0");
  EXPECT_EQ(listed[1].generation, 3u);
  EXPECT_TRUE(listed[1].exited);
  tt.exits_delivered();
  EXPECT_EQ(tt.registered().size(), 1u);
}

TEST(TaskTable, EndedTasksMetricsStayTenMinutesAndAtMostSixtyFour) {
  TaskTable tt;
  for (int i = 0; i < 70; ++i) {
    const std::string name = "worker-" + std::to_string(i);
    tt.add(task("job-3", name, wire::TaskKind::kWorker));
    tt.end("job-3/" + name, 1000.0 + i);  // ended at 1000 s .. 1069 s
  }
  tt.add(task("job-4", "worker-0", wire::TaskKind::kWorker));
  {
    control::MetricsBuilder out;
    AgentFigures a;
    tt.add_metrics(out, a, "agent-a", 1100.0);
    EXPECT_EQ(a.workers_running, 1);
    EXPECT_EQ(a.cores_used, 2);
    // 64 ended (the newest: worker-6 .. worker-69) and the running one.
    EXPECT_EQ(samples(out, "dltrain_task_running"), 65);
  }
  {
    control::MetricsBuilder out;
    AgentFigures a;
    // At 1630 s those that ended before 1030 s are older than ten minutes: 30..69 stay.
    tt.add_metrics(out, a, "agent-a", 1630.0);
    EXPECT_EQ(samples(out, "dltrain_task_running"), 41);
  }
}
