// Elastic jobs (docs/training.md, "Elastic jobs"): `dltrain scale`, and a lost agent's
// workers given up instead of re-assigning the job. A job grows by starting workers for
// the next ranks, which pull the parameters and join the shards' barrier with their
// hello; it shrinks by asking its highest ranks to leave after their step (stop_task
// with leave: SIGUSR1), whose exits then remove them. The shards and the data dispatch
// follow the membership themselves (ps/sync.h, ps/dispatch.h).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/toml_fields.h"
#include "leader/leader_impl.h"
#include "leader/shared_plan.h"

namespace dltrain::leader {

using json = nlohmann::json;
using SessionPtr = Leader::Impl::SessionPtr;
namespace events = wire::events;

namespace {

// The job's workers that still train or are about to (not exited, not leaving).
int current_workers(const JobRec& j) {
  return static_cast<int>(std::count_if(j.tasks.begin(), j.tasks.end(), [](const TaskRec& t) {
    return t.kind == TaskKind::kWorker && t.state != TaskState::kExited && !t.leaving;
  }));
}

}  // namespace

void Leader::Impl::on_scale(const SessionPtr& s, const wire::Envelope& env, JobRec& j) {
  const auto b = wire::parse_body<wire::ScaleBody>(env);
  if (!may_act(s, env.id, j, "scale")) return;
  if (!j.spec.elastic.on()) {
    return reply_error(s, env.id, wire::error_code::kConflict,
                       j.id + " is not elastic: its job file has no [elastic] section with min_workers and max_workers",
                       "job");
  }
  const auto& e = j.spec.elastic;
  if (b.workers < e.min_workers || b.workers > e.max_workers) {
    return reply_error(s, env.id, wire::error_code::kBadRequest,
                       "workers must lie within " + j.id + "'s [elastic] bounds [" + std::to_string(e.min_workers) + ", " +
                           std::to_string(e.max_workers) + "], got " + std::to_string(b.workers),
                       "workers");
  }
  const int from = current_workers(j);
  json body{{"job", j.id}, {"from", from}, {"to", b.workers}};
  if (auto why = resize(j, b.workers, "user " + s->identity().user, &body)) {
    return reply_error(s, env.id, wire::error_code::kConflict, *why, "workers");
  }
  // A size asked for by hand stays: the shared plan no longer moves this job.
  if (opt.shared_plan && !j.scaled_by_hand) {
    j.scaled_by_hand = true;
    j.share = "scaled by hand: the shared plan leaves it at the size asked for";
  }
  reply(s, env.id, body);
}

std::optional<std::string> Leader::Impl::resize(JobRec& j, int workers, const std::string& by, json* reply_body) {
  if (j.state() != JobState::kRunning || j.life.target()) {
    return j.id + " is " + std::string(to_string(j.state())) + ": only a running job is resized";
  }
  if (!j.recovery.seed.empty()) return j.id + " is rebuilding its PS state from " + j.recovery.seed + "'s replica";
  for (const auto& t : j.tasks) {
    if (t.kind != TaskKind::kWorker) continue;
    if (t.leaving) return j.id + " is still resizing: " + t.name + " has not left yet";
    if (t.state == TaskState::kExited && t.ok_exit) return j.id + " is finishing: " + t.name + " has finished";
    // A worker that is not running yet has no SIGUSR1 handler, or holds no parameters.
    if (t.state != TaskState::kRunning) return j.id + " is still starting " + t.name;
  }
  const int from = current_workers(j);
  if (workers == from) {
    if (reply_body != nullptr) (*reply_body)["started"] = (*reply_body)["leaving"] = json::array();
    return std::nullopt;  // nothing to do
  }
  events::Resized ev;
  ev.from = from;
  ev.to = workers;
  ev.by = by;
  if (workers > from) {
    // New ranks from..workers-1, each on the agent with the most free cores (or GPUs).
    const Replacing fresh{"", false, {}, j.spec.gpus_per_worker, false};
    const auto where = place_again(agents.slots(), std::vector<Replacing>(static_cast<std::size_t>(workers - from), fresh),
                                   j.spec.threads_per_task);
    if (!where.unplaced.empty()) {
      return "no room for " + std::to_string(workers - from) + " more workers of " + j.id + " (" +
             std::to_string(j.spec.threads_per_task) + " free cores each" +
             (j.spec.gpus_per_worker > 0 ? " and " + std::to_string(j.spec.gpus_per_worker) + " GPUs" : std::string()) +
             "): " + std::to_string(where.unplaced.size()) + " of them do not fit now";
    }
    if (const auto* u = user_options(j.owner)) {
      auto q = admit_quotas();
      if (auto it = q.by_user.find(j.owner); it != q.by_user.end()) {
        auto quota = it->second;
        quota.max_jobs = 0;  // the job runs already
        const auto more = totals(job_needs(0, workers - from, j.spec.threads_per_task, j.spec.gpus_per_worker));
        if (!quota.allows(more)) {
          return "growing " + j.id + " to " + std::to_string(workers) + " workers would take user " + j.owner +
                 " beyond its quota (max_cores = " + std::to_string(u->max_cores) +
                 ", max_gpus = " + std::to_string(u->max_gpus) + ")";
        }
      }
    }
    // A new worker starts in the epoch the others are in: the dispatch hands it that
    // epoch's chunks (ps/dispatch.h), and its learning-rate schedule is where theirs is.
    int epoch = j.spec.epochs;
    for (const auto& t : j.tasks) {
      if (t.kind == TaskKind::kWorker && t.state != TaskState::kExited) epoch = std::min(epoch, t.epochs_done);
    }
    if (epoch >= j.spec.epochs) return j.id + " has trained all its epochs: nothing is left for new workers";
    // The lowest free ranks (a lost agent's workers may have left a gap).
    std::vector<int> ranks;
    for (int r = 0; static_cast<int>(ranks.size()) < workers - from; ++r) {
      const bool used = std::any_of(j.tasks.begin(), j.tasks.end(),
                                    [&](const TaskRec& t) { return t.kind == TaskKind::kWorker && t.index == r; });
      if (!used) ranks.push_back(r);
    }
    const std::size_t first = j.tasks.size();
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      TaskRec t;
      t.name = "worker-" + std::to_string(ranks[k]);
      t.kind = TaskKind::kWorker;
      t.index = ranks[k];
      t.agent = where.placement[k];
      t.gpus = where.gpus[k];
      t.epochs_done = epoch;
      agents.take(t.agent, hold_of(j, t));
      ev.started.push_back(t.name + " on " + t.agent);
      j.tasks.push_back(std::move(t));
    }
    j.spec.workers = workers;
    for (std::size_t i = first; i < j.tasks.size(); ++i) start_worker(j, j.tasks[i]);
  } else if (workers < from) {
    // The highest ranks leave after their current step (ranks may have gaps after a lost
    // agent); rank 0, which evaluates, stays. Recorded before the orders go out.
    std::vector<TaskRec*> live;
    for (auto& t : j.tasks) {
      if (t.kind == TaskKind::kWorker && t.state != TaskState::kExited) live.push_back(&t);
    }
    std::sort(live.begin(), live.end(), [](const TaskRec* a, const TaskRec* b) { return a->index > b->index; });
    live.resize(static_cast<std::size_t>(from - workers));
    for (auto* t : live) {
      t->leaving = true;
      ev.leaving.push_back(t->name);
    }
    j.spec.workers = workers;
    save(j);
    for (auto* t : live) {
      wire::TaskRefBody stop{{}, j.id, t->name, j.generation, {}, 0, true};
      send_agent(t->agent, wire::ControlType::kStopTask, stop.to_json());
    }
  }
  spdlog::info("job {}: resized from {} to {} workers ({}){}{}", j.id, from, workers, by,
               ev.started.empty() ? "" : ", started " + json(ev.started).dump(),
               ev.leaving.empty() ? "" : ", leaving " + json(ev.leaving).dump());
  save(j);
  publish(j, ev.to_json());
  if (reply_body != nullptr) {
    (*reply_body)["started"] = ev.started;
    (*reply_body)["leaving"] = ev.leaving;
  }
  return std::nullopt;
}

