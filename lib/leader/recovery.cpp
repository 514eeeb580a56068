// The leader's recovery (recovery.h): lost tasks and agents, re-assignment, restore and
// adoption.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/recovery.h"
#include "common/errors.h"

namespace dltrain::leader {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace events = wire::events;

namespace {

// "worker-1 local-2 -> local-3, ps-0 ..." for the log.
std::string ra_moved_text(const std::vector<events::Move>& moved) {
  std::string s;
  for (const auto& m : moved) s += (s.empty() ? "" : ", ") + m.task + " " + m.from + " -> " + m.to;
  return s;
}

}  // namespace

void Recovery::restore(const store::Store& db, JobTable& jobs) {
  for (auto& [num, r] : db.jobs()) {
    JobRec j;
    try {
      j = job_from_record(num, r);
    } catch (const std::exception& e) {
      spdlog::error("store: job job-{} has an unreadable record ({}); skipped", num, e.what());
      continue;
    }
    if (!j.terminal()) {
      try {
        resume_after_restart(j, r);
      } catch (const std::exception& e) {
        j.error = "the leader restarted and could not read this job's stored state (" + std::string(e.what()) + ")";
        j.life.fail_restored();  // not live yet: no transition, no followers
        j.tasks.clear();
        actions_.save(j);
      }
    }
    jobs.restore(std::move(j));
  }
  if (auto n = db.get_meta("next_job")) jobs.raise_next(std::stoull(*n));
  // An exploring job waits for its exploration runs that are still unfinished.
  for (JobRec* jp : jobs.in_order()) {
    auto& j = *jp;
    if (j.explore.profile_of.empty() || j.terminal()) continue;
    auto pit = jobs.find(j.explore.profile_of);
    if (pit != jobs.end() && pit->second.state() == JobState::kExploring) pit->second.explore.pending_profiles.push_back(j.id);
  }
  for (JobRec* jp : jobs.in_order()) {
    auto& j = *jp;
    if (j.state() == JobState::kExploring && j.explore.pending_profiles.empty()) {
      actions_.fail_unplaced(
          j, "the leader restarted while the job was exploring and its exploration runs are gone; submit it again");
    }
  }
  spdlog::info("store {}: {} jobs and {} history rows restored", db.location(), jobs.size(), db.history().size());
}

// The restored form of an unfinished job (called by restore()).
void Recovery::resume_after_restart(JobRec& j, const json& r) {
  resume_stored_counters(j, r);
  if (j.state() == JobState::kQueued || j.state() == JobState::kPlanning) {
    j.life.move_to(JobState::kQueued);  // not live yet: no followers to tell
    actions_.enqueue(j);
    spdlog::info("job {} ({}) is queued again", j.id, j.spec.name);
  } else if (j.state() != JobState::kExploring) {
    j.recovery.adopt_until = Clock::now() + adoption_window();
    spdlog::info("job {} ({}) was {} (generation {}): waiting up to {} ms for its agents to re-report its tasks",
                 j.id, j.spec.name, to_string(j.state()), j.generation, adoption_window().count());
    actions_.log_event(j, events::LeaderRestarted{{}, std::string(to_string(j.state())), j.generation}.to_json());
  }
}

// ---------------------------------------------------------------- re-assignment
void Recovery::tasks_lost(JobRec& j, const std::string& why) {
  if (j.terminal()) return;
  if (j.life.target().has_value()) return actions_.maybe_finish(j);
  if (j.state() == JobState::kRecovering) return try_resume(j);
  if (j.state() != JobState::kRunning && j.state() != JobState::kStarting) return actions_.fail_job(j, why);
  if (j.recovery.reassignments >= opt_.max_reassignments) {
    return actions_.fail_job(j, why + "; the job was already re-assigned " + std::to_string(j.recovery.reassignments) +
                           " times (task_max_restarts)");
  }
  j.recovery.reason = why;
  j.recovery.since = Clock::now();
  j.recovery.waiting_logged = false;
  spdlog::warn("job {}: {}; stopping its other tasks to re-assign it as generation {}", j.id, why,
               j.generation + 1);
  actions_.set_state(j, JobState::kRecovering);
  actions_.publish(j, events::Recovering{{}, why, j.generation}.to_json());
  actions_.send_stops(j);
  try_resume(j);
}

void Recovery::try_resume(JobRec& j) {
  if (j.state() != JobState::kRecovering || !j.recovery.since) return;
  const auto now = Clock::now();
  const auto stop_bound = opt_.task_stop_grace + 2 * opt_.heartbeat_timeout;
  for (auto& t : j.tasks) {
    if (t.state == TaskState::kExited) continue;
    const bool live = agents_.live(t.agent);
    if (live && now - *j.recovery.since < stop_bound) return;  // its exit is on the way
    actions_.set_task_state(j, t, TaskState::kExited);
    t.exit = live ? "did not report that it stopped" : "lost with its agent";
    if (live) {
      // Its process may still run (and hold its GPUs): an orphan until its exit comes.
      agents_.at(t.agent).orphans[orphan_key(j.id, t.name, j.generation)] = actions_.hold_of(j, t);
    } else {
      agents_.release(t.agent, actions_.hold_of(j, t));
    }
  }
  // Tasks stay on their agent where it is alive; the others go to the live agent with
  // the most free cores. Workers that finished are not run again.
  const int need = j.spec.threads_per_task;
  const auto slots = agents_.slots();
  std::vector<Replacing> want;
  for (const auto& t : j.tasks) {
    // A worker that finished, or that was leaving an elastic job, is not run again.
    Replacing r{t.agent, t.kind == TaskKind::kWorker && (t.ok_exit || t.leaving), {},
                t.kind == TaskKind::kWorker ? j.spec.gpus_per_worker : 0,
                t.kind == TaskKind::kWorker && j.spec.dataset == DatasetKind::kShards};
    for (const auto& a : slots) {
      if (agents_.holds_orphan(a.id, j.id, t.name)) r.excluded.push_back(a.id);
    }
    want.push_back(std::move(r));
  }
  const Replacement where = place_again(slots, want, need);
  const auto& placement = where.placement;
  std::vector<std::string> unplaced;
  for (const auto i : where.unplaced) unplaced.push_back(j.tasks[i].name);
  if (!unplaced.empty()) {
    std::string names;
    for (auto& n : unplaced) names += (names.empty() ? "" : ", ") + n;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - *j.recovery.since);
    if (waited >= opt_.reassign_timeout) {
      const std::string room = j.spec.gpus_per_worker > 0
                                   ? std::to_string(need) + " free cores (and " +
                                         std::to_string(j.spec.gpus_per_worker) + " free GPUs for a worker)"
                                   : "free cores";
      return actions_.fail_job(j, j.recovery.reason + "; no agent had " + room + " for " + names + " within " +
                             fmt::format("{:g}", opt_.reassign_timeout.count() / 1000.0) +
                             " s (reassign_timeout)");
    }
    if (!j.recovery.waiting_logged) {
      j.recovery.waiting_logged = true;
      spdlog::warn("job {}: no agent has {} free cores{} for {}; waiting up to {} ms for one", j.id, need,
                   j.spec.gpus_per_worker > 0 ? " (and " + std::to_string(j.spec.gpus_per_worker) + " GPUs per worker)"
                                              : std::string(),
                   names, opt_.reassign_timeout.count());
      actions_.publish(j, events::WaitingForAgent{{}, unplaced, opt_.reassign_timeout.count()}.to_json());
    }
    return;
  }
  resume(j, placement, where.gpus);
}

