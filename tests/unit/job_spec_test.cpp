// Job-file validation: every bad input is rejected with a message naming the field.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/toml_fields.h"
#include "data/shards.h"
#include "job/job_spec.h"
#include "support/temp_dir.h"

using namespace dltrain;

namespace {

const std::string kData = "data_dir = \"/usr/share/datasets/fashion-mnist\"\n";

std::pair<std::string, std::string> reject(const std::string& text) {
  try {
    parse_job_toml(text, "/tmp", true);
  } catch (const ConfigError& e) {
    return {e.field(), e.what()};
  }
  return {"", "(accepted)"};
}

// The "auto" flag `flag` (`key` in the stored JSON) of a job file that left the value
// out (`automatic`) or gave a number (`fixed`) survives storing; a job stored before the
// key existed had a fixed value.
void expect_auto_flag_stored(const JobSpec& automatic, const JobSpec& fixed, bool JobSpec::*flag, const char* key) {
  EXPECT_TRUE(job_from_json(nlohmann::json(automatic)).*flag) << key;
  EXPECT_FALSE(job_from_json(nlohmann::json(fixed)).*flag) << key;
  auto old = nlohmann::json(automatic);
  old.erase(key);
  EXPECT_FALSE(job_from_json(old).*flag) << key;
}

}  // namespace

TEST(JobSpec, ParsesTheMainJobFile) {
  auto s = parse_job_toml(kData + R"(
name = "x"
model = "cnn"
epochs = 8
workers = 2
ps_shards = 1
batch_size = 64
[optimizer]
lr = 0.05
momentum = 0.9
[ps]
partition_size = 1000
timeout = "1m30s"
)");
  EXPECT_EQ(s.name, "x");
  EXPECT_EQ(s.epochs, 8);
  EXPECT_EQ(s.batch_size, 64);
  EXPECT_DOUBLE_EQ(s.optimizer.lr, 0.05);
  EXPECT_EQ(s.partition_size, 1000);
  nlohmann::json j = s;
  auto back = job_from_json(j);
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.partition_size, s.partition_size);
  EXPECT_DOUBLE_EQ(s.ps_timeout_seconds, 90.0);
  EXPECT_DOUBLE_EQ(back.ps_timeout_seconds, 90.0);
  EXPECT_DOUBLE_EQ(back.optimizer.momentum, 0.9);
}

TEST(JobSpec, RejectsUnknownModel) {
  auto [field, msg] = reject("model = \"resnet152\"\n" + kData);
  EXPECT_EQ(field, "model");
  EXPECT_EQ(msg, "model: expected one of cnn | mlp | mlp-large | resnet20 | resnet18 | torchscript, got \"resnet152\"");
}

TEST(JobSpec, RejectsMissingDataDirectory) {
  auto [field, msg] = reject("data_dir = \"/no/such/dir\"\n");
  EXPECT_EQ(field, "data_dir");
  EXPECT_EQ(msg, "data_dir: directory \"/no/such/dir\" does not exist on the leader");
  EXPECT_EQ(reject("").second, "the job file is empty: it needs at least a model and its data");
}

TEST(JobSpec, RejectsNegativeBatchSize) {
  auto [field, msg] = reject("batch_size = -3\n" + kData);
  EXPECT_EQ(field, "batch_size");
  EXPECT_EQ(msg, "batch_size: expected an integer in [1, 65536], got -3");
}

TEST(JobSpec, RejectsWrongType) {
  auto [field, msg] = reject("workers = \"two\"\n" + kData);
  EXPECT_EQ(field, "workers");
  EXPECT_EQ(msg, "workers: expected an integer in [1, 1024], got a string \"two\"");
  auto [f2, m2] = reject(kData + "[optimizer]\nlr = \"fast\"\n");
  EXPECT_EQ(f2, "optimizer.lr");
  EXPECT_EQ(m2, "optimizer.lr: expected a number, got a string \"fast\"");
}

TEST(JobSpec, RejectsUnknownKeys) {
  auto [field, msg] = reject("epochz = 3\n" + kData);
  EXPECT_EQ(field, "epochz");
  EXPECT_EQ(msg.rfind("epochz: unknown key", 0), 0u) << msg;
  auto [f2, m2] = reject(kData + "[optimizer]\nnesterov = true\n");
  EXPECT_EQ(f2, "optimizer.nesterov");
}

TEST(JobSpec, RejectsOutOfRangeAndSyntaxErrors) {
  EXPECT_EQ(reject(kData + "[optimizer]\nmomentum = 1.0\n").second,
            "optimizer.momentum: expected a number in [0, 1), got 1");
  EXPECT_EQ(reject("sync = \"bsp\"\n" + kData).first, "sync");
  auto [field, msg] = reject("epochs = \n");
  EXPECT_EQ(field, "");
  EXPECT_EQ(msg.rfind("TOML syntax error at line 1", 0), 0u) << msg;
}

