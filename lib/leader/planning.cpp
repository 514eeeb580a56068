// Planning (leader/planning.h): the leader's adapter to the planner.
#include "leader/planning.h"
#include "leader/persist.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "planner/policy.h"
#include "planner/ps_memory.h"

namespace dltrain::leader {

using json = nlohmann::json;
namespace events = wire::events;

namespace {

planner::PolicyOptions policy_options(const config::AgentOptions& o) {
  return planner::PolicyOptions{o.switch_threshold, o.margin_sigmas, o.prices, o.explore_steps, o.method_tie};
}

}  // namespace

planner::PlanRequest Planning::request_for(const JobSpec& spec, double exploration_seconds,
                                           const std::vector<store::Observation>& history) const {
  const bool gpu = spec.device == Device::kCuda;
  int slots = agents_.task_slots(spec.threads_per_task);
  if (gpu) {
    // Workers of a cuda job are bounded by the GPUs too (a slot: one worker, or a PS shard).
    int gpu_slots = 0;
    for (const auto& a : agents_.capacities()) {
      gpu_slots += static_cast<int>(a.free_gpus.size()) / std::max(1, spec.gpus_per_worker);
    }
    slots = std::min(slots, gpu_slots + spec.ps_shards);
  }
  int live = 0;
  for (const auto& [id, a] : agents_) live += agents_.live(id) ? 1 : 0;
  const planner::ClusterView cluster{agents_.hardware_class(gpu), slots, agents_.slowest_link(), live};
  return planner::plan_request(spec, cluster, policy_options(opt_), exploration_seconds, history);
}

Planning::ShareModels Planning::share_models(const JobSpec& spec, int max_workers) const {
  ShareModels out;
  if (!db_ || max_workers < 1) return out;
  const std::string model(enum_name(spec.model)), dataset(dataset_label(spec));
  const auto history = planner::relevant_history(db_->history(model, dataset), spec);
  if (history.empty()) return out;
  const auto req = request_for(spec, 0, history);
  const planner::Predictors predict(history, req);
  const auto method = planner::method_option(spec.compression);
  // The scaling curve: the epoch-time model between the worker counts measured.
  const auto measured = predict.time_workers();
  if (measured.size() >= 2) {
    const int lo = measured.front(), hi = measured.back();
    std::vector<double> rate(static_cast<std::size_t>(std::max(hi, max_workers)) + 1, 0.0);  // images/s, by workers
    bool known = true;
    for (int w = lo; w <= hi && known; ++w) {
      const auto t = predict.time(planner::Config{w, spec.batch_size, method});
      known = t && t->seconds_per_image > 0;
      if (known) rate[w] = 1.0 / t->seconds_per_image;
    }
    if (known) {
      for (int w = 1; w < lo; ++w) rate[w] = rate[lo] * w / lo;
      for (int w = hi + 1; w <= max_workers; ++w) rate[w] = rate[hi] * w / hi;
      for (int w = 1; w <= max_workers; ++w) out.speedup.push_back(rate[w] / rate[1]);
    }
  }
  // The accuracy bound: the most workers whose global batch reaches the target.
  if (spec.target_accuracy > 0) {
    for (int w = max_workers; w >= 1; --w) {
      const planner::Config c{w, spec.batch_size, method};
      const auto a = predict.accuracy_of(c);
      if (!a) break;
      if (predict.accuracy_beyond_history(c)) continue;
      if (a->value - req.margin_sigmas * predict.accuracy_sigma() >= spec.target_accuracy) {
        out.accuracy_cap = w;
        break;
      }
    }
  }
  return out;
}

std::vector<double> Planning::speedup(const JobSpec& spec, int max_workers) const {
  return share_models(spec, max_workers).speedup;
}

std::optional<int> Planning::accuracy_cap(const JobSpec& spec, int max_workers) const {
  return share_models(spec, max_workers).accuracy_cap;
}

planner::Plan Planning::plan_for(const JobSpec& spec, double exploration_seconds) const {
  const std::string model(enum_name(spec.model)), dataset(dataset_label(spec));
  std::vector<store::Observation> history;
  if (db_) history = planner::relevant_history(db_->history(model, dataset), spec);
  auto req = request_for(spec, exploration_seconds, history);
  if (db_) {
    const std::string key = planner::plan_key(spec);
    if (auto prev = db_->get_meta(key)) {
      try {
        req.previous = planner::decode_plan(*prev, key);
        // A job that names its method keeps it: the previous plan's workers and batch.
        if (!spec.compression.method_auto) req.previous->compression = planner::method_option(spec.compression);
      } catch (const ProtocolError& e) {
        // The plan is only a hint against flapping: plan afresh, and say so.
        spdlog::warn("store: {}; planning {} / {} without a previous plan", e.what(), model, dataset);
      }
    }
  }
  return planner::make_plan(req, history);
}

std::optional<std::string> Planning::ps_memory_problem(const JobSpec& spec) const {
  // A TorchScript model's tensors are known only to the worker that loads it; the leader,
  // without LibTorch, cannot size its PS shards beforehand.
  if (spec.model == ModelKind::kTorchScript) return std::nullopt;
  std::int64_t largest_mb = 0;
  for (const auto& [id, a] : agents_) {
    if (agents_.live(id)) largest_mb = std::max(largest_mb, a.memory_mb);
  }
  if (largest_mb <= 0) return std::nullopt;
  try {
    const auto m = planner::ps_shard_memory(spec, planner::dataset_classes(spec));
    return planner::ps_memory_refusal(spec, m, static_cast<std::uint64_t>(largest_mb) * 1024 * 1024);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
}

void Planning::remember(const JobSpec& spec, const planner::Config& choice) {
  if (!db_) return;
  persist_or_log("saving the plan", [&] { db_->put_meta(planner::plan_key(spec), planner::encode_plan(choice)); });
}

void Planning::record_epoch(JobRec& j, const events::EpochEnd& ev) {
  if (!db_ || j.spec.profile) return;
  std::vector<double> seconds;
  for (const auto& [r, v] : j.figures.epoch_seconds) seconds.push_back(v);
  const double bytes = static_cast<double>(j.bytes_pushed() + j.bytes_pulled());
  auto o = planner::epoch_observation(planner::base_observation(j.spec, j.id, agents_.hardware_class(j.spec.device == Device::kCuda)),
                                            ev.epoch, seconds, bytes - j.bytes.last_bytes, j.spec,
                                            ev.eval_seconds.value_or(0.0));
  o.link_bytes_per_sec = agents_.slowest_link();
  j.bytes.last_bytes = bytes;
  persist_or_log("recording an observation", [&] { db_->add_observation(o); });
}

void Planning::record_final(const JobRec& j) {
  // A resumed job trained only its last epochs: its wall time is not the configuration's.
  if (!db_ || j.resume.epoch > 0) return;
  auto base = planner::base_observation(j.spec, j.id, agents_.hardware_class(j.spec.device == Device::kCuda));
  std::optional<store::Observation> o;
  if (j.spec.profile) {
    double ips = 0;
    for (const auto& [r, v] : j.explore.profile_ips) ips += v;
    o = planner::profile_observation(base, ips, j.spec, static_cast<double>(j.bytes_pushed() + j.bytes_pulled()));
    if (o) o->eval_seconds = j.explore.profile_eval_seconds;
  } else {
    double ips = 0;
    for (const auto& [r, v] : j.figures.images_per_sec) ips += v;
    o = planner::final_observation(base, j.test_accuracy, j.epochs_done, j.wall_seconds(), ips,
                                   static_cast<double>(j.bytes_pushed() + j.bytes_pulled()));
  }
  if (!o) return;
  o->link_bytes_per_sec = agents_.slowest_link();
  persist_or_log("recording an observation", [&] { db_->add_observation(*o); });
}

}  // namespace dltrain::leader