void Recovery::resume(JobRec& j, const std::vector<std::string>& placement,
                          const std::vector<std::vector<int>>& gpus) {
  const std::uint32_t old_gen = j.generation;
  // A shard restores the checkpoint it wrote when it was stopped where it stays; one that
  // moves, or that did not stop cleanly, starts empty and must be rebuilt.
  bool rebuild = false;
  for (std::size_t i = 0; i < j.tasks.size(); ++i) {
    const auto& t = j.tasks[i];
    rebuild |= t.kind == TaskKind::kPs && !(t.ok_exit && placement[i] == t.agent);
  }
  // If so, from the freshest replica: the stopped worker (staying on its agent, where its
  // file is) whose parameters last came from the PS.
  std::string seed;
  std::uint32_t seed_generation = 0;
  double freshest = -1;
  for (std::size_t i = 0; i < j.tasks.size() && rebuild; ++i) {
    const auto& t = j.tasks[i];
    if (t.kind != TaskKind::kWorker || placement[i] != t.agent || !t.replica || !t.replica->path) {
      continue;
    }
    const double at = t.replica->pulled_at.value_or(0.0);
    if (at > freshest) {
      freshest = at;
      seed = t.name;
      seed_generation = t.replica_generation;
    }
  }
  std::vector<events::Move> moved;
  std::vector<std::uint32_t> done_ranks;
  std::vector<TaskRec> next;
  for (std::size_t i = 0; i < j.tasks.size(); ++i) {
    const auto& old = j.tasks[i];
    if (old.kind == TaskKind::kWorker && old.leaving) continue;  // it was leaving: it is gone
    if (old.kind == TaskKind::kWorker && old.ok_exit) {
      next.push_back(old);
      done_ranks.push_back(static_cast<std::uint32_t>(old.index));
      continue;
    }
    TaskRec t;
    t.name = old.name;
    t.kind = old.kind;
    t.index = old.index;
    t.agent = placement[i];
    t.gpus = gpus[i];
    t.epochs_done = old.epochs_done;
    if (t.agent == old.agent) {
      // Still there: should this generation be re-assigned before the worker saves a
      // newer one, the replica it saved earlier can still rebuild a lost shard.
      t.replica = old.replica;
      t.replica_generation = old.replica_generation;
    }
    // A shard restores the checkpoint it wrote when it was stopped, where it stays.
    if (old.kind == TaskKind::kPs && old.ok_exit && old.agent == t.agent) t.recovery = "checkpoint";
    if (t.agent != old.agent) moved.push_back(events::Move{{}, t.name, old.agent, t.agent});
    agents_.take(t.agent, actions_.hold_of(j, t));
    next.push_back(std::move(t));
  }
  j.close_generation_bytes();
  j.tasks = std::move(next);
  j.generation = old_gen + 1;
  ++j.recovery.reassignments;
  j.recovery.seed = seed;
  j.recovery.seed_generation = seed_generation;
  j.recovery.since.reset();
  spdlog::warn("job {}: re-assigned as generation {} ({}); {}", j.id, j.generation,
               moved.empty() ? std::string("no task moved") : "moved " + ra_moved_text(moved),
               seed.empty() ? std::string("no worker replica") : "rebuilding lost shard state from " + seed + "'s replica");
  events::Reassigned ra;
  ra.generation = j.generation;
  ra.moved = moved;
  ra.reason = j.recovery.reason;
  if (!seed.empty()) ra.replica_from = seed;
  actions_.publish(j, ra.to_json());
  actions_.set_state(j, JobState::kStarting);
  for (auto& t : j.tasks) {
    if (t.kind != TaskKind::kPs) continue;
    wire::StartTaskBody body;
    body.workers_done = done_ranks;
    if (t.recovery == "checkpoint") body.restore_generation = old_gen;
    t.recovery.clear();
    actions_.start_task(j, t, std::move(body));
  }
}

