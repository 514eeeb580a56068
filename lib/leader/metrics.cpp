// The leader's Prometheus metrics (leader/metrics.h).
#include "leader/metrics.h"

#include <algorithm>
#include <array>

#include "leader/states.h"

namespace dltrain::leader {

void add_leader_metrics(control::MetricsBuilder& out, const JobTable& jobs, const AgentRegistry& agents,
                        std::size_t queue_length, const LeaderCounters& counters) {
  std::map<std::string, int> by_state;
  // Every state a job can be in, so that a state without jobs reads 0 rather than
  // vanishing (a query for sum(dltrain_leader_jobs{state="failed"}) then never goes stale).
  for (const auto st : kJobStates) by_state[std::string(to_string(st))] = 0;
  for (const auto& [id, j] : jobs) ++by_state[std::string(to_string(j.state()))];
  for (const auto& [st, n] : by_state) {
    out.gauge("dltrain_leader_jobs", "Jobs known to the leader, by state", {{"state", st}}, n);
  }
  out.gauge("dltrain_leader_queue_length", "Jobs waiting in the queue for cores", {}, static_cast<double>(queue_length));
  int live = 0, lost = 0, stopping = 0, cores = 0, free_cores = 0;
  for (const auto& [id, a] : agents) {
    if (a.lost) {
      ++lost;
      continue;
    }
    (a.stopping ? stopping : live) += 1;
    cores += a.cores;
    free_cores += a.free_cores;
  }
  out.gauge("dltrain_leader_agents", "Registered agents, by state", {{"state", "ready"}}, live);
  out.gauge("dltrain_leader_agents", "", {{"state", "stopping"}}, stopping);
  out.gauge("dltrain_leader_agents", "", {{"state", "lost"}}, lost);
  out.gauge("dltrain_leader_cores", "Cores the live agents offer", {}, cores);
  out.gauge("dltrain_leader_cores_free", "Cores of the live agents not held by a task", {}, free_cores);
  out.counter("dltrain_leader_planner_decisions_total", "Planner decisions for automatic jobs, by outcome",
              {{"outcome", "feasible"}}, static_cast<double>(counters.plans - counters.infeasible_plans));
  out.counter("dltrain_leader_planner_decisions_total", "", {{"outcome", "infeasible"}},
              static_cast<double>(counters.infeasible_plans));
  out.counter("dltrain_leader_exploration_runs_total", "Exploration (profiling) runs started by the planner", {},
              static_cast<double>(counters.exploration_runs));
  for (const char* peer : {"agent", "client"}) {
    const auto it = counters.requests.find(peer);
    out.counter("dltrain_leader_control_requests_total", "Control messages received, by peer kind",
                {{"peer", peer}}, it == counters.requests.end() ? 0.0 : static_cast<double>(it->second));
  }
  for (const auto& [key, n] : counters.errors) {
    out.counter("dltrain_leader_control_errors_total", "Error replies sent, by peer kind and error code",
                {{"peer", key.first}, {"code", key.second}}, static_cast<double>(n));
  }
  // The latest ended jobs, counted from the end of the submission order.
  std::size_t ended_seen = 0;
  for (const JobRec* jp : jobs.newest(jobs.size())) {
    const JobRec& j = *jp;
    if (j.terminal() && ++ended_seen > kEndedJobsExposed) continue;
    const control::MetricLabels l{{"job", j.id}, {"name", j.spec.name}};
    out.gauge("dltrain_job_epochs_done", "Epochs the job has finished", l, j.epochs_done);
    out.gauge("dltrain_job_epochs", "Epochs the job trains for", l, j.spec.epochs);
    if (j.test_accuracy >= 0) {
      out.gauge("dltrain_job_test_accuracy", "Test accuracy after the job's last finished epoch, [0, 1]", l,
                j.test_accuracy);
    }
    double ips = 0;
    for (const auto& [r, v] : j.figures.images_per_sec) ips += v;
    out.gauge("dltrain_job_images_per_second", "Sum of the workers' latest epoch throughputs", l, ips);
    out.counter("dltrain_job_push_bytes_total", "Bytes the job's workers sent to the PS shards, all generations", l,
                static_cast<double>(j.bytes_pushed()));
    out.counter("dltrain_job_pull_bytes_total", "Bytes the job's workers received from the PS shards, all generations",
                l, static_cast<double>(j.bytes_pulled()));
    out.gauge("dltrain_job_wall_seconds", "Seconds from submission to the end (or now)", l, j.wall_seconds());
    out.gauge("dltrain_job_generation", "The job's generation (bumped at each re-assignment)", l, j.generation);
    for (const auto& t : j.tasks) {
      if (t.kind != TaskKind::kWorker || j.terminal()) continue;
      out.gauge("dltrain_job_worker_straggler",
                "1 while the worker is behind its job's most advanced one by more than straggler_factor",
                {{"job", j.id}, {"task", t.name}}, t.straggler ? 1 : 0);
    }
  }
}

}  // namespace dltrain::leader