bool Leader::Impl::on_worker_left(JobRec& j, TaskRec& t) {
  if (t.kind != TaskKind::kWorker || !t.leaving) return false;
  if (!t.ok_exit) spdlog::warn("job {}: {}, asked to leave, {}", j.id, t.name, t.exit);
  const std::string name = t.name;
  std::erase_if(j.tasks, [&](const TaskRec& x) { return x.name == name; });  // t is gone from here on
  save(j);
  if (j.life.target()) {
    maybe_finish(j);
  } else if (j.state() == JobState::kRecovering) {
    recovery.try_resume(j);
  } else {
    maybe_succeed(j);  // the others may have finished while it was leaving
  }
  try_schedule();  // its cores are free
  return true;
}

namespace {

// The training images of a job: train_samples, else the data set's size where the leader
// knows it (the published figures), else 60,000.
double training_images(const JobSpec& spec) {
  if (spec.train_samples > 0) return static_cast<double>(spec.train_samples);
  return spec.dataset == DatasetKind::kCifar10 ? 50000.0 : 60000.0;
}

// A job the plan may move: elastic, not scaled by hand, not resizing or starting.
bool movable(const JobRec& j) {
  if (!j.spec.elastic.on() || j.scaled_by_hand) return false;
  if (j.state() == JobState::kQueued) return true;
  if (j.state() != JobState::kRunning || j.life.target() || !j.recovery.seed.empty()) return false;
  return std::all_of(j.tasks.begin(), j.tasks.end(), [](const TaskRec& t) {
    return t.kind != TaskKind::kWorker || (t.state == TaskState::kRunning && !t.leaving);
  });
}

}  // namespace

