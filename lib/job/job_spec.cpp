#include "job/job_spec.h"

#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "common/json_fields.h"
#include "common/toml_fields.h"
#include "data/cifar10.h"
#include "data/imagefolder.h"
#include "data/shards.h"

namespace dltrain {
namespace {

using toml_fields::enum_key;
using toml_fields::get_double;
using toml_fields::get_int;
using toml_fields::get_string;
using toml_fields::get_table;
using toml_fields::bool_key;
using toml_fields::double_key;
using toml_fields::int_key;
using toml_fields::KeyReader;
using toml_fields::KeyTable;
using toml_fields::read_keys;
using toml_fields::table_key;
using Node = toml::node;

// A [lo, hi] pair of positive numbers (augment.scale, augment.ratio).
std::pair<double, double> get_range(const toml::node& n, const std::string& f, double lo, double hi) {
  if (!n.is_array() || n.as_array()->size() != 2) throw ConfigError(f, "expected an array of two numbers [min, max]");
  const double a = get_double(*n.as_array()->get(0), f, lo, hi, true, false);
  const double b = get_double(*n.as_array()->get(1), f, lo, hi, true, false);
  if (a > b) throw ConfigError(f, "min must not exceed max");
  return {a, b};
}

std::vector<double> get_channel_values(const toml::node& n, const std::string& f, bool positive) {
  if (!n.is_array() || n.as_array()->empty() || n.as_array()->size() > 3) {
    throw ConfigError(f, "expected an array with one number per channel, e.g. [0.5] or [0.485, 0.456, 0.406]");
  }
  std::vector<double> out;
  for (auto&& e : *n.as_array()) out.push_back(get_double(e, f, positive ? 0.0 : -1e3, 1e3, positive, false));
  return out;
}

// Every key of a job file and of its tables, with how each is read: the one list of
// them (docs/jobs.md documents the same keys and ranges).

const KeyTable<OptimizerSpec>& optimizer_keys() {
  static const KeyTable<OptimizerSpec> keys{
      {"lr", double_key(&OptimizerSpec::lr, 0.0, 10.0, true, false)},
      {"momentum", double_key(&OptimizerSpec::momentum, 0.0, 1.0, false, true)},
      {"weight_decay", double_key(&OptimizerSpec::weight_decay, 0.0, 1.0, false, true)},
      {"lr_schedule", enum_key(&OptimizerSpec::lr_schedule)},
      {"warmup_epochs", double_key(&OptimizerSpec::warmup_epochs, 0.0, 1000.0, false, false)},
  };
  return keys;
}

const KeyTable<CheckpointSpec>& checkpoint_keys() {
  static const KeyTable<CheckpointSpec> keys{
      {"every_epochs", int_key(&CheckpointSpec::every_epochs, 0, 1000)},
      {"best", bool_key(&CheckpointSpec::best)},
  };
  return keys;
}

const KeyTable<ElasticSpec>& elastic_keys() {
  static const KeyTable<ElasticSpec> keys{
      {"min_workers", int_key(&ElasticSpec::min_workers, 1, 1024)},
      {"max_workers", int_key(&ElasticSpec::max_workers, 1, 1024)},
  };
  return keys;
}

const KeyTable<data::AugmentSpec>& augment_keys() {
  using data::AugmentSpec;
  static const KeyTable<AugmentSpec> keys{
      {"crop_padding", int_key(&AugmentSpec::crop_padding, 0, 64)},
      {"horizontal_flip", bool_key(&AugmentSpec::horizontal_flip)},
      {"random_resized_crop", bool_key(&AugmentSpec::random_resized_crop)},
      {"scale",
       [](AugmentSpec& a, const Node& n, const std::string& f) {
         std::tie(a.scale_min, a.scale_max) = get_range(n, f, 0.0, 1.0);
       }},
      {"ratio",
       [](AugmentSpec& a, const Node& n, const std::string& f) {
         std::tie(a.ratio_min, a.ratio_max) = get_range(n, f, 0.0, 100.0);
       }},
  };
  return keys;
}

const KeyTable<compress::CompressionSpec>& compression_keys() {
  using compress::CompressionSpec;
  static const KeyTable<CompressionSpec> keys{
      {"method",
       [](CompressionSpec& c, const Node& n, const std::string& f) {
         if (n.is_string() && n.value_or(std::string()) == "auto") {
           c.method_auto = true;
           c.method = compress::Method::kNone;
           return;
         }
         try {
           enum_key(&CompressionSpec::method)(c, n, f);
         } catch (const ConfigError& e) {
           // The enum's names, and "auto", which is not a method but the planner's choice.
           const std::string what = e.what();
           throw ConfigError(f, what.substr(std::min(what.size(), f.size() + 2)) + " (or \"auto\": the planner chooses)");
         }
       }},
      {"ratio", double_key(&CompressionSpec::ratio, 0.0, 1.0, true, false)},
      {"downlink_ratio",
       [](CompressionSpec& c, const Node& n, const std::string& f) {
         if (n.is_string()) {
           if (n.value_or(std::string()) != "auto") {
             throw ConfigError(f, "expected a number in (0, 1] or \"auto\", got \"" + n.value_or(std::string()) + "\"");
           }
           c.downlink_ratio = 0;  // compress::downlink_density's "auto"
         } else {
           c.downlink_ratio = toml_fields::get_double(n, f, 0.0, 1.0, true, false);
         }
       }},
      {"warmup_epochs", double_key(&CompressionSpec::warmup_epochs, 0.0, 1000.0, false, false)},
      {"warmup_schedule", enum_key(&CompressionSpec::warmup_schedule)},
      {"momentum", double_key(&CompressionSpec::momentum, 0.0, 1.0, false, true)},
      {"clip_norm", double_key(&CompressionSpec::clip_norm, 0.0, 1e9, false, false)},
      {"sample_ratio", double_key(&CompressionSpec::sample_ratio, 0.0, 1.0, true, false)},
      {"min_compress_bytes", int_key(&CompressionSpec::min_compress_bytes, 0, std::int64_t{1} << 31)},
      {"rank", int_key(&CompressionSpec::rank, 1, 64)},
  };
  return keys;
}

// [planner] and [ps] fill fields of the JobSpec itself.
const KeyTable<JobSpec>& planner_keys() {
  static const KeyTable<JobSpec> keys{
      {"batch_sizes",
       [](JobSpec& s, const Node& n, const std::string& f) {
         if (!n.is_array() || n.as_array()->empty()) throw ConfigError(f, "expected a non-empty array of integers");
         if (n.as_array()->size() > kMaxBatchSizes) {
           throw ConfigError(f, "at most " + std::to_string(kMaxBatchSizes) + " batch sizes, got " +
                                    std::to_string(n.as_array()->size()));
         }
         s.batch_sizes.clear();
         for (auto&& e : *n.as_array()) s.batch_sizes.push_back(static_cast<int>(get_int(e, f, 1, 65536)));
       }},
      {"max_workers", int_key(&JobSpec::max_workers, 1, 1024)},
      {"price_per_task_hour", double_key(&JobSpec::price_per_task_hour, 0.0, 1e9, true, false)},
  };
  return keys;
}

// An integer in [lo, hi], or "auto" (which sets `automatic`), into member `f`.
template <typename T>
KeyReader<JobSpec> int_or_auto_key(T JobSpec::*f, bool JobSpec::*automatic, std::int64_t lo, std::int64_t hi) {
  return [=](JobSpec& s, const Node& n, const std::string& k) {
    if (n.is_string() && *n.value<std::string>() == "auto") {
      s.*automatic = true;
    } else {
      s.*f = static_cast<T>(get_int(n, k, lo, hi));
      s.*automatic = false;
    }
  };
}

// A duration in [lo_s, hi_s] seconds into member `f`; `range` is the message's "[1s, 24h]".
KeyReader<JobSpec> duration_key(double JobSpec::*f, const char* example, double lo_s, double hi_s,
                                const char* range) {
  return [=](JobSpec& s, const Node& n, const std::string& k) {
    s.*f = toml_fields::get_duration(n, k, example);
    if (s.*f < lo_s || s.*f > hi_s) {
      throw ConfigError(k, std::string("expected a duration in ") + range + ", got \"" + *n.value<std::string>() + "\"");
    }
  };
}

const KeyTable<JobSpec>& ps_keys() {
  static const KeyTable<JobSpec> keys{
      {"partition_size",
       int_or_auto_key(&JobSpec::partition_size, &JobSpec::partition_size_auto, 1, std::int64_t{1} << 26)},
      {"timeout", duration_key(&JobSpec::ps_timeout_seconds, "60s", 1, 86400, "[1s, 24h]")},
      {"barrier_timeout", duration_key(&JobSpec::barrier_timeout_seconds, "30s", 0.1, 86400, "[100ms, 24h]")},
  };
  return keys;
}

// A string of at most `max_length` bytes (name, data_dir).
KeyReader<JobSpec> bounded_string_key(std::string JobSpec::*f, std::size_t max_length, const char* unit) {
  return [=](JobSpec& s, const Node& n, const std::string& k) {
    s.*f = get_string(n, k);
    if ((s.*f).size() > max_length) {
      throw ConfigError(k, "at most " + std::to_string(max_length) + " " + unit + ", got " +
                               std::to_string((s.*f).size()));
    }
  };
}

const KeyTable<JobSpec>& job_keys() {
  static const KeyTable<JobSpec> keys{
      {"name", bounded_string_key(&JobSpec::name, kMaxJobNameLength, "characters")},
      {"model", enum_key(&JobSpec::model)},
      {"model_file", bounded_string_key(&JobSpec::model_file, kMaxPathLength, "bytes")},
      {"init_from", bounded_string_key(&JobSpec::init_from, kMaxPathLength, "bytes")},
      {"dataset", enum_key(&JobSpec::dataset)},
      {"data_dir", bounded_string_key(&JobSpec::data_dir, kMaxPathLength, "bytes")},
      {"data", bounded_string_key(&JobSpec::data, kMaxPathLength, "bytes")},
      {"image_size", int_key(&JobSpec::image_size, 8, 1024)},
      {"channels",
       [](JobSpec& s, const Node& n, const std::string& k) {
         s.channels = static_cast<int>(get_int(n, k, 1, 3));
         if (s.channels == 2) throw ConfigError(k, "expected 1 (gray) or 3 (RGB), got 2");
       }},
      {"mean", [](JobSpec& s, const Node& n, const std::string& k) { s.mean = get_channel_values(n, k, false); }},
      {"std", [](JobSpec& s, const Node& n, const std::string& k) { s.std = get_channel_values(n, k, true); }},
      {"loader_threads", int_key(&JobSpec::loader_threads, 0, 64)},
      {"loader_queue", int_key(&JobSpec::loader_queue, 0, 1024)},
      {"loader_cache_mb", int_key(&JobSpec::loader_cache_mb, 0, std::int64_t{1} << 20)},
      {"augment", table_key(&JobSpec::augment, augment_keys()), true},
      {"epochs", int_key(&JobSpec::epochs, 1, 1000)},
      {"workers", int_or_auto_key(&JobSpec::workers, &JobSpec::workers_auto, 1, 1024)},
      {"ps_shards", int_or_auto_key(&JobSpec::ps_shards, &JobSpec::ps_shards_auto, 1, 256)},
      {"batch_size", int_or_auto_key(&JobSpec::batch_size, &JobSpec::batch_auto, 1, 65536)},
      {"threads_per_task", int_key(&JobSpec::threads_per_task, 1, 256)},
      {"sync", enum_key(&JobSpec::sync)},
      {"staleness", int_key(&JobSpec::staleness, 0, 1000)},
      {"backup_workers", int_key(&JobSpec::backup_workers, 0, 1023)},
      {"overlap", bool_key(&JobSpec::overlap)},
      {"device", enum_key(&JobSpec::device)},
      {"gpus_per_worker", int_key(&JobSpec::gpus_per_worker, 1, 64)},
      {"local_group", bool_key(&JobSpec::local_group)},
      {"seed", int_key(&JobSpec::seed, 0, std::int64_t{1} << 62)},
      {"train_samples", int_key(&JobSpec::train_samples, 0, 100000000)},
      {"test_samples", int_key(&JobSpec::test_samples, 0, 100000000)},
      {"eval_batch_size", int_key(&JobSpec::eval_batch_size, 1, 65536)},
      {"target_accuracy", double_key(&JobSpec::target_accuracy, 0.0, 1.0, true, false)},
      {"deadline",
       [](JobSpec& s, const Node& n, const std::string& k) {
         s.deadline_seconds = toml_fields::get_duration(n, k, "30m");
         if (s.deadline_seconds <= 0) throw ConfigError(k, "must be positive");
       }},
      {"queue_timeout", duration_key(&JobSpec::queue_timeout_seconds, "10m", 1, 30 * 86400.0, "[1s, 30d]")},
      {"optimizer", table_key(&JobSpec::optimizer, optimizer_keys()), true},
      {"checkpoint", table_key(&JobSpec::checkpoint, checkpoint_keys()), true},
      {"elastic", table_key(&JobSpec::elastic, elastic_keys()), true},
      {"compression", table_key(&JobSpec::compression, compression_keys()), true},
      {"planner",
       [](JobSpec& s, const Node& n, const std::string& k) { read_keys(get_table(n, k), k + ".", planner_keys(), s); },
       true},
      {"ps", [](JobSpec& s, const Node& n, const std::string& k) { read_keys(get_table(n, k), k + ".", ps_keys(), s); },
       true},
  };
  return keys;
}

}  // namespace

void apply_data_defaults(JobSpec& s) {
  const bool idx = is_idx_dataset(s.dataset);
  if (s.dataset == DatasetKind::kShards) {
    // image_size and channels default to the manifest's (set by the leader at submit, or
    // by the worker), which is not at hand here.
    if (s.data.empty()) throw ConfigError("data", "dataset = \"shards\" needs data = \"URL\" (docs/data.md)");
    data::check_data_url(s.data);
    for (const auto& [key, n] : {std::pair<const char*, std::int64_t>{"train_samples", s.train_samples}, {"test_samples", s.test_samples}}) {
      if (n > 0) {
        throw ConfigError(key, "does not apply to a sharded data set, which is read whole (pack a smaller one: "
                               "dltrain dataset pack)");
      }
    }
    if (s.channels == 0 || s.image_size == 0) {
      if (s.mean.empty() != s.std.empty()) {
        throw ConfigError(s.mean.empty() ? "mean" : "std", "give mean and std together (or neither: the manifest's)");
      }
      return;
    }
  } else if (!s.data.empty()) {
    throw ConfigError("data", "applies only to dataset = \"shards\" (this job has dataset = \"" +
                                  std::string(enum_name(s.dataset)) + "\")");
  }
  if (s.image_size == 0) s.image_size = idx ? 28 : s.dataset == DatasetKind::kCifar10 ? 32 : 224;
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
      s.compression.method != compress::Method::kDgc && s.compression.method != compress::Method::kPowerSgd) {
    throw ConfigError("compression.min_compress_bytes",
                      "applies only to method = \"topk\", \"dgc\" or \"powersgd\" (this job has method = \"" +
                          std::string(enum_name(s.compression.method)) + "\")");
  }
  if (s.mean.empty() != s.std.empty()) {
    throw ConfigError(s.mean.empty() ? "mean" : "std", "give mean and std together (or neither: computed on a sample)");
  }
  if (s.augment.crop_padding > 0 && s.augment.crop_padding >= s.image_size) {
    throw ConfigError("augment.crop_padding", "must be less than image_size (" + std::to_string(s.image_size) + ")");
  }
}