TEST(JobSpec, ConsistencyModelsTakeTheirOwnFieldsOnly) {
  const auto s = parse_job_toml("sync = \"ssp\"\nstaleness = 3\n" + kData);
  EXPECT_EQ(s.sync, ps::SyncMode::kSsp);
  EXPECT_EQ(s.staleness, 3);
  EXPECT_EQ(parse_job_toml("sync = \"ssp\"\n" + kData).staleness, 2);  // the default
  const auto b = parse_job_toml("sync = \"sync\"\nworkers = 4\nbackup_workers = 1\n" + kData +
                                "[ps]\nbarrier_timeout = \"10s\"\n");
  EXPECT_EQ(b.backup_workers, 1);
  EXPECT_DOUBLE_EQ(effective_barrier_timeout(b), 10.0);
  EXPECT_DOUBLE_EQ(effective_barrier_timeout(parse_job_toml("sync = \"sync\"\n" + kData)), 30.0);  // timeout / 2
  EXPECT_EQ(reject("staleness = 2\n" + kData).second,
            "staleness: applies only to sync = \"ssp\" (this job has sync = \"async\")");
  EXPECT_EQ(reject("sync = \"ssp\"\nbackup_workers = 1\n" + kData).second,
            "backup_workers: applies only to sync = \"sync\" (this job has sync = \"ssp\")");
  EXPECT_EQ(reject("sync = \"sync\"\nworkers = 2\nbackup_workers = 2\n" + kData).second,
            "backup_workers: must be less than workers (2), got 2");
  EXPECT_EQ(reject("sync = \"ssp\"\nstaleness = 1001\n" + kData).first, "staleness");
  EXPECT_EQ(reject("sync = \"sync\"\n" + kData + "[ps]\nbarrier_timeout = \"60s\"\n").second,
            "ps.barrier_timeout: must be less than ps.timeout (60 s), or the workers give up first; got 60 s");
  EXPECT_EQ(reject(kData + "[ps]\nbarrier_timeout = \"5s\"\n").first, "ps.barrier_timeout");
  // The JSON form carries them; a job stored before them keeps the defaults.
  nlohmann::json j = b;
  EXPECT_EQ(job_from_json(j).backup_workers, 1);
  j.erase("backup_workers");
  j.erase("staleness");
  j.erase("barrier_timeout_seconds");
  EXPECT_EQ(job_from_json(j).backup_workers, 0);
  EXPECT_EQ(job_from_json(j).staleness, 2);
}

// The job files shipped in configs/jobs parse, and say what their comments say.
TEST(JobSpec, ShippedJobFilesParse) {
  const std::filesystem::path dir = std::filesystem::path(DLTRAIN_SOURCE_DIR) / "configs" / "jobs";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NO_THROW(parse_job_toml(text.str(), dir.string(), false)) << e.path();
    ++files;
  }
  EXPECT_GE(files, 6);
  std::ifstream in(dir / "fashion-mnist-sync.toml");
  std::stringstream text;
  text << in.rdbuf();
  const auto s = parse_job_toml(text.str(), dir.string(), false);
  EXPECT_EQ(s.sync, ps::SyncMode::kBsp);
  EXPECT_TRUE(s.overlap);
  EXPECT_DOUBLE_EQ(effective_barrier_timeout(s), 30.0);
}

TEST(JobSpec, PsTimeoutIsADurationFromOneSecondToADay) {
  EXPECT_DOUBLE_EQ(parse_job_toml(kData).ps_timeout_seconds, 60.0);  // the default
  EXPECT_DOUBLE_EQ(parse_job_toml(kData + "[ps]\ntimeout = \"24h\"\n").ps_timeout_seconds, 86400.0);
  EXPECT_EQ(reject(kData + "[ps]\ntimeout = \"500ms\"\n").second,
            "ps.timeout: expected a duration in [1s, 24h], got \"500ms\"");
  EXPECT_EQ(reject(kData + "[ps]\ntimeout = \"25h\"\n").first, "ps.timeout");
  EXPECT_EQ(reject(kData + "[ps]\ntimeout = 30\n").second,
            "ps.timeout: expected a duration string such as \"60s\", got an integer 30");
  // A job JSON written before the key existed keeps the default.
  nlohmann::json j = parse_job_toml(kData);
  j.erase("ps_timeout_seconds");
  EXPECT_DOUBLE_EQ(job_from_json(j).ps_timeout_seconds, 60.0);
}

TEST(JobSpec, ResolvesRelativeDataDirAgainstTheJobFile) {
  auto s = parse_job_toml("data_dir = \"data/../fm\"\n", "/jobs", false);
  EXPECT_EQ(s.data_dir, "/jobs/fm");
}

TEST(JobSpec, ParsesDurations) {
  EXPECT_DOUBLE_EQ(parse_duration_seconds("1h30m", "deadline"), 5400.0);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("500ms", "x"), 0.5);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("1.5m", "x"), 90.0);
  EXPECT_THROW(parse_duration_seconds("soon", "deadline"), ConfigError);
}