// A restored job's agents have registered again, or the adoption window has passed.
void Recovery::after_adoption(JobRec& j) {
  j.recovery.adopt_until.reset();
  if (j.terminal()) return;
  std::string missing = j.recovery.adopt_lost;
  j.recovery.adopt_lost.clear();
  for (auto& t : j.tasks) {
    if ((t.state == TaskState::kStarting || t.state == TaskState::kRunning) && !agents_.live(t.agent)) {
      actions_.set_task_state(j, t, TaskState::kExited);
      t.exit = "its agent did not come back after the leader restarted";
      missing += (missing.empty() ? "" : ", ") + t.name + " on " + t.agent;
    }
  }
  spdlog::info("job {}: adopted after the leader restart{}", j.id, missing.empty() ? "" : "; lost: " + missing);
  if (j.life.target().has_value()) return actions_.stop_tasks(j);
  if (j.state() == JobState::kRecovering) {
    j.recovery.since = Clock::now();
    actions_.send_stops(j);
    return try_resume(j);
  }
  std::string unstarted;
  for (const auto& t : j.tasks) {
    if (t.kind == TaskKind::kWorker && t.state == TaskState::kExited && t.exit == "never started") unstarted += " " + t.name;
  }
  if (j.state() == JobState::kStarting || !unstarted.empty()) {
    // The leader died between the shards' and the workers' start (or, after a
    // re-assignment, before every worker was started): begin again.
    return tasks_lost(j, "the leader restarted while the job was starting" +
                             (missing.empty() ? std::string() : " (lost: " + missing + ")"));
  }
  if (!missing.empty()) tasks_lost(j, "the leader restarted and " + missing + " did not come back");
}