Planning::ShareModels Leader::Impl::plan_model_of(const JobRec& j) const {
  const auto now = std::chrono::steady_clock::now();
  auto& [read, models] = plan_models[j.id];
  if (read == std::chrono::steady_clock::time_point{} || now - read > std::chrono::seconds(60)) {
    read = now;
    try {
      models = planning.share_models(j.spec, j.spec.elastic.max_workers);
    } catch (const std::exception& e) {
      spdlog::warn("job {}: the shared plan assumes linear scaling and no accuracy bound: the planner's models failed: {}",
                   j.id, e.what());
      models = {};
    }
  }
  return models;
}

std::vector<Leader::Impl::SharePool> Leader::Impl::shared_plan_inputs() const {
  // Cores: the free ones, plus those the movable running CPU jobs' workers hold, less the
  // PS cores of the queued movable jobs (they need them to start). GPUs: the free ones,
  // plus those the movable running GPU jobs' workers hold.
  SharePool gpus{"GPUs", 0, {}}, cores{"cores", 0, {}};
  for (const auto& a : agents.slots()) {
    cores.slots += a.free_cores;
    gpus.slots += static_cast<int>(a.free_gpus.size());
  }
  // The per-worker rate of the running jobs (images/s) of each pool, for its queued
  // jobs' estimates: a GPU job's is not a CPU job's.
  double rate_sum[2] = {0, 0};
  int rate_n[2] = {0, 0};
  for (const JobRec* jp : jobs.in_order()) {
    if (jp->state() != JobState::kRunning) continue;
    const int k = jp->spec.gpus_per_worker > 0 ? 1 : 0;
    for (const auto& [rank, ips] : jp->figures.images_per_sec) {
      rate_sum[k] += ips;
      ++rate_n[k];
    }
  }
  for (const JobRec* jp : jobs.in_order()) {
    const auto& j = *jp;
    if (!movable(j)) continue;
    const bool gpu = j.spec.gpus_per_worker > 0;
    auto& pool = gpu ? gpus : cores;
    const double mean_rate = rate_n[gpu ? 1 : 0] > 0 ? rate_sum[gpu ? 1 : 0] / rate_n[gpu ? 1 : 0] : 1000.0;
    ShareJob s;
    s.id = j.id;
    s.owner = j.owner;
    const auto* u = user_options(j.owner);
    s.priority = u != nullptr ? u->priority : 0;
    s.min_workers = j.spec.elastic.min_workers;
    s.slots_per_worker = std::max(1, gpu ? j.spec.gpus_per_worker : j.spec.threads_per_task);
    // A resize costs a new worker's start (measured; twice it, for the leaver's step and
    // the noise), unknown before the job's first worker started.
    if (j.worker_start_seconds > 0) s.resize_cost_s = 2 * j.worker_start_seconds + 1;
    s.max_workers = j.spec.elastic.max_workers;
    const auto model = plan_model_of(j);
    s.speedup = model.speedup;
    // A job with a target accuracy grows no further than the accuracy model allows.
    if (model.accuracy_cap) s.max_workers = std::max(s.min_workers, std::min(s.max_workers, *model.accuracy_cap));
    const double images = training_images(j.spec) * j.spec.epochs;
    if (j.state() == JobState::kRunning) {
      s.workers = j.spec.workers;
      pool.slots += s.workers * s.slots_per_worker;
      // Work left in seconds at one worker: the images left over the rate one worker would
      // have, the measured rate ÷ the speedup at the current size.
      double rate = 0;
      for (const auto& [rank, ips] : j.figures.images_per_sec) rate += ips;
      rate = rate > 0 ? rate / speedup_at(s.speedup, s.workers) : mean_rate;
      s.remaining = std::max(1.0, images * (1.0 - j.progress().value_or(0.0)) / rate);
    } else {
      cores.slots -= j.spec.ps_shards * j.spec.threads_per_task;
      s.remaining = std::max(1.0, images / mean_rate);
    }
    // The deadline counts from submission (docs/planner.md: from start to end,
    // exploration and the queue included).
    if (j.spec.deadline_seconds > 0) s.deadline_left_s = j.spec.deadline_seconds - j.wall_seconds();
    pool.jobs.push_back(s);
  }
  cores.slots = std::max(0, cores.slots);
  return {std::move(gpus), std::move(cores)};
}