// Found while writing tests/fuzz/fuzz_job_toml.cpp: ".s" and a number of 400 digits threw
// std::invalid_argument / std::out_of_range (from std::stod) instead of a ConfigError,
// "1.2.3s" read as 1.2 s, and a deadline of 10^305 days was infinite (and so null in the
// job's JSON, which the tasks then could not read).
TEST(JobSpec, DurationsThatDoNotParseOrOverflowAreConfigErrors) {
  const auto error_of = [](const std::string& text) -> std::string {
    try {
      parse_duration_seconds(text, "deadline");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(error_of(".s"), "deadline: expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \".s\"");
  EXPECT_EQ(error_of("1.2.3s"), "deadline: expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \"1.2.3s\"");
  EXPECT_NE(error_of(std::string(400, '9') + "s").find("expected a duration"), std::string::npos);
  EXPECT_EQ(error_of(std::string(305, '9') + "d"), "deadline: the duration \"" + std::string(305, '9') + "d\" is too long");
  EXPECT_EQ(reject(kData + "deadline = \"" + std::string(305, '9') + "d\"\n").first, "deadline");
}

// Found while writing tests/fuzz/fuzz_job_toml.cpp: job_from_json read an integer field with
// nlohmann's get<int>(), undefined behaviour for 1e300.
TEST(JobSpec, TheJsonFormTakesOnlyIntegersThatFitIntegerFields) {
  nlohmann::json j = parse_job_toml(kData);
  j["epochs"] = 1e300;
  try {
    job_from_json(j);
    FAIL() << "epochs 1e300 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected an integer in [-2147483648, 2147483647], got 1e+300"),
              std::string::npos)
        << e.what();
  }
  j = parse_job_toml(kData);
  j["batch_sizes"] = {32, 2.5};
  EXPECT_THROW(job_from_json(j), ConfigError);
  j["batch_sizes"] = {32, 64.0};
  EXPECT_EQ(job_from_json(j).batch_sizes, (std::vector<int>{32, 64}));
}

TEST(JobSpec, FreeTextAndListFieldsHaveLimits) {
  EXPECT_EQ(reject("name = \"" + std::string(300, 'x') + "\"\n" + kData).second,
            "name: at most 256 characters, got 300");
  EXPECT_EQ(parse_job_toml("name = \"" + std::string(256, 'x') + "\"\n" + kData).name.size(), 256u);
  std::string sizes = "[planner]\nbatch_sizes = [";
  for (int i = 1; i <= 65; ++i) sizes += (i > 1 ? ", " : "") + std::to_string(i);
  EXPECT_EQ(reject(kData + sizes + "]\n").second, "planner.batch_sizes: at most 64 batch sizes, got 65");
  EXPECT_EQ(reject("data_dir = \"/" + std::string(5000, 'd') + "\"\n").second,
            "data_dir: at most 4096 bytes, got 5001");
}

TEST(JobSpec, QueueTimeoutIsADurationFromOneSecondToThirtyDays) {
  EXPECT_DOUBLE_EQ(parse_job_toml(kData + "queue_timeout = \"10m\"\n").queue_timeout_seconds, 600.0);
  EXPECT_DOUBLE_EQ(parse_job_toml(kData).queue_timeout_seconds, 0.0);  // the leader's default
  EXPECT_EQ(reject(kData + "queue_timeout = \"500ms\"\n").second,
            "queue_timeout: expected a duration in [1s, 30d], got \"500ms\"");
  nlohmann::json j = parse_job_toml(kData + "queue_timeout = \"2s\"\n");
  EXPECT_DOUBLE_EQ(job_from_json(j).queue_timeout_seconds, 2.0);
}

// device, gpus_per_worker and local_group (docs/gpu.md).
TEST(JobSpec, DeviceGpusPerWorkerAndLocalGroup) {
  const auto cpu = parse_job_toml(kData);
  EXPECT_EQ(cpu.device, Device::kCpu);
  EXPECT_EQ(cpu.gpus_per_worker, 0);
  EXPECT_FALSE(cpu.local_group);
  const auto cuda = parse_job_toml(kData + "device = \"cuda\"\n");
  EXPECT_EQ(cuda.gpus_per_worker, 1);  // the default with cuda
  EXPECT_EQ(parse_job_toml(kData + "device = \"cuda\"\ngpus_per_worker = 4\n").gpus_per_worker, 4);
  EXPECT_TRUE(parse_job_toml(kData + "local_group = true\n").local_group);
  EXPECT_EQ(reject(kData + "device = \"tpu\"\n").first, "device");
  EXPECT_EQ(reject(kData + "gpus_per_worker = 1\n").second,
            "gpus_per_worker: applies only to device = \"cuda\" (this job has device = \"cpu\")");
  EXPECT_EQ(reject(kData + "device = \"cuda\"\ngpus_per_worker = 0\n").first, "gpus_per_worker");
  EXPECT_EQ(reject(kData + "device = \"cuda\"\ngpus_per_worker = 65\n").first, "gpus_per_worker");
  EXPECT_EQ(reject(kData + "local_group = true\nsync = \"sync\"\n").first, "local_group");
  EXPECT_NE(reject(kData + "local_group = true\nsync = \"ssp\"\n").second.find("needs sync = \"async\""),
            std::string::npos);
  EXPECT_EQ(reject(kData + "local_group = true\noverlap = true\n").second,
            "local_group: not with overlap = true: the group sums whole gradients before its push");
  // The JSON form carries them; a job stored before they existed is a CPU job.
  const auto back = job_from_json(nlohmann::json(parse_job_toml(kData + "device = \"cuda\"\ngpus_per_worker = 2\n"
                                                                 "local_group = true\n")));
  EXPECT_EQ(back.device, Device::kCuda);
  EXPECT_EQ(back.gpus_per_worker, 2);
  EXPECT_TRUE(back.local_group);
  nlohmann::json old = parse_job_toml(kData);
  old.erase("device");
  old.erase("gpus_per_worker");
  old.erase("local_group");
  EXPECT_EQ(job_from_json(old).device, Device::kCpu);
  nlohmann::json bad = parse_job_toml(kData);
  bad["gpus_per_worker"] = 1;  // with device = cpu
  EXPECT_THROW(job_from_json(bad), ConfigError);
}

