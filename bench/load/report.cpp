// Driver::report and Driver::passed: what a load run measured, as one JSON object.
#include <algorithm>
#include <thread>

#include "load/driver.h"

namespace dltrain::load {

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json options_json(const LoadOptions& o) {
  return {{"leader_url", o.leader_url},
          {"agents", o.agents},
          {"cores_per_agent", o.cores_per_agent},
          {"clients", o.clients},
          {"duration_s", o.duration},
          {"connect_rate", o.connect_rate},
          {"client_interval_s", o.client_interval},
          {"weights", {{"status", o.weight_status}, {"list", o.weight_list}, {"follow", o.weight_follow}}},
          {"submit_rate", o.submit_rate},
          {"submit_follow", o.submit_follow},
          {"job", {{"workers", o.job_workers}, {"ps_shards", o.job_ps}, {"epochs", o.job_epochs}}},
          {"epoch_seconds", o.epoch_seconds},
          {"progress_interval_s", o.progress_interval},
          {"task_start_s", o.task_start},
          {"request_timeout_s", o.request_timeout},
          {"monitor_interval_s", o.monitor_interval},
          {"seed", o.seed}};
}

}  // namespace

json Driver::report() const {
  json r;
  r["config"] = options_json(run_.opt);
  const double window = t_window_end_ > t_ramp_end_ ? secs(t_window_end_ - t_ramp_end_) : 0;
  json machine{{"cores", std::thread::hardware_concurrency()}};
  if (machine_ramp_end_ && machine_window_end_) {
    // Percent of one core, all cores together (200 = both cores of a 2-core machine busy):
    // what the leader and the tool did not use went to other processes.
    const double wall = secs(machine_window_end_->at - machine_ramp_end_->at);
    const double busy = wall > 0 ? 100.0 * (machine_window_end_->busy - machine_ramp_end_->busy) / wall : 0;
    machine["busy_percent_window"] = busy;
    double ours = 0;
    if (self_ramp_end_ && self_window_end_) ours += cpu_percent(*self_ramp_end_, *self_window_end_);
    if (leader_ramp_end_ && leader_window_end_) ours += cpu_percent(*leader_ramp_end_, *leader_window_end_);
    machine["others_percent_window"] = std::max(0.0, busy - ours);
  }
  r["machine"] = machine;
  r["phases"] = {{"ramp_s", secs(t_ramp_end_ - t_start_)},
                 {"window_s", window},
                 {"drain_s", t_drain_end_ > t_window_end_ ? secs(t_drain_end_ - t_window_end_) : 0}};

  int sessions_lost = 0;
  for (const auto& a : agents_) sessions_lost += a->lost_session() ? 1 : 0;
  r["sessions"] = {{"agents", {{"simulated", agents_.size()},
                               {"registered", agents_up_},
                               {"failed", agents_failed_},
                               {"sessions_ended", sessions_lost}}},
                   {"clients", {{"simulated", clients_.size()}, {"connected", clients_up_}, {"failed", clients_failed_}}}};

  json lat = run_.latencies.to_json();
  json lateness = lat.contains("tool_timer_lateness") ? lat["tool_timer_lateness"] : json::object();
  lat.erase("tool_timer_lateness");
  r["latency_ms"] = lat;
  r["tool_timer_lateness_ms"] = lateness;

  r["heartbeats"] = {{"sent", run_.heartbeats_sent},
                     {"acked", run_.heartbeats_acked},
                     {"per_second", window > 0 ? static_cast<double>(run_.heartbeats_sent) / window : 0},
                     {"leader_max_silence_s", max_silence_},
                     {"leader_views", views_}};

  // Lost as the leader sees it; "wrongly" lost: the agent's session was up all along.
  json lost_names = json::array(), wrongly = json::array();
  if (final_view_) {
    for (const auto& n : final_view_->lost_names) {
      lost_names.push_back(n);
      const auto a = std::find_if(agents_.begin(), agents_.end(), [&](const auto& s) { return s->name() == n; });
      if (a != agents_.end() && !(*a)->lost_session()) wrongly.push_back(n);
    }
  }
  r["agents_lost"] = {{"final_view_read", final_view_.has_value()},
                      {"lost", final_view_ ? final_view_->lost : -1},
                      {"wrongly_lost", wrongly.size()},
                      {"max_lost_seen", max_lost_seen_},
                      {"ready_at_end", final_view_ ? final_view_->ours_ready : -1},
                      {"lost_names", lost_names}};

  int succeeded = 0, failed = 0, cancelled = 0, unfinished = 0;
  std::vector<double> walls;
  for (const auto& [id, j] : run_.jobs) {
    if (j.state == "succeeded") {
      ++succeeded;
      if (j.wall_seconds >= 0) walls.push_back(j.wall_seconds);
    } else if (j.state == "failed") {
      ++failed;
    } else if (j.state == "cancelled") {
      ++cancelled;
    } else {
      ++unfinished;
    }
  }
  auto w50 = walls, w99 = walls;
  r["jobs"] = {{"submit_requests", submits_sent_},
               {"submitted", run_.jobs.size()},
               {"succeeded", succeeded},
               {"failed", failed},
               {"cancelled", cancelled},
               {"unfinished", unfinished},
               {"tasks_started", run_.tasks_started},
               {"tasks_finished", run_.tasks_finished},
               {"nominal_task_seconds", run_.opt.task_start + run_.opt.job_epochs * run_.opt.epoch_seconds},
               {"wall_s", {{"p50", percentile(w50, 50)},
                           {"p99", percentile(w99, 99)},
                           {"max", walls.empty() ? 0.0 : *std::max_element(walls.begin(), walls.end())}}}};

  const auto msgs = run_.messages_in + run_.messages_out;
  r["messages"] = {{"to_leader", run_.messages_out},
                   {"from_leader", run_.messages_in},
                   {"per_second", window > 0 ? static_cast<double>(msgs) / window : 0},
                   {"client_requests_per_second",
                    window > 0 ? static_cast<double>(run_.latencies.count("status") + run_.latencies.count("list") +
                                                     run_.latencies.count("follow")) /
                                     window
                               : 0},
                   {"bytes_to_leader", run_.bytes_out},
                   {"bytes_from_leader", run_.bytes_in},
                   {"events_to_followers", run_.events_received},
                   {"list_reply_bytes_max", run_.list_bytes_max}};
  r["errors"] = run_.errors.to_json();

  if (run_.opt.leader_pid > 0) {
    json l{{"pid", run_.opt.leader_pid}, {"rss_mb_max", leader_rss_max_}};
    if (leader_start_) l["rss_mb_start"] = leader_start_->rss_mb;
    if (leader_ramp_end_) l["rss_mb_ramp_end"] = leader_ramp_end_->rss_mb;
    if (leader_window_end_) l["rss_mb_window_end"] = leader_window_end_->rss_mb;
    if (leader_last_) {
      l["hwm_mb"] = leader_last_->hwm_mb;
      l["threads"] = leader_last_->threads;
    }
    if (leader_start_ && leader_ramp_end_) {
      l["cpu_s_ramp"] = leader_ramp_end_->cpu_seconds - leader_start_->cpu_seconds;
    }
    if (leader_ramp_end_ && leader_window_end_) {
      const double cpu = leader_window_end_->cpu_seconds - leader_ramp_end_->cpu_seconds;
      l["cpu_s_window"] = cpu;
      l["cpu_percent_window"] = cpu_percent(*leader_ramp_end_, *leader_window_end_);
      l["cpu_us_per_message"] = msgs > 0 ? cpu * 1e6 / static_cast<double>(msgs) : 0;
    }
    r["leader"] = l;
  }
  json tool;
  if (self_ramp_end_ && self_window_end_) {
    tool["cpu_percent_window"] = cpu_percent(*self_ramp_end_, *self_window_end_);
    tool["rss_mb"] = self_window_end_->rss_mb;
  }
  r["tool"] = tool;
  r["passed"] = passed();
  return r;
}

bool Driver::passed() const {
  const bool all_up = agents_up_ == static_cast<int>(agents_.size()) && clients_up_ == static_cast<int>(clients_.size());
  const bool none_lost = final_view_ && final_view_->lost == 0 && max_lost_seen_ == 0;
  const bool jobs_ok = std::all_of(run_.jobs.begin(), run_.jobs.end(),
                                   [](const auto& kv) { return kv.second.state == "succeeded"; });
  const bool submitted = run_.opt.submit_rate <= 0 || !run_.jobs.empty();
  return all_up && none_lost && jobs_ok && submitted && run_.errors.total() == 0;
}

}  // namespace dltrain::load