Leader::Impl::SharePlanNow Leader::Impl::shared_plan_now() const {
  SharePlanNow now{shared_plan_inputs(), {}};
  auto& gpus = now.pools[0];
  auto& cores = now.pools[1];
  // The GPUs first: the cores their planned starts and grows need (threads_per_task a
  // worker) are not the CPU jobs' to take.
  if (!gpus.jobs.empty()) {
    now.decisions = plan_shares(gpus.jobs, gpus.slots);
    for (const auto& s : gpus.jobs) {
      const int more = now.decisions.at(s.id).workers - s.workers;
      if (more > 0) cores.slots -= more * jobs.at(s.id).spec.threads_per_task;
    }
    cores.slots = std::max(0, cores.slots);
  }
  if (!cores.jobs.empty()) now.decisions.merge(plan_shares(cores.jobs, cores.slots));
  return now;
}

std::optional<std::pair<json, std::string>> Leader::Impl::shared_plan_forecast(const JobRec& j) const {
  if (!opt.shared_plan || !movable(j)) return std::nullopt;
  const auto plan = shared_plan_now().decisions;
  const auto it = plan.find(j.id);
  if (it == plan.end()) return std::nullopt;
  const auto& d = it->second;
  json f = {{"workers", d.workers}, {"reason", d.reason}};
  if (d.workers > 0) f["predicted_seconds"] = std::round(d.finish_s);
  std::string warning;
  if (d.misses_deadline) {
    warning = "its deadline (" + rough_duration(j.spec.deadline_seconds) + ") cannot be met under the current load: " +
              (d.workers > 0 ? "the shared plan gives it " + std::to_string(d.workers) + " workers and predicts " +
                                   rough_duration(d.finish_s) + " to its end"
                             : "the shared plan cannot start it yet (" + d.reason + ")") +
              "; the prediction assumes each worker trains at the running jobs' measured rate (1,000 images/s "
              "when none runs)";
  }
  return std::make_pair(std::move(f), std::move(warning));
}

