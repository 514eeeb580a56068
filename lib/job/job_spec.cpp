#include "job/job_spec.h"

#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json_fields.h"
#include "common/toml_fields.h"
#include "data/cifar10.h"
#include "data/imagefolder.h"

namespace dltrain {
namespace {

using toml_fields::get_choice;
using toml_fields::get_double;
using toml_fields::get_int;
using toml_fields::get_string;
using toml_fields::get_table;

void parse_optimizer(const toml::table& t, OptimizerSpec& o) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string f = "optimizer." + k;
    if (k == "lr") {
      o.lr = get_double(node, f, 0.0, 10.0, true, false);
    } else if (k == "momentum") {
      o.momentum = get_double(node, f, 0.0, 1.0, false, true);
    } else if (k == "weight_decay") {
      o.weight_decay = get_double(node, f, 0.0, 1.0, false, true);
    } else if (k == "lr_schedule") {
      o.lr_schedule = get_choice(node, f, {"constant", "cosine", "step"});
    } else if (k == "warmup_epochs") {
      o.warmup_epochs = get_double(node, f, 0.0, 1000.0, false, false);
    } else {
      throw ConfigError(f, "unknown key (expected lr, momentum, weight_decay, lr_schedule, "
                           "warmup_epochs)");
    }
  }
}

// A [lo, hi] pair of positive numbers (augment.scale, augment.ratio).
std::pair<double, double> get_range(const toml::node& n, const std::string& f, double lo, double hi) {
  if (!n.is_array() || n.as_array()->size() != 2) throw ConfigError(f, "expected an array of two numbers [min, max]");
  const double a = get_double(*n.as_array()->get(0), f, lo, hi, true, false);
  const double b = get_double(*n.as_array()->get(1), f, lo, hi, true, false);
  if (a > b) throw ConfigError(f, "min must not exceed max");
  return {a, b};
}

void parse_augment(const toml::table& t, data::AugmentSpec& a) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string f = "augment." + k;
    if (k == "crop_padding") {
      a.crop_padding = static_cast<int>(get_int(node, f, 0, 64));
    } else if (k == "horizontal_flip") {
      a.horizontal_flip = toml_fields::get_bool(node, f);
    } else if (k == "random_resized_crop") {
      a.random_resized_crop = toml_fields::get_bool(node, f);
    } else if (k == "scale") {
      std::tie(a.scale_min, a.scale_max) = get_range(node, f, 0.0, 1.0);
    } else if (k == "ratio") {
      std::tie(a.ratio_min, a.ratio_max) = get_range(node, f, 0.0, 100.0);
    } else {
      throw ConfigError(f, "unknown key (expected crop_padding, horizontal_flip, random_resized_crop, scale, ratio)");
    }
  }
}

std::vector<double> get_channel_values(const toml::node& n, const std::string& f, bool positive) {
  if (!n.is_array() || n.as_array()->empty() || n.as_array()->size() > 3) {
    throw ConfigError(f, "expected an array with one number per channel, e.g. [0.5] or [0.485, 0.456, 0.406]");
  }
  std::vector<double> out;
  for (auto&& e : *n.as_array()) out.push_back(get_double(e, f, positive ? 0.0 : -1e3, 1e3, positive, false));
  return out;
}

}  // namespace

void apply_data_defaults(JobSpec& s) {
  const bool idx = is_idx_dataset(s.dataset);
  if (s.image_size == 0) s.image_size = idx ? 28 : s.dataset == "cifar10" ? 32 : 224;
  if (s.channels == 0) s.channels = idx ? 1 : 3;
  for (const auto* v : {&s.mean, &s.std}) {
    if (!v->empty() && static_cast<int>(v->size()) != s.channels) {
      throw ConfigError(v == &s.mean ? "mean" : "std", "expected " + std::to_string(s.channels) +
                                                           " values (one per channel; channels = " +
                                                           std::to_string(s.channels) + "), got " +
                                                           std::to_string(v->size()));
    }
  }
  if (s.compression.min_compress_bytes > 0 && s.compression.method != compress::Method::kTopk &&
      s.compression.method != compress::Method::kDgc) {
    throw ConfigError("compression.min_compress_bytes", "applies only to method = \"topk\" or \"dgc\" (this job has "
                                                        "method = \"" + compress::to_string(s.compression.method) + "\")");
  }
  if (s.mean.empty() != s.std.empty()) {
    throw ConfigError(s.mean.empty() ? "mean" : "std", "give mean and std together (or neither: computed on a sample)");
  }
  if (s.augment.crop_padding > 0 && s.augment.crop_padding >= s.image_size) {
    throw ConfigError("augment.crop_padding", "must be less than image_size (" + std::to_string(s.image_size) + ")");
  }
}