TEST(JobSpec, MinCompressBytesAppliesToTopkAndDgcAndIsStored) {
  EXPECT_EQ(parse_job_toml(kData).compression.min_compress_bytes, 0);
  const auto dgc = parse_job_toml(kData + "[compression]\nmethod = \"dgc\"\nmin_compress_bytes = 4096\n");
  EXPECT_EQ(dgc.compression.min_compress_bytes, 4096);
  EXPECT_EQ(parse_job_toml(kData + "[compression]\nmethod = \"topk\"\nmin_compress_bytes = 1\n")
                .compression.min_compress_bytes,
            1);
  EXPECT_EQ(reject(kData + "[compression]\nmethod = \"randomk\"\nmin_compress_bytes = 4096\n").second,
            "compression.min_compress_bytes: applies only to method = \"topk\", \"dgc\" or \"powersgd\" (this job "
            "has method = \"randomk\")");
  EXPECT_EQ(reject(kData + "[compression]\nmin_compress_bytes = 4096\n").first, "compression.min_compress_bytes");
  EXPECT_EQ(reject(kData + "[compression]\nmethod = \"dgc\"\nmin_compress_bytes = -1\n").first,
            "compression.min_compress_bytes");
  // The JSON form carries it; a job stored before it existed sparsifies every tensor.
  EXPECT_EQ(job_from_json(nlohmann::json(dgc)).compression.min_compress_bytes, 4096);
  nlohmann::json old = dgc;
  old["compression"].erase("min_compress_bytes");
  EXPECT_EQ(job_from_json(old).compression.min_compress_bytes, 0);
}

TEST(JobSpec, WarmupScheduleIsPerEpochOrStagesAndIsStored) {
  EXPECT_EQ(parse_job_toml(kData).compression.warmup_schedule, compress::WarmupSchedule::kPerEpoch);
  const auto dgc = parse_job_toml(kData + "[compression]\nmethod = \"dgc\"\nwarmup_epochs = 0.25\n"
                                          "warmup_schedule = \"stages\"\n");
  EXPECT_EQ(dgc.compression.warmup_schedule, compress::WarmupSchedule::kStages);
  EXPECT_EQ(reject(kData + "[compression]\nwarmup_schedule = \"linear\"\n").second,
            "compression.warmup_schedule: expected one of per_epoch | stages, got \"linear\"");
  EXPECT_EQ(job_from_json(nlohmann::json(dgc)).compression.warmup_schedule, compress::WarmupSchedule::kStages);
  nlohmann::json old = dgc;  // stored before the key existed: the schedule it had then
  old["compression"].erase("warmup_schedule");
  EXPECT_EQ(job_from_json(old).compression.warmup_schedule, compress::WarmupSchedule::kPerEpoch);
  nlohmann::json bad = dgc;  // a job message with a schedule this build does not know
  bad["compression"]["warmup_schedule"] = "cosine";
  EXPECT_THROW(job_from_json(bad), ConfigError);
}