void Recovery::agent_lost(const std::string& id, const std::string& why, const std::vector<JobRec*>& jobs) {
  auto it = agents_.find(id);
  if (it == agents_.end() || it->second.lost) return;
  it->second.lost = true;
  spdlog::warn("agent {} lost: {}", id, why);
  for (JobRec* jp : jobs) {
    auto& j = *jp;
    if (j.terminal()) continue;
    std::vector<std::string> lost;
    for (auto& t : j.tasks) {
      if (t.agent == id && t.state != TaskState::kExited) {
        actions_.set_task_state(j, t, TaskState::kExited);
        t.exit = "lost with its agent";
        agents_.release(id, actions_.hold_of(j, t));
        lost.push_back(t.name);
      }
    }
    if (lost.empty()) continue;
    const std::string what = "agent " + id + " was lost (" + why + ")";
    if (!shrink_elastic(j, lost, what)) tasks_lost(j, what);
  }
}

bool Recovery::shrink_elastic(JobRec& j, const std::vector<std::string>& lost, const std::string& why) {
  if (!j.spec.elastic.on() || j.state() != JobState::kRunning || j.life.target()) return false;
  const auto is_lost = [&](const TaskRec& t) { return std::find(lost.begin(), lost.end(), t.name) != lost.end(); };
  int remaining = 0;
  for (const auto& t : j.tasks) {
    if (is_lost(t) && (t.kind != TaskKind::kWorker || t.index == 0)) return false;  // a shard, or the evaluating rank
    if (!is_lost(t) && t.kind == TaskKind::kWorker && t.state != TaskState::kExited && !t.leaving) ++remaining;
  }
  if (remaining < j.spec.elastic.min_workers) return false;
  int from = remaining;
  for (const auto& t : j.tasks) from += (is_lost(t) && !t.leaving) ? 1 : 0;
  std::erase_if(j.tasks, is_lost);
  j.spec.workers = remaining;
  spdlog::warn("job {}: {}; its elastic job goes on with {} workers instead of being re-assigned", j.id, why, remaining);
  wire::events::Resized ev;
  ev.from = from;
  ev.to = remaining;
  ev.by = why;
  for (const auto& n : lost) ev.leaving.push_back(n);
  actions_.save(j);
  actions_.publish(j, ev.to_json());
  return true;
}

void Recovery::tasks_gone(JobRec& j, const std::string& why) {
  if (adopting(j)) {
    j.recovery.adopt_lost += (j.recovery.adopt_lost.empty() ? "" : "; ") + why;
  } else {
    tasks_lost(j, why);
  }
}

void Recovery::agent_back(JobRec& j) {
  if (!adopting(j) || j.terminal()) return;
  const bool all_back = std::all_of(j.tasks.begin(), j.tasks.end(), [&](const TaskRec& t) {
    return t.state == TaskState::kExited || agents_.live(t.agent);
  });
  if (all_back) after_adoption(j);
}

void Recovery::tick(JobRec& j, Clock::time_point now) {
  if (j.recovery.adopt_until && now >= *j.recovery.adopt_until) after_adoption(j);
  try_resume(j);
}

bool Recovery::seed_started(JobRec& j, const TaskRec& t) {
  if (t.kind != TaskKind::kWorker || t.name != j.recovery.seed || j.state() != JobState::kRunning) return false;
  j.recovery.seed.clear();
  return true;
}

}  // namespace dltrain::leader