bool is_idx_dataset(DatasetKind dataset) {
  return dataset == DatasetKind::kFashionMnist || dataset == DatasetKind::kMnist;
}

namespace {

// "(this job has sync = \"ssp\")" and the like, for the messages of validate_job.
template <NamedEnum E>
std::string this_job_has(const char* key, E v) {
  return std::string(" (this job has ") + key + " = \"" + std::string(enum_name(v)) + "\")";
}

// The fields of the consistency models, which depend on sync and on each other.
void check_sync_fields(const JobSpec& s) {
  if (s.backup_workers > 0) {
    if (s.sync != ps::SyncMode::kBsp) {
      throw ConfigError("backup_workers", "applies only to sync = \"sync\"" + this_job_has("sync", s.sync));
    }
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
    if (s.sync == ps::SyncMode::kAsync) {
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
void check_device_fields(const JobSpec& s) {
  if (s.device == Device::kCpu && s.gpus_per_worker != 0) {
    throw ConfigError("gpus_per_worker", "applies only to device = \"cuda\"" + this_job_has("device", s.device));
  }
  if (s.device == Device::kCuda && (s.gpus_per_worker < 1 || s.gpus_per_worker > 64)) {
    throw ConfigError("gpus_per_worker", "expected 1 to 64 with device = \"cuda\", got " +
                                             std::to_string(s.gpus_per_worker));
  }
  if (s.local_group) {
    if (s.sync != ps::SyncMode::kAsync) {
      throw ConfigError("local_group", "needs sync = \"async\"" + this_job_has("sync", s.sync) +
                                           ": a group pushes as one worker, which the PS's step accounting of "
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

// model_file goes with model = "torchscript", and only with it.
void check_model_fields(const JobSpec& s) {
  if (s.model != ModelKind::kTorchScript) {
    if (!s.model_file.empty()) {
      throw ConfigError("model_file", "applies only to model = \"torchscript\"" + this_job_has("model", s.model));
    }
    return;
  }
  if (s.model_file.empty()) {
    throw ConfigError("model_file", "required with model = \"torchscript\": the path of a file written by "
                                    "torch.jit.save (docs/training.md, \"Your model\")");
  }
  if (s.workers_auto) {
    throw ConfigError("workers", "\"auto\" needs a built-in model (the planner's memory and speed models know only "
                                 "those); give a number of workers for model = \"torchscript\"");
  }
}

void check_warmups(const JobSpec& s) {
  for (const auto& [field, value] : {std::pair{"optimizer.warmup_epochs", s.optimizer.warmup_epochs},
                                     std::pair{"compression.warmup_epochs", s.compression.warmup_epochs}}) {
    if (value >= s.epochs) {
      std::ostringstream os;
      os << "must be less than epochs (" << s.epochs << "), got " << value;
      throw ConfigError(field, os.str());
    }
  }
}

// The defaults of keys a job file leaves out that depend on other keys: the number of
// PS shards and the partition size ("auto"), a CUDA worker's one GPU, the compression
// method's recipe. `given(key)` says whether the file set the dotted key.
template <typename Given>
void apply_file_defaults(JobSpec& s, Given&& given) {
  if (!given("ps_shards")) s.ps_shards_auto = true;
  if (!given("ps.partition_size")) s.partition_size_auto = true;
  if (s.device == Device::kCuda && !given("gpus_per_worker")) s.gpus_per_worker = 1;
  if (s.compression.method_auto) {
    // The planner chooses the method and takes its recipe (compress::apply_method_defaults):
    // a setting of one method would be wrong for another.
    for (const auto& k : compression_keys()) {
      if (k.name != "method" && given("compression." + k.name)) {
        throw ConfigError("compression." + k.name, "not with method = \"auto\": the planner chooses the method and "
                                                "its settings (docs/planner.md, \"Choosing the compression\"); "
                                                "name a method to set it");
      }
    }
    return;
  }
  compress::apply_method_defaults(s.compression, s.epochs,
                                  [&](const char* key) { return given(std::string("compression.") + key); });
}

// model = "torchscript": model_file resolved against the job file's directory and, with
// check_files, refused early when it is missing, too large or not a zip archive (the
// worker checks the rest when it loads it).
void resolve_model_file(JobSpec& s, const std::string& base_dir, bool check_files, const std::string& uploaded_model) {
  namespace fs = std::filesystem;
  if (s.model != ModelKind::kTorchScript) return;
  fs::path f(s.model_file);
  if (f.is_relative()) f = fs::path(base_dir) / f;
  s.model_file = f.lexically_normal().string();
  if (!check_files) return;
  if (!uploaded_model.empty()) f = uploaded_model;
  std::error_code ec;
  if (!fs::is_regular_file(f, ec)) {
    throw ConfigError("model_file", "\"" + s.model_file + "\" is not a file on the leader (it must be at this path on "
                                    "every agent too)");
  }
  const auto size = fs::file_size(f, ec);
  if (!ec && size > kMaxModelFileBytes) {
    throw ConfigError("model_file", "\"" + s.model_file + "\" has " + std::to_string(size) + " bytes, more than the " +
                                        std::to_string(kMaxModelFileBytes) + " a model file may have");
  }
  // torch.jit.save writes a zip archive; anything else is refused before a worker starts.
  std::ifstream in(f, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() != 4 || magic[0] != 'P' || magic[1] != 'K' || magic[2] != 3 || magic[3] != 4) {
    throw ConfigError("model_file", "\"" + s.model_file + "\" is not a TorchScript archive (torch.jit.save writes a zip "
                                    "file; this one does not start like one)");
  }
}

// data_dir resolved against the job file's directory and, with check_files, checked to
// hold the data set.
void resolve_data_dir(JobSpec& s, const std::string& base_dir, bool check_files) {
  namespace fs = std::filesystem;
  if (s.dataset == DatasetKind::kShards) {
    // A local manifest is read here; a remote one by the leader (leader_clients.cpp).
    if (!check_files || !data::is_local_url(s.data)) return;
    const std::string dir = s.data.rfind("file://", 0) == 0 ? s.data.substr(7) : s.data;
    const auto path = (fs::path(dir) / data::kManifestName).string();
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError("data", "\"" + path + "\" cannot be read on the leader (pack the data set with dltrain dataset pack)");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    apply_manifest(s, data::parse_manifest(text, path));
    return;
  }
  fs::path dir(s.data_dir);
  if (dir.is_relative()) dir = fs::path(base_dir) / dir;
  s.data_dir = dir.lexically_normal().string();
  if (!check_files) return;
  if (s.dataset == DatasetKind::kCifar10) {
    data::check_cifar10_dir(s.data_dir);
    return;
  }
  if (s.dataset == DatasetKind::kImageFolder) {
    data::scan_image_folder(s.data_dir);
    return;
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" does not exist on the leader" +
                                      (s.data_dir == "/usr/share/datasets/fashion-mnist"
                                           ? " (install it with: apt-get install dataset-fashion-mnist)"
                                           : ""));
  }
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"}) {
    if (!fs::exists(dir / f, ec) && !fs::exists(dir / (std::string(f) + ".gz"), ec)) {
      throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" has no " + f + "[.gz] file");
    }
  }
}

}  // namespace

namespace {

// [elastic]: bounds around the starting size, and what an elastic job cannot combine with.
void check_elastic_fields(JobSpec& s) {
  auto& e = s.elastic;
  if (!e.on() && e.min_workers == 0) return;
  if (!e.on()) throw ConfigError("elastic.max_workers", "is required in [elastic]");
  if (e.min_workers == 0) e.min_workers = 1;
  if (s.workers_auto) {
    throw ConfigError("elastic", "workers = \"auto\" cannot be combined with [elastic]: give the starting size");
  }
  if (e.min_workers > s.workers || s.workers > e.max_workers) {
    throw ConfigError("elastic", "workers (" + std::to_string(s.workers) + ") must lie within [min_workers, max_workers] = [" +
                                     std::to_string(e.min_workers) + ", " + std::to_string(e.max_workers) + "]");
  }
  if (s.local_group) throw ConfigError("elastic", "an elastic job cannot use local_group");
  if (s.dataset == DatasetKind::kShards) {
    throw ConfigError("elastic", "an elastic job cannot read a sharded data set yet (docs/training.md, \"Elastic jobs\")");
  }
  if (s.sync == ps::SyncMode::kBsp && s.backup_workers >= e.min_workers) {
    throw ConfigError("backup_workers", "must be less than elastic.min_workers (" + std::to_string(e.min_workers) + ")");
  }
}

}  // namespace

void validate_job(JobSpec& s) {
  check_elastic_fields(s);
  check_sync_fields(s);
  check_device_fields(s);
  check_model_fields(s);
  check_warmups(s);
  apply_data_defaults(s);
}

void apply_manifest(JobSpec& s, const data::Manifest& m) {
  if (s.image_size == 0) s.image_size = std::clamp(m.image_size, 8, 1024);
  if (s.channels == 0) s.channels = m.channels;
  if (!s.workers_auto && m.train.samples < s.workers) {
    throw ConfigError("data", std::to_string(m.train.samples) + " training samples cannot feed " + std::to_string(s.workers) +
                                  " workers");
  }
  apply_data_defaults(s);
}

std::string dataset_label(const JobSpec& spec) {
  if (spec.dataset == DatasetKind::kShards) {
    // The location's last component, made a safe key part, and a hash of the whole.
    std::string d = spec.data;
    while (!d.empty() && d.back() == '/') d.pop_back();
    std::string base = d.substr(d.find_last_of('/') == std::string::npos ? 0 : d.find_last_of('/') + 1);
    for (auto& c : base) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
    }
    if (base.size() > 40) base.resize(40);
    const auto hash = sha256_hex(std::span(reinterpret_cast<const std::uint8_t*>(spec.data.data()), spec.data.size()));
    return "shards-" + base + "-" + hash.substr(0, 8);
  }
  return std::string(enum_name(spec.dataset));
}

double effective_barrier_timeout(const JobSpec& spec) {
  return spec.barrier_timeout_seconds > 0 ? spec.barrier_timeout_seconds : spec.ps_timeout_seconds / 2;
}

JobSpec parse_job_toml(const std::string& text, const std::string& base_dir, bool check_files,
                       const std::string& uploaded_model) {
  const toml::table root = toml_fields::parse(text);
  if (root.empty()) throw ConfigError("", "the job file is empty: it needs at least a model and its data");
  JobSpec s;
  toml_fields::read_keys(root, "", job_keys(), s);
  const auto given = [&](const std::string& dotted) {
    return static_cast<bool>(root.at_path(dotted));
  };
  // Rules about keys being written at all, which the JSON form (every key present) has not.
  if (given("staleness") && s.sync != ps::SyncMode::kSsp) {
    throw ConfigError("staleness", "applies only to sync = \"ssp\"" + this_job_has("sync", s.sync));
  }
  if (given("gpus_per_worker") && s.device == Device::kCpu) {
    throw ConfigError("gpus_per_worker", "applies only to device = \"cuda\"" + this_job_has("device", s.device));
  }
  if (given("data")) {
    if (given("dataset") && s.dataset != DatasetKind::kShards) {
      throw ConfigError("dataset", "a job with data = \"URL\" reads a sharded data set: leave dataset out (or write \"shards\")");
    }
    if (given("data_dir")) throw ConfigError("data_dir", "not with data = \"URL\" (a sharded data set has no data_dir)");
    s.dataset = DatasetKind::kShards;
    if (data::is_local_url(s.data) && s.data.rfind("file://", 0) != 0 && !s.data.empty() && s.data[0] != '/') {
      s.data = (std::filesystem::path(base_dir) / s.data).lexically_normal().string();  // relative to the job file
    }
  }
  apply_file_defaults(s, given);
  validate_job(s);
  resolve_model_file(s, base_dir, check_files, uploaded_model);
  resolve_data_dir(s, base_dir, check_files);
  return s;
}

std::vector<std::string> compression_warnings(const JobSpec& spec) {
  const auto& c = spec.compression;
  std::vector<std::string> out;
  if (c.method != compress::Method::kDgc && c.method != compress::Method::kTopk) return out;
  const std::string m(enum_name(c.method));
  if (c.warmup_epochs == 0) {
    out.push_back("compression.warmup_epochs = 0: " + m + " sparsifies from the first step, which costs accuracy "
                  "(DGC warms its sparsity up, Lin et al. 2018 §3.4); leave the key out for DGC's warm-up");
  }
  if (c.min_compress_bytes == 0) {
    out.push_back("compression.min_compress_bytes = 0: biases and normalisation layers are sparsified too, which "
                  "costs accuracy; leave the key out (16384: tensors under 16 KiB go in full)");
  }
  if (c.downlink_ratio > 0 && c.downlink_ratio < std::min(1.0, spec.workers * c.ratio)) {
    std::ostringstream os;
    os << "compression.downlink_ratio = " << c.downlink_ratio << " is below what " << spec.workers
       << " workers push between two pulls (" << spec.workers << " x ratio " << c.ratio
       << "): updates reach the workers late; write downlink_ratio = \"auto\"";
    out.push_back(os.str());
  }
  return out;
}

double ps_momentum(const JobSpec& spec) {
  return spec.compression.method == compress::Method::kDgc ? 0.0 : spec.optimizer.momentum;
}

}  // namespace dltrain
