// The leader's queue: what a queued job needs (its tasks' cores, GPUs, and for a sharded
// data set the agents with a shard cache), why it waits and for how long, the admission
// pass that starts what fits (the rule is scheduler.h's), and the events that say so.
#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/errors.h"
#include "planner/ps_memory.h"

namespace dltrain::leader {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace events = wire::events;

QueueStatus Leader::Impl::queue_status(const JobRec& j) const {
  QueueStatus q;
  q.position = queue.position(j.id);
  q.cores_needed = (j.spec.workers + j.spec.ps_shards) * j.spec.threads_per_task;
  q.cores_free = agents.free_cores();
  const auto caps = agents.capacities();
  q.fits_cluster = fits(caps, needs(j));
  q.agents = static_cast<int>(caps.size());
  if (j.spec.dataset == DatasetKind::kShards) {
    q.cache_agents = static_cast<int>(std::count_if(caps.begin(), caps.end(), [](const AgentSlots& a) { return a.serves_shards; }));
  }
  for (const int c : agents.sizes()) q.cores_total += c;
  q.gpus_needed = j.spec.workers * j.spec.gpus_per_worker;
  q.gpus_free = agents.free_gpus();
  q.gpus_total = agents.total_gpus();
  return q;
}

void Leader::Impl::enqueue(JobRec& j) {
  const auto* u = user_options(j.owner);
  queue.enqueue(j.id, u ? u->priority : 0);
  j.queued_since = Clock::now();
  j.last_waiting.clear();
}

std::chrono::milliseconds Leader::Impl::queue_timeout(const JobRec& j) const {
  if (j.spec.queue_timeout_seconds <= 0) return opt.queue_timeout;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(j.spec.queue_timeout_seconds));
}

json Leader::Impl::waiting_event(const JobRec& j) const {
  const auto q = queue_status(j);
  events::Waiting w;
  w.position = static_cast<std::int64_t>(q.position);
  w.cores_needed = q.cores_needed;
  w.cores_free = q.cores_free;
  w.cores_total = q.cores_total;
  w.fits_cluster = q.fits_cluster;
  if (q.gpus_needed > 0) {
    w.gpus_needed = q.gpus_needed;
    w.gpus_free = q.gpus_free;
    w.gpus_total = q.gpus_total;
  }
  if (const auto t = queue_timeout(j); t.count() > 0) w.queue_timeout_seconds = static_cast<double>(t.count()) / 1000.0;
  w.quota = quota_wait(j);
  json e = w.to_json();
  e["job"] = j.id;
  return e;
}

// A follower of a queued job learns at once why it waits, and again whenever that changes
// (its place, the free cores, the cluster's size): never a silent wait.
void Leader::Impl::notify_waiting() {
  for (const auto& id : queue.jobs()) {
    auto& j = jobs.at(id);
    if (j.state() != JobState::kQueued) continue;
    const json e = waiting_event(j);
    const std::string text = e.dump();
    if (text == j.last_waiting) continue;
    j.last_waiting = text;
    notify(j, e);
  }
}

void Leader::Impl::expire_queued() {
  const auto now = Clock::now();
  // Collected first: failing a job schedules the others, which changes the queue.
  std::vector<std::string> expired;
  for (const auto& id : queue.jobs()) {
    const auto& j = jobs.at(id);
    const auto timeout = queue_timeout(j);
    if (j.state() == JobState::kQueued && timeout.count() > 0 && j.queued_since && now - *j.queued_since >= timeout) {
      expired.push_back(id);
    }
  }
  for (const auto& id : expired) {
    auto& j = jobs.at(id);
    if (queue.position(id) == 0 || j.state() != JobState::kQueued) continue;
    const auto timeout = queue_timeout(j);
    const auto q = queue_status(j);
    const auto quota = quota_wait(j);
    queue.remove(id);
    std::string gpus;
    if (q.gpus_needed > 0) {
      gpus = "; and " + std::to_string(q.gpus_needed) + " GPUs, " + std::to_string(q.gpus_free) +
             " are free and the cluster has " + std::to_string(q.gpus_total);
    }
    fail_job(j, "waited " + fmt::format("{:g}", static_cast<double>(timeout.count()) / 1000.0) +
                    " s in the queue (queue_timeout): it needs " + std::to_string(q.cores_needed) + " cores, " +
                    std::to_string(q.cores_free) + " are free and the cluster has " + std::to_string(q.cores_total) +
                    (q.fits_cluster ? "" : " in all") + gpus + q.cache_note() + (quota ? "; " + *quota : std::string()));
  }
}

// The queue's rule is the scheduler's (leader/scheduler.h): FIFO without overtaking; a
// job that cannot fit even an idle cluster waits without blocking others.
void Leader::Impl::try_schedule() {
  if (opt.shared_plan) replan();
  schedule_pass();
  notify_waiting();
}

void Leader::Impl::schedule_pass() {
  // A job being re-assigned goes first: the cores its stopped tasks freed are its own.
  for (auto& [id, j] : jobs) {
    if (j.state() == JobState::kRecovering) return;
  }
  const auto admitted =
      queue.admit(agents.capacities(), agents.slots(), [this](const std::string& id) { return needs(jobs.at(id)); },
                  [this](const std::string& id) { return shard_spread(jobs.at(id)); }, admit_quotas());
  for (const auto& a : admitted) launch(jobs.at(a.job), a.placement, a.added_shards);
}

std::optional<ShardSpread> Leader::Impl::shard_spread(const JobRec& j) const {
  if (!j.spec.ps_shards_auto) return std::nullopt;
  int partitions = 1;
  if (j.spec.model != ModelKind::kTorchScript) {
    try {
      partitions = planner::model_partitions(j.spec, planner::dataset_classes(j.spec));
    } catch (const ConfigError& e) {
      spdlog::warn("job {}: ps_shards = \"auto\" keeps one shard: {}", j.id, e.what());
    }
  }
  return ShardSpread{j.spec.ps_shards, j.spec.threads_per_task, std::clamp(partitions, 1, 256)};
}

std::vector<TaskNeed> Leader::Impl::needs(const JobRec& j) const {
  auto out = job_needs(j.spec.ps_shards, j.spec.workers, j.spec.threads_per_task, j.spec.gpus_per_worker,
                       j.spec.local_group);
  if (j.spec.dataset == DatasetKind::kShards) {
    // Each worker of a sharded data set goes to an agent with a shard cache, preferring
    // those that hold its shards (known from the manifest read at submit).
    const auto held = cached_shard_sets();
    for (std::size_t i = static_cast<std::size_t>(j.spec.ps_shards); i < out.size(); ++i) {
      out[i].reads_shards = true;
      if (!j.data_shards.empty()) out[i].cached = j.cached_for(static_cast<int>(i) - j.spec.ps_shards, held);
    }
  }
  return out;
}

std::map<std::string, const std::set<std::string>*> Leader::Impl::cached_shard_sets() const {
  std::map<std::string, const std::set<std::string>*> out;
  for (const auto& [id, a] : agents) {
    if (!a.lost && !a.cached_shards.empty()) out[id] = &a.cached_shards;
  }
  return out;
}

}  // namespace dltrain::leader