TEST(JobSpec, DgcAloneMeansDgcsRecipeAndKeysGivenAreKept) {
  // method = "dgc" alone: warm-up over min(1, epochs / 4) epochs in stages, tensors under
  // 16 KiB in full, the "auto" downlink (0).
  const auto dgc = parse_job_toml(kData + "epochs = 3\n[compression]\nmethod = \"dgc\"\n");
  EXPECT_DOUBLE_EQ(dgc.compression.warmup_epochs, 0.75);
  EXPECT_EQ(dgc.compression.warmup_schedule, compress::WarmupSchedule::kStages);
  EXPECT_EQ(dgc.compression.min_compress_bytes, 16384);
  EXPECT_EQ(dgc.compression.downlink_ratio, 0.0);
  EXPECT_DOUBLE_EQ(parse_job_toml(kData + "epochs = 8\n[compression]\nmethod = \"dgc\"\n").compression.warmup_epochs,
                   1.0);
  EXPECT_TRUE(compression_warnings(dgc).empty());
  // Every key given is kept, and the settings known to cost accuracy are warned about.
  const auto bare = parse_job_toml(kData + "workers = 4\n[compression]\nmethod = \"dgc\"\nratio = 0.01\n"
                                           "warmup_epochs = 0\nmin_compress_bytes = 0\ndownlink_ratio = 0.02\n");
  EXPECT_EQ(bare.compression.warmup_epochs, 0.0);
  EXPECT_EQ(bare.compression.min_compress_bytes, 0);
  EXPECT_DOUBLE_EQ(bare.compression.downlink_ratio, 0.02);
  const auto w = compression_warnings(bare);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].rfind("compression.warmup_epochs = 0:", 0), 0u);
  EXPECT_EQ(w[1].rfind("compression.min_compress_bytes = 0:", 0), 0u);
  EXPECT_EQ(w[2], "compression.downlink_ratio = 0.02 is below what 4 workers push between two pulls (4 x ratio "
                  "0.01): updates reach the workers late; write downlink_ratio = \"auto\"");
  // "auto" is a downlink_ratio; with a dense uplink it means dense pulls.
  EXPECT_EQ(parse_job_toml(kData + "[compression]\nmethod = \"topk\"\ndownlink_ratio = \"auto\"\n")
                .compression.downlink_ratio,
            0.0);
  // fp16: "auto", its default, is the binary16 downlink; an explicit 1 keeps dense fp32 pulls.
  for (const std::string down : {"", "downlink_ratio = \"auto\"\n"}) {
    const auto fp16 = parse_job_toml(kData + "[compression]\nmethod = \"fp16\"\n" + down).compression;
    EXPECT_EQ(fp16.downlink_ratio, 0.0) << down;
    EXPECT_TRUE(compress::half_downlink(fp16)) << down;
    EXPECT_TRUE(compress::keeps_x_seen(fp16)) << down;
    EXPECT_EQ(compress::downlink_density(fp16, 0.5, 4, 0.0), 1.0) << down;
  }
  const auto fp16_dense = parse_job_toml(kData + "[compression]\nmethod = \"fp16\"\ndownlink_ratio = 1\n").compression;
  EXPECT_EQ(fp16_dense.downlink_ratio, 1.0);
  EXPECT_FALSE(compress::half_downlink(fp16_dense));
  EXPECT_FALSE(compress::keeps_x_seen(fp16_dense));
  EXPECT_EQ(parse_job_toml(kData + "[compression]\nmethod = \"none\"\ndownlink_ratio = \"auto\"\n")
                .compression.downlink_ratio,
            1.0);
  EXPECT_EQ(reject(kData + "[compression]\nmethod = \"dgc\"\ndownlink_ratio = \"half\"\n").second,
            "compression.downlink_ratio: expected a number in (0, 1] or \"auto\", got \"half\"");
  // Other methods keep their plain defaults.
  const auto topk = parse_job_toml(kData + "[compression]\nmethod = \"topk\"\n");
  EXPECT_EQ(topk.compression.warmup_epochs, 0.0);
  EXPECT_EQ(topk.compression.downlink_ratio, 1.0);
  // The JSON form carries "auto" as 0.
  EXPECT_EQ(job_from_json(nlohmann::json(dgc)).compression.downlink_ratio, 0.0);
}

TEST(JobSpec, PowerSgdTakesARankAndMinCompressBytes) {
  const auto p = parse_job_toml(kData + "[compression]\nmethod = \"powersgd\"\nrank = 2\nmin_compress_bytes = 1024\n");
  EXPECT_EQ(p.compression.method, compress::Method::kPowerSgd);
  EXPECT_EQ(p.compression.rank, 2);
  EXPECT_EQ(p.compression.min_compress_bytes, 1024);
  EXPECT_EQ(p.compression.downlink_ratio, 0.0);  // "auto": the low-rank downlink
  EXPECT_EQ(parse_job_toml(kData + "[compression]\nmethod = \"powersgd\"\ndownlink_ratio = 0.01\n")
                .compression.downlink_ratio,
            0.01);
  EXPECT_EQ(job_from_json(nlohmann::json(p)).compression.rank, 2);
  EXPECT_EQ(parse_job_toml(kData + "[compression]\nmethod = \"powersgd\"\n").compression.rank, 4);
  EXPECT_EQ(reject(kData + "[compression]\nmethod = \"powersgd\"\nrank = 0\n").first, "compression.rank");
  EXPECT_EQ(reject(kData + "[compression]\nmethod = \"powersgd\"\nrank = 65\n").first, "compression.rank");
  EXPECT_TRUE(compression_warnings(p).empty());
}