bool is_idx_dataset(const std::string& dataset) { return dataset == "fashion-mnist" || dataset == "mnist"; }

namespace {

// The fields of the consistency models, which depend on sync and on each other.
void check_sync_fields(const JobSpec& s, bool staleness_given) {
  const auto only_for = [&](const char* field, const char* mode) {
    return ConfigError(field, std::string("applies only to sync = \"") + mode + "\" (this job has sync = \"" + s.sync +
                                  "\")");
  };
  if (staleness_given && s.sync != "ssp") throw only_for("staleness", "ssp");
  if (s.backup_workers > 0) {
    if (s.sync != "sync") throw only_for("backup_workers", "sync");
    if (s.workers_auto) throw ConfigError("backup_workers", "needs a fixed number of workers, not workers = \"auto\"");
    if (s.backup_workers >= s.workers) {
      throw ConfigError("backup_workers", "must be less than workers (" + std::to_string(s.workers) + "), got " +
                                              std::to_string(s.backup_workers));
    }
  }
  if (s.overlap && s.compression.clip_norm > 0) {
    throw ConfigError("overlap", "not with compression.clip_norm > 0: clipping needs the whole gradient's norm "
                                 "before any partition may be pushed");
  }
  if (s.barrier_timeout_seconds > 0) {
    if (s.sync == "async") {
      throw ConfigError("ps.barrier_timeout", "applies only to sync = \"ssp\" or \"sync\" (this job has sync = \"async\")");
    }
    if (s.barrier_timeout_seconds >= s.ps_timeout_seconds) {
      std::ostringstream os;
      os << "must be less than ps.timeout (" << s.ps_timeout_seconds << " s), or the workers give up first; got "
         << s.barrier_timeout_seconds << " s";
      throw ConfigError("ps.barrier_timeout", os.str());
    }
  }
}

// device, gpus_per_worker and local_group (docs/gpu.md).
void check_device_fields(JobSpec& s, bool gpus_given) {
  if (s.device == "cpu") {
    if (gpus_given) throw ConfigError("gpus_per_worker", "applies only to device = \"cuda\" (this job has device = \"cpu\")");
    s.gpus_per_worker = 0;
  } else if (!gpus_given) {
    s.gpus_per_worker = 1;
  }
  if (s.local_group) {
    if (s.sync != "async") {
      throw ConfigError("local_group", "needs sync = \"async\" (this job has sync = \"" + s.sync +
                                           "\"): a group pushes as one worker, which the PS's step accounting of "
                                           "ssp and sync (a barrier, a staleness bound) would not know of");
    }
    if (s.overlap) {
      throw ConfigError("local_group", "not with overlap = true: the group sums whole gradients before its push");
    }
    if (s.compression.clip_norm > 0) {
      throw ConfigError("local_group", "not with compression.clip_norm > 0: member 0 pushes the sum of the group's "
                                       "gradients, which one worker's clipping bound would cut");
    }
  }
}

}  // namespace

double effective_barrier_timeout(const JobSpec& spec) {
  return spec.barrier_timeout_seconds > 0 ? spec.barrier_timeout_seconds : spec.ps_timeout_seconds / 2;
}

