// Fuzzes the job file (job/job_spec.h): parse_job_toml, what the leader runs on every
// submitted job, and the JSON form the leader sends to its tasks (to_json /
// job_from_json).
//
// Input: a job file's text. Checks, beyond "no crash" and "only ConfigError escapes":
//   - a job that parses has every field inside its documented range;
//   - its JSON form, written as text and read back, gives the same job (what a worker
//     reads from its job.json is what the leader accepted).
#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "job/job_spec.h"
#include "fuzz_check.h"

using namespace dltrain;

namespace {

bool in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

void check_ranges(const JobSpec& s) {
  FUZZ_CHECK(s.name.size() <= kMaxJobNameLength && s.data_dir.size() <= kMaxPathLength + 64, "name or data_dir too long");
  FUZZ_CHECK(!s.data_dir.empty() && s.data_dir.front() == '/', "data_dir not absolute");
  FUZZ_CHECK(enum_name(s.model) != "?" && s.model != ModelKind::kTorchScript, "unknown model");
  FUZZ_CHECK(enum_name(s.dataset) != "?", "unknown dataset");
  // A sharded data set's image size and channels may wait for its manifest (0).
  const bool from_manifest = s.dataset == DatasetKind::kShards && (s.image_size == 0 || s.channels == 0);
  FUZZ_CHECK(from_manifest || (s.image_size >= 8 && s.image_size <= 1024 && (s.channels == 1 || s.channels == 3)),
             "image_size or channels");
  FUZZ_CHECK((s.dataset == DatasetKind::kShards) == !s.data.empty(), "data without dataset = shards, or the reverse");
  FUZZ_CHECK(s.mean.size() == s.std.size() && (s.mean.empty() || static_cast<int>(s.mean.size()) == s.channels),
             "mean/std not one per channel");
  for (double v : s.std) FUZZ_CHECK(std::isfinite(v) && v > 0, "a std that is not positive");
  for (double v : s.mean) FUZZ_CHECK(std::isfinite(v), "a mean that is not finite");
  FUZZ_CHECK(s.loader_threads >= 0 && s.loader_threads <= 64 && s.loader_queue >= 0 && s.loader_queue <= 1024,
             "loader_threads or loader_queue");
  const auto& a = s.augment;
  FUZZ_CHECK(a.crop_padding >= 0 && a.crop_padding <= 64 && (a.crop_padding == 0 || from_manifest || a.crop_padding < s.image_size),
             "augment.crop_padding");
  FUZZ_CHECK(in(a.scale_min, 0, 1) && a.scale_min > 0 && a.scale_min <= a.scale_max && a.scale_max <= 1, "augment.scale");
  FUZZ_CHECK(in(a.ratio_min, 0, 100) && a.ratio_min > 0 && a.ratio_min <= a.ratio_max && a.ratio_max <= 100,
             "augment.ratio");
  FUZZ_CHECK(s.epochs >= 1 && s.epochs <= 1000, "epochs out of range");
  FUZZ_CHECK(s.workers >= 1 && s.workers <= 1024 && s.ps_shards >= 1 && s.ps_shards <= 256, "workers or shards");
  FUZZ_CHECK(s.batch_size >= 1 && s.batch_size <= 65536 && s.threads_per_task >= 1 && s.threads_per_task <= 256,
             "batch size or threads");
  FUZZ_CHECK(enum_name(s.sync) != "?", "a sync mode that is not implemented");
  FUZZ_CHECK(s.seed >= 0 && s.train_samples >= 0 && s.test_samples >= 0, "negative seed or sample count");
  FUZZ_CHECK(s.partition_size >= 1 && s.partition_size <= (std::int64_t{1} << 26), "partition_size");
  FUZZ_CHECK(in(s.ps_timeout_seconds, 1, 86400), "ps timeout");
  FUZZ_CHECK(in(s.optimizer.lr, 0, 10) && s.optimizer.lr > 0, "lr");
  FUZZ_CHECK(in(s.optimizer.momentum, 0, 1) && s.optimizer.momentum < 1, "momentum");
  FUZZ_CHECK(in(s.optimizer.weight_decay, 0, 1) && s.optimizer.weight_decay < 1, "weight_decay");
  FUZZ_CHECK(in(s.optimizer.warmup_epochs, 0, s.epochs) && s.optimizer.warmup_epochs < s.epochs, "warmup_epochs");
  FUZZ_CHECK(in(s.compression.ratio, 0, 1) && s.compression.ratio > 0, "compression.ratio");
  FUZZ_CHECK(in(s.compression.downlink_ratio, 0, 1), "downlink_ratio");  // 0 = "auto"
  FUZZ_CHECK(in(s.compression.warmup_epochs, 0, s.epochs) && s.compression.warmup_epochs < s.epochs,
             "compression.warmup_epochs");
  FUZZ_CHECK(in(s.target_accuracy, 0, 1) && std::isfinite(s.deadline_seconds) && s.deadline_seconds >= 0, "target or deadline");
  FUZZ_CHECK(s.queue_timeout_seconds == 0 || in(s.queue_timeout_seconds, 1, 30 * 86400.0), "queue_timeout");
  FUZZ_CHECK(!s.batch_sizes.empty() && s.batch_sizes.size() <= kMaxBatchSizes, "batch_sizes count");
  for (int b : s.batch_sizes) FUZZ_CHECK(b >= 1 && b <= 65536, "a batch size out of range");
  FUZZ_CHECK(s.max_workers >= 0 && s.max_workers <= 1024 && in(s.price_per_task_hour, 0, 1e9), "planner limits");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  JobSpec spec;
  try {
    spec = parse_job_toml(text, "/jobs", false);
  } catch (const ConfigError&) {
    return 0;
  }
  check_ranges(spec);
  const nlohmann::json j = spec;
  // As the leader sends it: JSON text (strict UTF-8, so this throws if a string is not).
  const std::string wire_text = j.dump();
  const JobSpec back = job_from_json(nlohmann::json::parse(wire_text));
  const nlohmann::json j2 = back;
  FUZZ_CHECK(j2 == j, "job_from_json(to_json(spec)) != spec");
  return 0;
}