TEST(JobSpec, ATorchScriptModelNamesItsFileWhichIsCheckedAndStored) {
  const auto ts = parse_job_toml(kData + "model = \"torchscript\"\nmodel_file = \"nets/cnn.pt\"\n", "/jobs", false);
  EXPECT_EQ(ts.model, ModelKind::kTorchScript);
  EXPECT_EQ(ts.model_file, "/jobs/nets/cnn.pt");  // relative to the job file
  EXPECT_EQ(job_from_json(nlohmann::json(ts)).model_file, "/jobs/nets/cnn.pt");
  EXPECT_EQ(reject(kData + "model = \"torchscript\"\n").first, "model_file");
  EXPECT_EQ(reject(kData + "model = \"cnn\"\nmodel_file = \"a.pt\"\n").second,
            "model_file: applies only to model = \"torchscript\" (this job has model = \"cnn\")");
  EXPECT_EQ(reject(kData + "model = \"torchscript\"\nmodel_file = \"a.pt\"\nworkers = \"auto\"\n").first, "workers");
  // With the files checked: one that is not a zip archive is refused naming it.
  const dltrain::testing::TempDir dir("dltrain-model-file");
  const std::string text = (dir.path / "notes.pt").string();
  std::ofstream(text) << "not a model\n";
  try {
    parse_job_toml(kData + "model = \"torchscript\"\nmodel_file = \"" + text + "\"\n", "/", true);
    ADD_FAILURE() << "accepted a text file as a model";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "model_file: \"" + text + "\" is not a TorchScript archive (torch.jit.save writes a "
                                     "zip file; this one does not start like one)");
  }
  try {
    parse_job_toml(kData + "model = \"torchscript\"\nmodel_file = \"" + text + ".missing\"\n", "/", true);
    ADD_FAILURE() << "accepted a missing file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a file on the leader"), std::string::npos) << e.what();
  }
}

TEST(JobSpec, AnUploadedModelFileIsCheckedInTheUsersPathsSteadAndStartingPointsAreStored) {
  const dltrain::testing::TempDir dir("dltrain-uploaded-model");
  const std::string copy = (dir.path / "0123.pt").string();
  std::ofstream(copy) << "PK\x03\x04 a zip's first bytes";
  // The user's path exists only on the client: the leader checks its own copy, and
  // messages and the stored spec keep naming the user's file.
  const auto s = parse_job_toml(kData + "model = \"torchscript\"\nmodel_file = \"/home/me/net.pt\"\n"
                                        "init_from = \"job-3\"\n", "/", true, copy);
  EXPECT_EQ(s.model_file, "/home/me/net.pt");
  EXPECT_EQ(s.init_from, "job-3");
  auto stored = s;
  stored.model_sha256 = std::string(64, 'a');
  stored.init_sha256 = std::string(64, 'b');
  const auto back = job_from_json(nlohmann::json(stored));
  EXPECT_EQ(back.model_sha256, stored.model_sha256);
  EXPECT_EQ(back.init_sha256, stored.init_sha256);
  EXPECT_EQ(back.init_from, "job-3");
  std::ofstream(copy) << "not a model";
  try {
    parse_job_toml(kData + "model = \"torchscript\"\nmodel_file = \"/home/me/net.pt\"\n", "/", true, copy);
    ADD_FAILURE() << "accepted a text file as a model";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "model_file: \"/home/me/net.pt\" is not a TorchScript archive (torch.jit.save "
                                     "writes a zip file; this one does not start like one)");
  }
}

TEST(JobSpec, CheckpointsAreOptionalSettingsThatAreStored) {
  const auto none = parse_job_toml(kData);
  EXPECT_EQ(none.checkpoint.every_epochs, 0);
  EXPECT_FALSE(none.checkpoint.best);
  const auto s = parse_job_toml(kData + "[checkpoint]\nevery_epochs = 2\nbest = true\n");
  EXPECT_EQ(s.checkpoint.every_epochs, 2);
  EXPECT_TRUE(s.checkpoint.best);
  const auto back = job_from_json(nlohmann::json(s));
  EXPECT_EQ(back.checkpoint.every_epochs, 2);
  EXPECT_TRUE(back.checkpoint.best);
  EXPECT_EQ(reject(kData + "[checkpoint]\nevery_epochs = -1\n").first, "checkpoint.every_epochs");
  EXPECT_EQ(reject(kData + "[checkpoint]\nlatest = true\n").first, "checkpoint.latest");
}

TEST(JobSpec, EvalBatchSizeIsASettingFromOneTo65536AndIsStored) {
  EXPECT_EQ(parse_job_toml(kData).eval_batch_size, 128);  // the documented default
  const auto s = parse_job_toml(kData + "eval_batch_size = 500\n");
  EXPECT_EQ(s.eval_batch_size, 500);
  EXPECT_EQ(parse_job_toml(kData + "eval_batch_size = 1\n").eval_batch_size, 1);
  EXPECT_EQ(parse_job_toml(kData + "eval_batch_size = 65536\n").eval_batch_size, 65536);
  EXPECT_EQ(reject(kData + "eval_batch_size = 0\n").first, "eval_batch_size");
  EXPECT_EQ(reject(kData + "eval_batch_size = 65537\n").first, "eval_batch_size");
  EXPECT_EQ(reject(kData + "eval_batch_size = \"big\"\n").first, "eval_batch_size");
  // The JSON form carries it; a job stored before it existed evaluates with the default.
  EXPECT_EQ(job_from_json(nlohmann::json(s)).eval_batch_size, 500);
  nlohmann::json old = s;
  old.erase("eval_batch_size");
  EXPECT_EQ(job_from_json(old).eval_batch_size, 128);
}