JobSpec parse_job_toml(const std::string& text, const std::string& base_dir, bool check_files) {
  const toml::table root = toml_fields::parse(text);
  if (root.empty()) throw ConfigError("", "the job file is empty: it needs at least a model and its data");
  JobSpec s;
  bool staleness_given = false;
  bool gpus_given = false;
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "name") {
      s.name = get_string(node, k);
      if (s.name.size() > kMaxJobNameLength) {
        throw ConfigError(k, "at most " + std::to_string(kMaxJobNameLength) + " characters, got " +
                                 std::to_string(s.name.size()));
      }
    } else if (k == "model") {
      s.model = get_choice(node, k, {"cnn", "mlp", "mlp-large", "resnet20", "resnet18"});
    } else if (k == "dataset") {
      s.dataset = get_choice(node, k, {"fashion-mnist", "mnist", "cifar10", "imagefolder"});
    } else if (k == "image_size") {
      s.image_size = static_cast<int>(get_int(node, k, 8, 1024));
    } else if (k == "channels") {
      s.channels = static_cast<int>(get_int(node, k, 1, 3));
      if (s.channels == 2) throw ConfigError(k, "expected 1 (gray) or 3 (RGB), got 2");
    } else if (k == "mean") {
      s.mean = get_channel_values(node, k, false);
    } else if (k == "std") {
      s.std = get_channel_values(node, k, true);
    } else if (k == "loader_threads") {
      s.loader_threads = static_cast<int>(get_int(node, k, 0, 64));
    } else if (k == "loader_queue") {
      s.loader_queue = static_cast<int>(get_int(node, k, 0, 1024));
    } else if (k == "loader_cache_mb") {
      s.loader_cache_mb = get_int(node, k, 0, std::int64_t{1} << 20);
    } else if (k == "augment") {
      parse_augment(get_table(node, k), s.augment);
    } else if (k == "data_dir") {
      s.data_dir = get_string(node, k);
      if (s.data_dir.size() > kMaxPathLength) {
        throw ConfigError(k, "at most " + std::to_string(kMaxPathLength) + " bytes, got " +
                                 std::to_string(s.data_dir.size()));
      }
    } else if (k == "epochs") {
      s.epochs = static_cast<int>(get_int(node, k, 1, 1000));
    } else if (k == "workers") {
      if (node.is_string() && *node.value<std::string>() == "auto") {
        s.workers_auto = true;
      } else {
        s.workers = static_cast<int>(get_int(node, k, 1, 1024));
      }
    } else if (k == "ps_shards") {
      s.ps_shards = static_cast<int>(get_int(node, k, 1, 256));
    } else if (k == "batch_size") {
      if (node.is_string() && *node.value<std::string>() == "auto") {
        s.batch_auto = true;
      } else {
        s.batch_size = static_cast<int>(get_int(node, k, 1, 65536));
      }
    } else if (k == "target_accuracy") {
      s.target_accuracy = get_double(node, k, 0.0, 1.0, true, false);
    } else if (k == "queue_timeout") {
      s.queue_timeout_seconds = toml_fields::get_duration(node, k, "10m");
      if (s.queue_timeout_seconds < 1 || s.queue_timeout_seconds > 30 * 86400.0) {
        throw ConfigError(k, "expected a duration in [1s, 30d], got \"" + *node.value<std::string>() + "\"");
      }
    } else if (k == "deadline") {
      s.deadline_seconds = toml_fields::get_duration(node, k, "30m");
      if (s.deadline_seconds <= 0) throw ConfigError(k, "must be positive");
    } else if (k == "planner") {
      for (auto&& [pk, pn] : get_table(node, k)) {
        const std::string f = "planner." + std::string(pk.str());
        if (pk.str() == "batch_sizes") {
          if (!pn.is_array() || pn.as_array()->empty()) throw ConfigError(f, "expected a non-empty array of integers");
          if (pn.as_array()->size() > kMaxBatchSizes) {
            throw ConfigError(f, "at most " + std::to_string(kMaxBatchSizes) + " batch sizes, got " +
                                     std::to_string(pn.as_array()->size()));
          }
          s.batch_sizes.clear();
          for (auto&& e : *pn.as_array()) s.batch_sizes.push_back(static_cast<int>(get_int(e, f, 1, 65536)));
        } else if (pk.str() == "max_workers") {
          s.max_workers = static_cast<int>(get_int(pn, f, 1, 1024));
        } else if (pk.str() == "price_per_task_hour") {
          s.price_per_task_hour = get_double(pn, f, 0.0, 1e9, true, false);
        } else {
          throw ConfigError(f, "unknown key (expected batch_sizes, max_workers, price_per_task_hour)");
        }
      }
    } else if (k == "threads_per_task") {
      s.threads_per_task = static_cast<int>(get_int(node, k, 1, 256));
    } else if (k == "sync") {
      s.sync = get_choice(node, k, {"async", "ssp", "sync"});
    } else if (k == "staleness") {
      s.staleness = static_cast<int>(get_int(node, k, 0, 1000));
      staleness_given = true;
    } else if (k == "overlap") {
      s.overlap = toml_fields::get_bool(node, k);
    } else if (k == "device") {
      s.device = get_choice(node, k, {"cpu", "cuda"});
    } else if (k == "gpus_per_worker") {
      s.gpus_per_worker = static_cast<int>(get_int(node, k, 1, 64));
      gpus_given = true;
    } else if (k == "local_group") {
      s.local_group = toml_fields::get_bool(node, k);
    } else if (k == "backup_workers") {
      s.backup_workers = static_cast<int>(get_int(node, k, 0, 1023));
    } else if (k == "seed") {
      s.seed = get_int(node, k, 0, std::int64_t{1} << 62);
    } else if (k == "train_samples") {
      s.train_samples = get_int(node, k, 0, 100000000);
    } else if (k == "test_samples") {
      s.test_samples = get_int(node, k, 0, 100000000);
    } else if (k == "eval_batch_size") {
      s.eval_batch_size = static_cast<int>(get_int(node, k, 1, 65536));
    } else if (k == "optimizer") {
      parse_optimizer(get_table(node, k), s.optimizer);
    } else if (k == "compression") {
      auto& c = s.compression;
      for (auto&& [ck, cn] : get_table(node, k)) {
        const std::string f = "compression." + std::string(ck.str());
        const std::string name(ck.str());
        if (name == "method") {
          c.method = compress::parse_method(get_choice(cn, f, {"none", "topk", "dgc", "randomk", "fp16"}));
        } else if (name == "ratio") {
          c.ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else if (name == "downlink_ratio") {
          c.downlink_ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else if (name == "warmup_epochs") {
          c.warmup_epochs = get_double(cn, f, 0.0, 1000.0, false, false);
        } else if (name == "momentum") {
          c.momentum = get_double(cn, f, 0.0, 1.0, false, true);
        } else if (name == "clip_norm") {
          c.clip_norm = get_double(cn, f, 0.0, 1e9, false, false);
        } else if (name == "sample_ratio") {
          c.sample_ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else if (name == "min_compress_bytes") {
          c.min_compress_bytes = get_int(cn, f, 0, std::int64_t{1} << 31);
        } else {
          throw ConfigError(f, "unknown key (expected method, ratio, downlink_ratio, warmup_epochs, momentum, "
                               "clip_norm, sample_ratio, min_compress_bytes)");
        }
      }
    } else if (k == "ps") {
      for (auto&& [pk, pn] : get_table(node, k)) {
        const std::string f = "ps." + std::string(pk.str());
        if (pk.str() == "partition_size") {
          s.partition_size = get_int(pn, f, 1, std::int64_t{1} << 26);
        } else if (pk.str() == "timeout") {
          s.ps_timeout_seconds = toml_fields::get_duration(pn, f, "60s");
          if (s.ps_timeout_seconds < 1 || s.ps_timeout_seconds > 86400) {
            throw ConfigError(f, "expected a duration in [1s, 24h], got \"" + *pn.value<std::string>() + "\"");
          }
        } else if (pk.str() == "barrier_timeout") {
          s.barrier_timeout_seconds = toml_fields::get_duration(pn, f, "30s");
          if (s.barrier_timeout_seconds < 0.1 || s.barrier_timeout_seconds > 86400) {
            throw ConfigError(f, "expected a duration in [100ms, 24h], got \"" + *pn.value<std::string>() + "\"");
          }
        } else {
          throw ConfigError(f, "unknown key (expected partition_size, timeout, barrier_timeout)");
        }
      }
    } else {
      throw ConfigError(k, "unknown key (expected name, model, dataset, data_dir, image_size, channels, mean, std, "
                           "loader_threads, loader_queue, loader_cache_mb, [augment], epochs, "
                           "workers, ps_shards, batch_size, threads_per_task, sync, staleness, backup_workers, overlap, device, "
                           "gpus_per_worker, local_group, seed, "
                           "train_samples, test_samples, eval_batch_size, target_accuracy, deadline, queue_timeout, [optimizer], [compression], "
                           "[planner], "
                           "[ps])");
    }
  }
  check_sync_fields(s, staleness_given);
  check_device_fields(s, gpus_given);
  if (s.optimizer.warmup_epochs >= s.epochs) {
    std::ostringstream os;
    os << "must be less than epochs (" << s.epochs << "), got " << s.optimizer.warmup_epochs;
    throw ConfigError("optimizer.warmup_epochs", os.str());
  }
  if (s.compression.warmup_epochs >= s.epochs) {
    std::ostringstream os;
    os << "must be less than epochs (" << s.epochs << "), got " << s.compression.warmup_epochs;
    throw ConfigError("compression.warmup_epochs", os.str());
  }
  apply_data_defaults(s);
  namespace fs = std::filesystem;
  fs::path dir(s.data_dir);
  if (dir.is_relative()) dir = fs::path(base_dir) / dir;
  s.data_dir = dir.lexically_normal().string();
  if (check_files && s.dataset == "cifar10") {
    data::check_cifar10_dir(s.data_dir);
  } else if (check_files && s.dataset == "imagefolder") {
    data::scan_image_folder(s.data_dir);
  } else if (check_files) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" does not exist on the leader" +
                                        (s.data_dir == "/usr/share/datasets/fashion-mnist"
                                             ? " (install it with: apt-get install dataset-fashion-mnist)"
                                             : ""));
    }
    for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      if (!fs::exists(dir / f, ec) && !fs::exists(dir / (std::string(f) + ".gz"), ec)) {
        throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" has no " + f +
                                          "[.gz] file");
      }
    }
  }
  return s;
}

