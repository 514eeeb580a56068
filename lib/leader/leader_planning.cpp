// The leader's adapter to the planner (the second method, docs/planner.md): it hands the
// policy (planner/policy.h) its agents, its store and its jobs, and applies the answer —
// queue an automatic job with the chosen configuration, start its exploration runs, or
// fail it — and writes the history rows its jobs leave behind.
#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/errors.h"
#include "common/secret.h"
#include "planner/policy.h"
#include "planner/ps_memory.h"

namespace dltrain::leader {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace events = wire::events;

namespace {

planner::PolicyOptions policy_options(const config::AgentOptions& o) {
  return planner::PolicyOptions{o.switch_threshold, o.margin_sigmas, o.prices, o.explore_steps};
}

}  // namespace

planner::Plan Leader::Impl::plan_for(const JobSpec& spec, double exploration_seconds) const {
  const bool gpu = spec.device == Device::kCuda;
  int slots = agents.task_slots(spec.threads_per_task);
  if (gpu) {
    // Workers of a cuda job are bounded by the GPUs too (a slot: one worker, or a PS shard).
    int gpu_slots = 0;
    for (const auto& a : agents.capacities()) {
      gpu_slots += static_cast<int>(a.free_gpus.size()) / std::max(1, spec.gpus_per_worker);
    }
    slots = std::min(slots, gpu_slots + spec.ps_shards);
  }
  const planner::ClusterView cluster{agents.hardware_class(gpu), slots};
  auto req = planner::plan_request(spec, cluster, policy_options(opt), exploration_seconds);
  std::vector<store::Observation> history;
  if (db) {
    const std::string model(enum_name(spec.model)), dataset(enum_name(spec.dataset));
    history = planner::relevant_history(db->history(model, dataset), spec);
    const std::string key = planner::plan_key(spec);
    if (auto prev = db->get_meta(key)) {
      try {
        req.previous = planner::decode_plan(*prev, key);
      } catch (const ProtocolError& e) {
        // The plan is only a hint against flapping: plan afresh, and say so.
        spdlog::warn("store: {}; planning {} / {} without a previous plan", e.what(), model, dataset);
      }
    }
  }
  return planner::make_plan(req, history);
}

std::optional<std::string> Leader::Impl::ps_memory_problem(const JobSpec& spec) const {
  // A TorchScript model's tensors are known only to the worker that loads it; the leader,
  // without LibTorch, cannot size its PS shards beforehand.
  if (spec.model == ModelKind::kTorchScript) return std::nullopt;
  std::int64_t largest_mb = 0;
  for (const auto& [id, a] : agents) {
    if (agents.live(id)) largest_mb = std::max(largest_mb, a.memory_mb);
  }
  if (largest_mb <= 0) return std::nullopt;
  try {
    const auto m = planner::ps_shard_memory(spec, planner::dataset_classes(spec));
    return planner::ps_memory_refusal(spec, m, static_cast<std::uint64_t>(largest_mb) * 1024 * 1024);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
}

// Applies a feasible plan to an auto job and queues it; fails it otherwise.
void Leader::Impl::decide(JobRec& j) {
  const auto p = plan_for(j.spec, j.explore.exploration_seconds);
  j.explore.plan = planner::to_json(p);
  ++counters.plans;
  if (!p.feasible) {
    ++counters.infeasible_plans;
    return fail_unplaced(j, "planner: " + p.explanation);
  }
  j.spec.workers = p.choice.workers;
  j.spec.batch_size = p.choice.batch_size;
  if (auto why = ps_memory_problem(j.spec)) {
    return fail_unplaced(j, "planner chose " + std::to_string(p.choice.workers) + " workers, but " + *why);
  }
  persist("saving the plan",
          [&] { db->put_meta(planner::plan_key(j.spec), planner::encode_plan(p.choice)); });
  spdlog::info("job {}: planner chose {} workers x batch {}: {}", j.id, p.choice.workers, p.choice.batch_size,
               p.explanation);
  notify(j, events::PlanDecided{{}, j.explore.plan}.to_json());
  set_state(j, JobState::kQueued);
  enqueue(j);
}

// Starts one exploration run per configuration the planner asked to profile.
void Leader::Impl::explore(JobRec& parent, const std::vector<planner::Config>& configs) {
  set_state(parent, JobState::kExploring);
  for (const auto& c : configs) {
    JobRec p;
    p.num = next_job++;
    p.id = "job-" + std::to_string(p.num);
    p.spec = planner::exploration_spec(parent.spec, parent.id, c, opt.explore_steps);
    p.submitted = Clock::now();
    p.submitted_unix = unix_now();
    p.secret = new_job_secret_hex();
    p.explore.profile_of = parent.id;
    ++counters.exploration_runs;
    parent.explore.pending_profiles.push_back(p.id);
    const std::string id = p.id;
    jobs.emplace(id, std::move(p));
    job_order.push_back(id);
    enqueue(jobs.at(id));
    save(jobs.at(id));
    spdlog::info("job {}: exploring {} workers x batch {} as {}", parent.id, c.workers, c.batch_size, id);
  }
  persist("saving the job counter", [&] { db->put_meta("next_job", std::to_string(next_job)); });
}

void Leader::Impl::record_epoch(JobRec& j, const events::EpochEnd& ev) {
  if (!db || j.spec.profile) return;
  std::vector<double> seconds;
  for (const auto& [r, v] : j.figures.epoch_seconds) seconds.push_back(v);
  const double bytes = static_cast<double>(j.bytes_pushed() + j.bytes_pulled());
  const auto o = planner::epoch_observation(planner::base_observation(j.spec, j.id, agents.hardware_class(j.spec.device == Device::kCuda)),
                                            ev.epoch, seconds, bytes - j.bytes.last_bytes, j.spec,
                                            ev.eval_seconds.value_or(0.0));
  j.bytes.last_bytes = bytes;
  persist("recording an observation", [&] { db->add_observation(o); });
}

void Leader::Impl::record_final(JobRec& j) {
  // A resumed job trained only its last epochs: its wall time is not the configuration's.
  if (!db || j.resume.epoch > 0) return;
  auto base = planner::base_observation(j.spec, j.id, agents.hardware_class(j.spec.device == Device::kCuda));
  std::optional<store::Observation> o;
  if (j.spec.profile) {
    double ips = 0;
    for (const auto& [r, v] : j.explore.profile_ips) ips += v;
    o = planner::profile_observation(base, ips, j.spec);
    if (o) o->eval_seconds = j.explore.profile_eval_seconds;
  } else {
    double ips = 0;
    for (const auto& [r, v] : j.figures.images_per_sec) ips += v;
    o = planner::final_observation(base, j.test_accuracy, j.epochs_done, j.wall_seconds(), ips,
                                   static_cast<double>(j.bytes_pushed() + j.bytes_pulled()));
  }
  if (o) persist("recording an observation", [&] { db->add_observation(*o); });
}

}  // namespace dltrain::leader