TEST(JobSpec, PsShardsAreAutoUnlessTheJobFileGivesANumber) {
  // Left out: "auto" with the one shard a job needs at least (the leader adds more).
  const auto a = parse_job_toml(kData);
  EXPECT_TRUE(a.ps_shards_auto);
  EXPECT_EQ(a.ps_shards, 1);
  const auto b = parse_job_toml(kData + "ps_shards = \"auto\"\n");
  EXPECT_TRUE(b.ps_shards_auto);
  const auto c = parse_job_toml(kData + "ps_shards = 3\n");
  EXPECT_FALSE(c.ps_shards_auto);
  EXPECT_EQ(c.ps_shards, 3);
  EXPECT_EQ(reject(kData + "ps_shards = 0\n").first, "ps_shards");
  EXPECT_EQ(reject(kData + "ps_shards = 257\n").first, "ps_shards");
  EXPECT_EQ(reject(kData + "ps_shards = \"many\"\n").first, "ps_shards");
  expect_auto_flag_stored(a, c, &JobSpec::ps_shards_auto, "ps_shards_auto");
}

TEST(JobSpec, PartitionSizeIsAutoUnlessTheJobFileGivesANumber) {
  const auto a = parse_job_toml(kData);
  EXPECT_TRUE(a.partition_size_auto);
  EXPECT_EQ(a.partition_size, 262144);  // where the leader's choice starts
  const auto b = parse_job_toml(kData + "[ps]\ntimeout = \"30s\"\n");
  EXPECT_TRUE(b.partition_size_auto);
  const auto c = parse_job_toml(kData + "[ps]\npartition_size = \"auto\"\n");
  EXPECT_TRUE(c.partition_size_auto);
  const auto d = parse_job_toml(kData + "[ps]\npartition_size = 16384\n");
  EXPECT_FALSE(d.partition_size_auto);
  EXPECT_EQ(d.partition_size, 16384);
  EXPECT_EQ(reject(kData + "[ps]\npartition_size = 0\n").first, "ps.partition_size");
  EXPECT_EQ(reject(kData + "[ps]\npartition_size = \"big\"\n").first, "ps.partition_size");
  expect_auto_flag_stored(a, d, &JobSpec::partition_size_auto, "partition_size_auto");
}

TEST(JobSpec, CompressionMethodAutoLeavesTheChoiceToThePlannerAndTakesNoOtherKey) {
  const std::string base = kData + "model = \"mlp\"\nepochs = 4\n[compression]\nmethod = \"auto\"\n";
  const auto s = parse_job_toml(base);
  EXPECT_TRUE(s.compression.method_auto);
  EXPECT_EQ(s.compression.method, compress::Method::kNone);  // until the planner chose
  const auto back = job_from_json(nlohmann::json(s));
  EXPECT_TRUE(back.compression.method_auto);
  // Stored before the key existed: a method the file named.
  auto old = nlohmann::json(s);
  old["compression"].erase("method_auto");
  EXPECT_FALSE(job_from_json(old).compression.method_auto);
  // A setting of one method would be wrong for another: refused, naming the key.
  const auto [field, message] = reject(base + "ratio = 0.01\n");
  EXPECT_EQ(field, "compression.ratio");
  EXPECT_NE(message.find("not with method = \"auto\""), std::string::npos) << message;
  EXPECT_EQ(reject(base + "warmup_epochs = 1\n").first, "compression.warmup_epochs");
  const auto [bad_field, bad_message] = reject(kData + "[compression]\nmethod = \"Auto\"\n");
  EXPECT_EQ(bad_field, "compression.method");
  EXPECT_NE(bad_message.find("got \"Auto\" (or \"auto\": the planner chooses)"), std::string::npos) << bad_message;
}