double ps_momentum(const JobSpec& spec) {
  return spec.compression.method == compress::Method::kDgc ? 0.0 : spec.optimizer.momentum;
}

namespace {

// The JSON form's one field list (to_json and job_from_json both walk it). Required
// fields must be present when reading; optional ones keep their defaults when absent
// (keys added after the first release, and the leader-only fields).
enum class Need { kRequired, kOptional };

struct JsonOut {
  nlohmann::json& j;
  template <typename T>
  void operator()(const char* key, const T& v, Need = Need::kRequired) const {
    if constexpr (std::is_same_v<T, compress::Method>) {
      j[key] = compress::to_string(v);
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
  template <typename T>
  void operator()(const char* key, T& v, Need need = Need::kRequired) const {
    if (need == Need::kOptional && !j.contains(key)) return;
    if constexpr (std::is_same_v<T, compress::Method>) {
      v = compress::parse_method(j.at(key).get<std::string>());
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
    fields(v, JsonIn{j.at(key)});
  }
};

template <typename S, typename V>
void optimizer_fields(S& o, V&& v) {
  v("lr", o.lr), v("momentum", o.momentum), v("weight_decay", o.weight_decay), v("lr_schedule", o.lr_schedule),
      v("warmup_epochs", o.warmup_epochs);
}

template <typename S, typename V>
void compression_fields(S& c, V&& v) {
  v("method", c.method), v("ratio", c.ratio), v("downlink_ratio", c.downlink_ratio),
      v("warmup_epochs", c.warmup_epochs), v("momentum", c.momentum), v("clip_norm", c.clip_norm),
      v("sample_ratio", c.sample_ratio), v("min_compress_bytes", c.min_compress_bytes, Need::kOptional);
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
      v("workers", s.workers), v("ps_shards", s.ps_shards), v("batch_size", s.batch_size),
      v("threads_per_task", s.threads_per_task), v("sync", s.sync), v("seed", s.seed),
      v("train_samples", s.train_samples), v("test_samples", s.test_samples), v("partition_size", s.partition_size),
      v("ps_timeout_seconds", s.ps_timeout_seconds, opt), v("staleness", s.staleness, opt),
      v("backup_workers", s.backup_workers, opt), v("barrier_timeout_seconds", s.barrier_timeout_seconds, opt),
      v("overlap", s.overlap, opt), v("device", s.device, opt), v("gpus_per_worker", s.gpus_per_worker, opt),
      v("local_group", s.local_group, opt), v("eval_batch_size", s.eval_batch_size, opt);
  v.nested("optimizer", s.optimizer, [](auto& o, auto&& w) { optimizer_fields(o, w); });
  v.nested("compression", s.compression, [](auto& c, auto&& w) { compression_fields(c, w); }, opt);
  v("workers_auto", s.workers_auto, opt), v("batch_auto", s.batch_auto, opt),
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
    job_fields(s, JsonIn{j});
    if (s.image_size == 0 || s.channels == 0) apply_data_defaults(s);
    if (s.device != "cpu" && s.device != "cuda") {
      throw ConfigError("device", "expected \"cpu\" or \"cuda\", got \"" + s.device + "\"");
    }
    if (s.gpus_per_worker < 0 || s.gpus_per_worker > 64 || (s.device == "cuda") != (s.gpus_per_worker > 0)) {
      throw ConfigError("gpus_per_worker", "expected 1 to 64 with device = \"cuda\" and 0 with \"cpu\", got " +
                                               std::to_string(s.gpus_per_worker));
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("job", std::string("malformed job JSON: ") + e.what());
  }
}

}  // namespace dltrain