void Leader::Impl::record_plan_change(const JobRec& j, int from, int to, const std::string& reason) {
  plan_changes.push_back({{"t", unix_now()}, {"job", j.id}, {"owner", j.owner}, {"from", from}, {"to", to},
                          {"reason", reason}});
  while (plan_changes.size() > kPlanChangesKept) plan_changes.pop_front();
}

json Leader::Impl::cluster_plan_json() const {
  json out = {{"shared_plan", opt.shared_plan}};
  json rows = json::array();
  if (opt.shared_plan) {
    const auto now = shared_plan_now();
    out["gpu_slots"] = now.pools[0].slots;
    out["slots"] = now.pools[1].slots;
    for (const auto& pool : now.pools) {
      for (const auto& s : pool.jobs) {
        const auto& d = now.decisions.at(s.id);
        json r = {{"job", s.id},
                  {"owner", s.owner},
                  {"state", to_string(jobs.at(s.id).state())},
                  {"resource", pool.resource},
                  {"slots_per_worker", s.slots_per_worker},
                  {"workers", s.workers},
                  {"planned_workers", d.workers},
                  {"min_workers", s.min_workers},
                  {"max_workers", s.max_workers},
                  {"reason", d.reason},
                  {"misses_deadline", d.misses_deadline}};
        if (d.workers > 0) r["predicted_seconds"] = std::round(d.finish_s);
        if (s.deadline_left_s) r["deadline_left_seconds"] = std::round(*s.deadline_left_s);
        rows.push_back(std::move(r));
      }
    }
  }
  out["jobs"] = std::move(rows);
  json changes = json::array();
  for (const auto& c : plan_changes) changes.push_back(c);
  out["changes"] = std::move(changes);
  return out;
}

void Leader::Impl::replan() {
  std::erase_if(plan_models, [&](const auto& kv) {
    const auto it = jobs.find(kv.first);
    return it == jobs.end() || it->second.terminal();
  });
  const auto now = shared_plan_now();
  std::vector<ShareJob> plan_jobs;
  for (const auto& pool : now.pools) plan_jobs.insert(plan_jobs.end(), pool.jobs.begin(), pool.jobs.end());
  if (plan_jobs.empty()) return;
  const auto& plan = now.decisions;
  for (const auto& s : plan_jobs) {
    const auto& d = plan.at(s.id);
    auto& j = jobs.at(s.id);
    j.share = d.reason + (d.misses_deadline ? " (misses its deadline)" : "");
    j.share_admitted = d.workers > 0;
  }
  const auto resize_to = [&](const ShareJob& s, const ShareDecision& d) {
    auto& j = jobs.at(s.id);
    if (auto why = resize(j, d.workers, "the shared plan: " + d.reason, nullptr)) {
      spdlog::info("job {}: the shared plan's resize to {} waits: {}", s.id, d.workers, *why);
    } else {
      record_plan_change(j, s.workers, d.workers, d.reason);
    }
  };
  // Shrinks first (their leavers free the cores), then the queued jobs' sizes (what
  // admission will place), then grows.
  for (const auto& s : plan_jobs) {
    if (const auto& d = plan.at(s.id); s.workers > 0 && d.workers < s.workers) resize_to(s, d);
  }
  for (const auto& s : plan_jobs) {
    auto& j = jobs.at(s.id);
    const auto& d = plan.at(s.id);
    if (s.workers == 0 && d.workers > 0 && d.workers != j.spec.workers) {
      spdlog::info("job {}: the shared plan starts it with {} workers ({})", j.id, d.workers, d.reason);
      j.spec.workers = d.workers;
      save(j);
    }
  }
  for (const auto& s : plan_jobs) {
    if (const auto& d = plan.at(s.id); s.workers > 0 && d.workers > s.workers) resize_to(s, d);
  }
}

}  // namespace dltrain::leader
