// The leader's metrics (leader/metrics.h) from its parts, without a leader or a socket:
// every job state present (0 where no job is in it), agents by state and their cores,
// the counters as given, and per-job gauges for the live jobs and only the latest ended
// ones; each figure counted by hand from what the test builds.
#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <string>

#include "leader/metrics.h"

using namespace dltrain;
using namespace dltrain::leader;

namespace {

// The value of the sample of `family` whose labels include `labels`; -1 when none.
double sample(const control::MetricsBuilder& out, const std::string& family,
              const std::map<std::string, std::string>& labels) {
  for (const auto& f : out.families()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      std::size_t matched = 0;
      for (const auto& l : m.label) {
        const auto it = labels.find(l.name);
        if (it != labels.end() && it->second == l.value) ++matched;
      }
      if (matched == labels.size()) return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return -1;
}

std::size_t samples(const control::MetricsBuilder& out, const std::string& family) {
  for (const auto& f : out.families()) {
    if (f.name == family) return f.metric.size();
  }
  return 0;
}

void add(JobTable& jobs, JobState state, int epochs_done = 0) {
  JobRec j;
  jobs.number(j);
  j.spec.name = "j";
  j.spec.epochs = 8;
  j.epochs_done = epochs_done;
  j.life = JobLifecycle::restored(state, std::nullopt);
  jobs.add(std::move(j));
}

}  // namespace

TEST(LeaderMetrics, JobsByStateAgentsCoresAndCountersAreWhatTheLeaderHolds) {
  JobTable jobs;
  add(jobs, JobState::kRunning, 3);  // job-1
  add(jobs, JobState::kQueued);      // job-2
  add(jobs, JobState::kQueued);      // job-3
  add(jobs, JobState::kFailed, 1);   // job-4
  AgentRegistry agents;
  auto& a = agents["a"];
  a.cores = 4;
  a.free_cores = 1;
  auto& b = agents["b"];
  b.cores = 2;
  b.free_cores = 2;
  b.stopping = true;
  auto& c = agents["c"];
  c.cores = 8;
  c.free_cores = 8;
  c.lost = true;
  LeaderCounters counters;
  counters.plans = 5;
  counters.infeasible_plans = 2;
  counters.requests["client"] = 11;
  counters.errors[{"client", "not_found"}] = 3;

  control::MetricsBuilder out;
  add_leader_metrics(out, jobs, agents, 2, counters);
  EXPECT_EQ(sample(out, "dltrain_leader_jobs", {{"state", "queued"}}), 2);
  EXPECT_EQ(sample(out, "dltrain_leader_jobs", {{"state", "running"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_leader_jobs", {{"state", "failed"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_leader_jobs", {{"state", "succeeded"}}), 0);  // present, at 0
  EXPECT_EQ(samples(out, "dltrain_leader_jobs"), std::size(kJobStates));
  EXPECT_EQ(sample(out, "dltrain_leader_queue_length", {}), 2);
  EXPECT_EQ(sample(out, "dltrain_leader_agents", {{"state", "ready"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_leader_agents", {{"state", "stopping"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_leader_agents", {{"state", "lost"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_leader_cores", {}), 6);  // a and b; c is lost
  EXPECT_EQ(sample(out, "dltrain_leader_cores_free", {}), 3);
  EXPECT_EQ(sample(out, "dltrain_leader_planner_decisions_total", {{"outcome", "feasible"}}), 3);
  EXPECT_EQ(sample(out, "dltrain_leader_planner_decisions_total", {{"outcome", "infeasible"}}), 2);
  EXPECT_EQ(sample(out, "dltrain_leader_control_requests_total", {{"peer", "client"}}), 11);
  EXPECT_EQ(sample(out, "dltrain_leader_control_requests_total", {{"peer", "agent"}}), 0);
  EXPECT_EQ(sample(out, "dltrain_leader_control_errors_total", {{"peer", "client"}, {"code", "not_found"}}), 3);
  EXPECT_EQ(sample(out, "dltrain_job_epochs_done", {{"job", "job-1"}}), 3);
  EXPECT_EQ(sample(out, "dltrain_job_epochs_done", {{"job", "job-4"}}), 1);
  EXPECT_EQ(sample(out, "dltrain_job_epochs", {{"job", "job-2"}}), 8);
}

TEST(LeaderMetrics, OnlyTheLatestEndedJobsHavePerJobGauges) {
  JobTable jobs;
  add(jobs, JobState::kRunning);  // job-1: live, always exposed
  for (std::size_t i = 0; i < kEndedJobsExposed + 5; ++i) add(jobs, JobState::kSucceeded);  // job-2 .. job-26
  control::MetricsBuilder out;
  add_leader_metrics(out, jobs, AgentRegistry{}, 0, LeaderCounters{});
  EXPECT_EQ(samples(out, "dltrain_job_epochs"), kEndedJobsExposed + 1);
  EXPECT_EQ(sample(out, "dltrain_job_epochs", {{"job", "job-1"}}), 8);
  EXPECT_EQ(sample(out, "dltrain_job_epochs", {{"job", "job-26"}}), 8);  // the newest ended
  EXPECT_EQ(sample(out, "dltrain_job_epochs", {{"job", "job-6"}}), -1);  // the 21st newest ended: not exposed
  EXPECT_EQ(sample(out, "dltrain_job_epochs", {{"job", "job-7"}}), 8);   // the 20th
}
