#include "planner/policy.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <cmath>

#include <nlohmann/json.hpp>

#include "common/compression_spec.h"
#include "common/errors.h"
#include "planner/ps_memory.h"

namespace dltrain::planner {

double train_examples(const JobSpec& spec) {
  return spec.train_samples > 0 ? static_cast<double>(spec.train_samples) : 60000.0;
}

PlanRequest plan_request(const JobSpec& spec, const ClusterView& cluster, const PolicyOptions& options,
                         double exploration_seconds, const std::vector<store::Observation>& history) {
  PlanRequest req;
  req.model = enum_name(spec.model);
  req.dataset = dataset_label(spec);
  req.hardware_class = cluster.hardware_class;
  req.ps_shards = spec.ps_shards;
  req.epochs = spec.epochs;
  req.train_examples = static_cast<std::int64_t>(train_examples(spec));
  req.target_accuracy = spec.target_accuracy;
  req.deadline_seconds = spec.deadline_seconds;
  req.exploration_seconds = exploration_seconds;
  req.switch_threshold = options.switch_threshold;
  req.margin_sigmas = options.margin_sigmas;
  req.method_tie = options.method_tie;
  req.method_options = method_options(spec, history);
  req.link_bytes_per_sec = cluster.link_bytes_per_sec;
  req.shards_follow_workers = spec.ps_shards_auto;
  req.auto_shards_cap = cluster.live_agents;
  if (spec.model != ModelKind::kTorchScript) {
    try {
      const int classes = dataset_classes(spec);
      req.tensor_sizes = model_tensor_sizes(spec.model, spec.channels, classes, spec.image_size);
      const int partitions = model_partitions(spec, classes);
      req.auto_shards_cap = req.auto_shards_cap > 0 ? std::min(req.auto_shards_cap, partitions) : partitions;
    } catch (const ConfigError&) {
      // Classes not countable here: the methods' bytes come from their measurements only.
    }
  }
  const auto price = options.prices.find(req.hardware_class);
  req.price_per_task_hour = spec.price_per_task_hour > 0 ? spec.price_per_task_hour
                            : price != options.prices.end() ? price->second
                                                            : 1.0;
  req.task_slots = cluster.task_slots;
  req.requested_workers = spec.workers_auto ? 0 : spec.workers;
  int wmax = cluster.task_slots - spec.ps_shards;
  if (spec.max_workers > 0) wmax = std::min(wmax, spec.max_workers);
  if (spec.workers_auto) {
    for (int w = 1; w <= wmax; ++w) req.worker_options.push_back(w);
  } else if (spec.workers <= wmax) {
    req.worker_options.push_back(spec.workers);
  }
  if (spec.batch_auto) {
    req.batch_options = spec.batch_sizes;
  } else {
    req.batch_options.push_back(spec.batch_size);
  }
  return req;
}

std::vector<MethodOption> method_options(const JobSpec& spec, const std::vector<store::Observation>& history) {
  if (!spec.compression.method_auto) return {method_option(spec.compression)};
  auto options = auto_method_options();
  for (const auto& o : history) {
    if (o.compression != enum_name(compress::Method::kPowerSgd) || o.compression_setting < 1) continue;
    const MethodOption m{compress::Method::kPowerSgd, o.compression_setting};
    if (std::find(options.begin(), options.end(), m) == options.end()) options.push_back(m);
  }
  return options;
}

void apply_method(JobSpec& spec, const MethodOption& m) {
  compress::CompressionSpec c;
  c.method = m.method;
  if (m.method == compress::Method::kPowerSgd) {
    c.rank = static_cast<int>(m.setting);
  } else if (m.method != compress::Method::kNone && m.method != compress::Method::kFp16) {
    c.ratio = m.setting;
  }
  compress::apply_method_defaults(c, spec.epochs, [](const char*) { return false; });
  spec.compression = c;
}

std::vector<store::Observation> relevant_history(std::vector<store::Observation> rows, const JobSpec& spec) {
  if (spec.compression.method_auto) return rows;
  const std::string_view method = enum_name(spec.compression.method);
  std::erase_if(rows, [&](const store::Observation& o) { return o.compression != method; });
  return rows;
}

std::string plan_key(const JobSpec& spec) {
  return "plan/" + std::string(enum_name(spec.model)) + "/" + dataset_label(spec);
}

std::string encode_plan(const Config& c) {
  return nlohmann::json{{"workers", c.workers},
                        {"batch_size", c.batch_size},
                        {"method", enum_name(c.compression.method)},
                        {"setting", c.compression.setting}}
      .dump();
}

Config decode_plan(const std::string& text, const std::string& key) {
  try {
    const auto j = nlohmann::json::parse(text);
    MethodOption m;
    if (j.contains("method")) {
      m.method = parse_enum<compress::Method>(j.at("method").get<std::string>(), key + ".method");
      m.setting = j.at("setting").get<double>();
    }
    return Config{j.at("workers").get<int>(), j.at("batch_size").get<int>(), m};
  } catch (const ConfigError& e) {
    throw ProtocolError("stored plan " + key + " names no known method (" + e.what() + ")");
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError("stored plan " + key + " is not {\"workers\": W, \"batch_size\": B} (" + e.what() + ")");
  }
}

JobSpec exploration_spec(const JobSpec& parent, const std::string& parent_id, const Config& c, int explore_steps) {
  JobSpec p = parent;
  p.name = "profile " + std::to_string(c.workers) + "x" + std::to_string(c.batch_size) +
           (parent.compression.method_auto ? " " + method_label(c.compression) : std::string()) + " for " + parent_id;
  p.workers = c.workers;
  p.batch_size = c.batch_size;
  p.workers_auto = p.batch_auto = false;
  if (parent.compression.method_auto) apply_method(p, c.compression);
  p.epochs = 1;
  p.max_steps = explore_steps;
  p.profile = true;
  p.optimizer.warmup_epochs = 0;
  p.compression.warmup_epochs = 0;
  return p;
}

store::Observation base_observation(const JobSpec& spec, const std::string& job_id, const std::string& hardware_class) {
  store::Observation o;
  o.model = enum_name(spec.model);
  o.dataset = dataset_label(spec);
  o.hardware_class = hardware_class;
  o.job = job_id;
  o.workers = spec.workers;
  o.ps_shards = spec.ps_shards;
  o.batch_size = spec.batch_size;
  o.timestamp = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  o.compression = enum_name(spec.compression.method);
  o.compression_setting = method_option(spec.compression).setting;
  return o;
}

store::Observation epoch_observation(store::Observation o, int epoch, const std::vector<double>& worker_epoch_seconds,
                                     double bytes_this_epoch, const JobSpec& spec, double eval_seconds) {
  o.epoch = epoch;
  o.eval_seconds = eval_seconds;
  for (const double v : worker_epoch_seconds) o.epoch_seconds = std::max(o.epoch_seconds, v);
  o.images_per_sec = o.epoch_seconds > 0 ? train_examples(spec) / o.epoch_seconds : 0.0;
  o.bytes_per_epoch = bytes_this_epoch;
  return o;
}

store::Observation final_observation(store::Observation o, double test_accuracy, int epochs_done, double wall_seconds,
                                     double images_per_sec, double bytes_total) {
  o.final_accuracy = test_accuracy;
  o.epoch = epochs_done;
  o.epoch_seconds = epochs_done > 0 ? wall_seconds / epochs_done : 0;
  o.images_per_sec = images_per_sec;
  o.bytes_per_epoch = epochs_done > 0 ? bytes_total / epochs_done : 0;
  return o;
}

std::optional<store::Observation> profile_observation(store::Observation o, double images_per_sec,
                                                      const JobSpec& spec, double bytes_total) {
  if (images_per_sec <= 0) return std::nullopt;
  o.images_per_sec = images_per_sec;
  o.epoch_seconds = train_examples(spec) / images_per_sec;
  // Each worker trains its share of the epoch, or max_steps batches of it if fewer.
  const double share = std::ceil(train_examples(spec) / std::max(1, spec.workers));
  const double steps = std::min<double>(spec.max_steps > 0 ? spec.max_steps : share, std::ceil(share / spec.batch_size));
  const double images = steps * spec.batch_size * spec.workers;
  double step_bytes = bytes_total;
  if (spec.model != ModelKind::kTorchScript) {
    // Not the steps': every worker's first, dense pull and worker 0's evaluation pull.
    try {
      const auto sizes = model_tensor_sizes(spec.model, spec.channels, dataset_classes(spec), spec.image_size);
      const double floats = std::accumulate(sizes.begin(), sizes.end(), 0.0);
      step_bytes -= 4.0 * floats * (spec.workers + 1);
    } catch (const ConfigError&) {
    }
  }
  if (step_bytes > 0 && images > 0) o.bytes_per_epoch = step_bytes / images * train_examples(spec);
  o.epoch = 0;
  o.source = "profile";
  return o;
}

}  // namespace dltrain::planner