TEST(JobSpec, ASharedDataSetIsNamedByDataAlone) {
  // A URL: the manifest is the leader's to read (not parse_job_toml's); image size and
  // channels wait for it.
  auto s = parse_job_toml("model = \"mlp\"\ndata = \"http://files:8080/fm\"\n", "/tmp", true);
  EXPECT_EQ(s.dataset, DatasetKind::kShards);
  EXPECT_EQ(s.data, "http://files:8080/fm");
  EXPECT_EQ(s.image_size, 0);
  EXPECT_EQ(job_from_json(nlohmann::json(s)).data, s.data);
  // The history key: kind, last component and a hash of the whole location.
  const auto label = dataset_label(s);
  EXPECT_EQ(label.rfind("shards-fm-", 0), 0u) << label;
  EXPECT_EQ(label.size(), std::string("shards-fm-").size() + 8);
  auto other = s;
  other.data = "http://other:8080/fm";
  EXPECT_NE(dataset_label(other), label);
  EXPECT_EQ(dataset_label(parse_job_toml("model = \"mlp\"\n" + kData, "/tmp", true)), "fashion-mnist");

  // Misuse names the field.
  EXPECT_EQ(reject("model = \"mlp\"\ndata = \"http://h/x\"\ndataset = \"cifar10\"\n").first, "dataset");
  EXPECT_EQ(reject("model = \"mlp\"\ndata = \"http://h/x\"\n" + kData).first, "data_dir");
  EXPECT_EQ(reject("model = \"mlp\"\ndataset = \"shards\"\n").first, "data");
  EXPECT_EQ(reject("model = \"mlp\"\ndata = \"ftp://h/x\"\n").first, "data");
  EXPECT_EQ(reject("model = \"mlp\"\ndata = \"s3:///x\"\n").first, "data");
  EXPECT_EQ(reject("model = \"mlp\"\ndata = \"s3://b/x\"\ntrain_samples = 100\n").first, "train_samples");
  EXPECT_EQ(reject("model = \"mlp\"\ndataset = \"cifar10\"\ndata_dir = \"/nonexistent\"\n").first, "data_dir");
  // A path: resolved against the job file's directory; its manifest is read and checked.
  dltrain::testing::TempDir dir;
  const auto [field, what] = reject("model = \"mlp\"\ndata = \"" + (dir.path / "fm").string() + "\"\n");
  EXPECT_EQ(field, "data");
  EXPECT_NE(what.find("manifest.json"), std::string::npos) << what;
  std::filesystem::create_directories(dir.path / "fm");
  std::ofstream(dir.path / "fm" / "manifest.json") << "{\"format\": \"dltrain-shards/1\"}";
  EXPECT_THROW(parse_job_toml("model = \"mlp\"\ndata = \"fm\"\n", dir.path.string(), true), ConfigError);
  EXPECT_EQ(parse_job_toml("model = \"mlp\"\ndata = \"fm\"\n", dir.path.string(), false).data, (dir.path / "fm").string());
}

TEST(JobSpec, AManifestSetsImageSizeAndChannelsUnlessTheJobDoes) {
  data::Manifest m;
  m.classes = {"a", "b"};
  m.train.shards = {{"t.tar", 3, 4096, std::string(64, 'a')}};
  m.train.samples = 3;
  m.test = m.train;
  m.channels = 3;
  m.image_size = 2000;  // clamped to the largest image_size
  m.mean = {0.5f, 0.5f, 0.5f};
  m.std = {0.2f, 0.2f, 0.2f};
  auto s = parse_job_toml("model = \"mlp\"\ndata = \"http://h/x\"\nworkers = 2\n", "/tmp", false);
  apply_manifest(s, m);
  EXPECT_EQ(s.image_size, 1024);
  EXPECT_EQ(s.channels, 3);
  auto fixed = parse_job_toml("model = \"mlp\"\ndata = \"http://h/x\"\nimage_size = 32\nchannels = 1\n", "/tmp", false);
  apply_manifest(fixed, m);
  EXPECT_EQ(fixed.image_size, 32);
  EXPECT_EQ(fixed.channels, 1);
  auto many = parse_job_toml("model = \"mlp\"\ndata = \"http://h/x\"\nworkers = 4\n", "/tmp", false);
  try {
    apply_manifest(many, m);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data");
    EXPECT_NE(std::string(e.what()).find("3 training samples cannot feed 4 workers"), std::string::npos);
  }
}

// [elastic]: bounds around the starting size, min_workers defaulting to 1, the JSON form
// keeping them; each mistake refused naming its key.
TEST(JobSpec, ElasticBoundsParseStoreAndAreChecked) {
  auto j = parse_job_toml(kData + "workers = 2\n[elastic]\nmax_workers = 4\n", "/tmp", true);
  EXPECT_TRUE(j.elastic.on());
  EXPECT_EQ(j.elastic.min_workers, 1);
  EXPECT_EQ(j.elastic.max_workers, 4);
  const auto back = job_from_json(nlohmann::json(j));
  EXPECT_EQ(back.elastic.min_workers, 1);
  EXPECT_EQ(back.elastic.max_workers, 4);
  EXPECT_FALSE(parse_job_toml(kData + "workers = 2\n", "/tmp", true).elastic.on());
  EXPECT_EQ(reject(kData + "workers = 2\n[elastic]\nmin_workers = 1\n").first, "elastic.max_workers");
  const auto outside = reject(kData + "workers = 5\n[elastic]\nmin_workers = 1\nmax_workers = 4\n");
  EXPECT_EQ(outside.first, "elastic");
  EXPECT_NE(outside.second.find("[1, 4]"), std::string::npos) << outside.second;
  EXPECT_EQ(reject(kData + "workers = 2\n[elastic]\nmin_workers = 3\nmax_workers = 4\n").first, "elastic");
  EXPECT_EQ(reject(kData + "workers = 2\n[elastic]\nmax_workers = 2000\n").first, "elastic.max_workers");
  EXPECT_EQ(reject(kData + "workers = 2\nlocal_group = true\n[elastic]\nmax_workers = 4\n").first, "elastic");
  EXPECT_EQ(reject(kData + "workers = \"auto\"\n[elastic]\nmax_workers = 4\n").first, "elastic");
  EXPECT_EQ(reject(kData + "workers = 2\nsync = \"sync\"\nbackup_workers = 1\n[elastic]\nmax_workers = 4\n").first,
            "backup_workers");
}
