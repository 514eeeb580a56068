// The JSON form of a job (job/job_spec.h: to_json, job_from_json), what the leader stores
// and sends to the tasks: one field list that the writer and the reader both walk.
#include "job/job_spec.h"

#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json_fields.h"

namespace dltrain {

namespace {

// The JSON form's one field list (to_json and job_from_json both walk it). Required
// fields must be present when reading; optional ones keep their defaults when absent
// (keys added after the first release, and the leader-only fields).
enum class Need { kRequired, kOptional };

struct JsonOut {
  nlohmann::json& j;
  template <typename T>
  void operator()(const char* key, const T& v, Need = Need::kRequired) const {
    if constexpr (NamedEnum<T>) {
      j[key] = std::string(enum_name(v));
    } else {
      j[key] = v;
    }
  }
  template <typename T, typename F>
  void nested(const char* key, const T& v, F&& fields, Need = Need::kRequired) const {
    nlohmann::json sub = nlohmann::json::object();
    fields(v, JsonOut{sub});
    j[key] = std::move(sub);
  }
};

struct JsonIn {
  const nlohmann::json& j;
  std::string prefix;  // the dotted path of j ("compression.")
  template <typename T>
  void operator()(const char* key, T& v, Need need = Need::kRequired) const {
    if (need == Need::kOptional && !j.contains(key)) return;
    if constexpr (NamedEnum<T>) {
      v = parse_enum<T>(j.at(key).get<std::string>(), prefix + key);
    } else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<double>>) {
      v.clear();
      for (const auto& e : j.at(key).get_ref<const nlohmann::json::array_t&>()) {
        v.push_back(json_fields::get_value<typename T::value_type>(e));
      }
    } else {
      v = json_fields::get_value<T>(j.at(key));
    }
  }
  template <typename T, typename F>
  void nested(const char* key, T& v, F&& fields, Need need = Need::kRequired) const {
    if (need == Need::kOptional && !j.contains(key)) return;
    fields(v, JsonIn{j.at(key), prefix + key + "."});
  }
};

template <typename S, typename V>
void optimizer_fields(S& o, V&& v) {
  v("lr", o.lr), v("momentum", o.momentum), v("weight_decay", o.weight_decay), v("lr_schedule", o.lr_schedule),
      v("warmup_epochs", o.warmup_epochs);
}

template <typename S, typename V>
void checkpoint_fields(S& c, V&& v) {
  v("every_epochs", c.every_epochs), v("best", c.best);
}

template <typename S, typename V>
void compression_fields(S& c, V&& v) {
  v("method", c.method), v("method_auto", c.method_auto, Need::kOptional), v("ratio", c.ratio), v("downlink_ratio", c.downlink_ratio),
      v("warmup_epochs", c.warmup_epochs), v("momentum", c.momentum), v("clip_norm", c.clip_norm),
      v("sample_ratio", c.sample_ratio), v("min_compress_bytes", c.min_compress_bytes, Need::kOptional),
      v("warmup_schedule", c.warmup_schedule, Need::kOptional), v("rank", c.rank, Need::kOptional);
}

template <typename S, typename V>
void augment_fields(S& a, V&& v) {
  v("crop_padding", a.crop_padding), v("horizontal_flip", a.horizontal_flip),
      v("random_resized_crop", a.random_resized_crop), v("scale_min", a.scale_min), v("scale_max", a.scale_max),
      v("ratio_min", a.ratio_min), v("ratio_max", a.ratio_max);
}

template <typename S, typename V>
void job_fields(S& s, V&& v) {
  constexpr auto opt = Need::kOptional;
  v("name", s.name), v("model", s.model), v("dataset", s.dataset), v("data_dir", s.data_dir), v("epochs", s.epochs),
      v("data", s.data, opt),
      v("workers", s.workers), v("ps_shards", s.ps_shards), v("batch_size", s.batch_size),
      v("threads_per_task", s.threads_per_task), v("sync", s.sync), v("seed", s.seed),
      v("train_samples", s.train_samples), v("test_samples", s.test_samples), v("partition_size", s.partition_size),
      v("ps_timeout_seconds", s.ps_timeout_seconds, opt), v("staleness", s.staleness, opt),
      v("backup_workers", s.backup_workers, opt), v("barrier_timeout_seconds", s.barrier_timeout_seconds, opt),
      v("overlap", s.overlap, opt), v("device", s.device, opt), v("gpus_per_worker", s.gpus_per_worker, opt),
      v("local_group", s.local_group, opt), v("eval_batch_size", s.eval_batch_size, opt),
      v("model_file", s.model_file, opt), v("model_sha256", s.model_sha256, opt), v("init_from", s.init_from, opt),
      v("init_sha256", s.init_sha256, opt);
  v.nested("optimizer", s.optimizer, [](auto& o, auto&& w) { optimizer_fields(o, w); });
  v.nested("compression", s.compression, [](auto& c, auto&& w) { compression_fields(c, w); }, opt);
  v.nested("checkpoint", s.checkpoint, [](auto& c, auto&& w) { checkpoint_fields(c, w); }, opt);
  v.nested("elastic", s.elastic, [](auto& e, auto&& w) { w("min_workers", e.min_workers), w("max_workers", e.max_workers); }, opt);
  v("workers_auto", s.workers_auto, opt), v("batch_auto", s.batch_auto, opt), v("ps_shards_auto", s.ps_shards_auto, opt),
      v("partition_size_auto", s.partition_size_auto, opt),
      v("target_accuracy", s.target_accuracy, opt), v("deadline_seconds", s.deadline_seconds, opt),
      v("queue_timeout_seconds", s.queue_timeout_seconds, opt),
      v("batch_sizes", s.batch_sizes, opt), v("max_workers", s.max_workers, opt),
      v("price_per_task_hour", s.price_per_task_hour, opt), v("max_steps", s.max_steps, opt),
      v("profile", s.profile, opt);
  // Data fields added with the CIFAR-10 and ImageFolder data sets: a job stored before
  // them keeps the IDX defaults (job_from_json fills image_size and channels).
  v("image_size", s.image_size, opt), v("channels", s.channels, opt), v("mean", s.mean, opt), v("std", s.std, opt),
      v("loader_threads", s.loader_threads, opt), v("loader_queue", s.loader_queue, opt),
      v("loader_cache_mb", s.loader_cache_mb, opt);
  v.nested("augment", s.augment, [](auto& a, auto&& w) { augment_fields(a, w); }, opt);
}

}  // namespace

void to_json(nlohmann::json& j, const JobSpec& s) {
  j = nlohmann::json::object();
  job_fields(s, JsonOut{j});
}

JobSpec job_from_json(const nlohmann::json& j) {
  try {
    JobSpec s;
    job_fields(s, JsonIn{j, ""});
    validate_job(s);
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("job", std::string("malformed job JSON: ") + e.what());
  }
}

void from_json(const nlohmann::json& j, JobSpec& spec) { spec = job_from_json(j); }

}  // namespace dltrain
