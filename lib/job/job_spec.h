// A training job as the user describes it in a job file (TOML), validated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/compression_spec.h"
#include "common/enum_names.h"
#include "common/sync_mode.h"
#include "data/augment.h"

namespace dltrain::data {
struct Manifest;  // data/shards.h
}  // namespace dltrain::data

namespace dltrain {

/// The built-in networks (train/models.h) and a user's TorchScript module (job `model`).
enum class ModelKind { kCnn, kMlp, kMlpLarge, kResnet20, kResnet18, kTorchScript };
/// The data set layouts a worker reads (job `dataset`; docs/training.md, "Data sets").
enum class DatasetKind {
  kFashionMnist,  ///< IDX files, 28×28 gray, 10 classes
  kMnist,         ///< IDX files
  kCifar10,       ///< CIFAR-10's binary version
  kImageFolder,   ///< data_dir/train/<class>/*.jpg|png, data_dir/test|val/<class>/…
  kShards,        ///< a sharded data set (data/shards.h) at `data`, read through the agents' shard caches
};
/// Where workers train (job `device`; docs/gpu.md).
enum class Device { kCpu, kCuda };
/// The learning-rate schedule after warm-up (job `optimizer.lr_schedule`; train/trainer.h).
enum class LrSchedule { kConstant, kCosine, kStep };

template <>
struct EnumNames<ModelKind> {
  static constexpr std::array<EnumName<ModelKind>, 6> kNames{{{ModelKind::kCnn, "cnn"},
                                                              {ModelKind::kMlp, "mlp"},
                                                              {ModelKind::kMlpLarge, "mlp-large"},
                                                              {ModelKind::kResnet20, "resnet20"},
                                                              {ModelKind::kResnet18, "resnet18"},
                                                              {ModelKind::kTorchScript, "torchscript"}}};
};
template <>
struct EnumNames<DatasetKind> {
  static constexpr std::array<EnumName<DatasetKind>, 5> kNames{{{DatasetKind::kFashionMnist, "fashion-mnist"},
                                                                {DatasetKind::kMnist, "mnist"},
                                                                {DatasetKind::kCifar10, "cifar10"},
                                                                {DatasetKind::kImageFolder, "imagefolder"},
                                                                {DatasetKind::kShards, "shards"}}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::array<EnumName<Device>, 2> kNames{{{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}}};
};
template <>
struct EnumNames<LrSchedule> {
  static constexpr std::array<EnumName<LrSchedule>, 3> kNames{
      {{LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"}, {LrSchedule::kStep, "step"}}};
};

/// [checkpoint]: the models a job keeps besides its last one (docs/training.md, "The
/// trained model"), each written by worker 0 at an evaluation and collected by the leader
/// when the job ends.
struct CheckpointSpec {
  int every_epochs = 0;  ///< also the model after every N epochs ("epoch-N"), [0, 1000]; 0 = none
  bool best = false;     ///< also the model of the best test accuracy so far ("best")
};

/// [elastic]: the job may be resized while it runs (`dltrain scale`, docs/training.md
/// "Elastic jobs"), within these bounds on its workers; `workers` is its starting size.
/// Both 0: a fixed-size job.
struct ElasticSpec {
  int min_workers = 0;  ///< [1, workers]; 1 when the table gives only max_workers
  int max_workers = 0;  ///< [workers, 1024]; required in the table
  /// Whether the job is elastic (the table gave max_workers).
  bool on() const { return max_workers > 0; }
};

/// Optimizer settings applied by the PS shards (momentum SGD) and the learning-rate
/// schedule the workers follow.
struct OptimizerSpec {
  double lr = 0.05;            ///< peak learning rate, (0, 10]
  double momentum = 0.9;       ///< PS-side heavy-ball momentum, [0, 1)
  double weight_decay = 5e-4;  ///< L2 penalty added to the worker's gradient, [0, 1)
  LrSchedule lr_schedule = LrSchedule::kCosine;
  double warmup_epochs = 0.5;  ///< linear learning-rate warm-up, in epochs, [0, epochs)
};

/// Longest job name accepted, in characters (bytes).
inline constexpr std::size_t kMaxJobNameLength = 256;
/// Longest data_dir accepted, in bytes (PATH_MAX).
inline constexpr std::size_t kMaxPathLength = 4096;
/// Most candidate batch sizes in [planner] batch_sizes.
inline constexpr std::size_t kMaxBatchSizes = 64;
/// The largest model_file accepted (bytes): 2 GiB, beyond what a PS shard's single
/// partition layout is sized for on the machines dltrain targets.
inline constexpr std::uintmax_t kMaxModelFileBytes = std::uintmax_t{2} << 30;
/// Where an uploaded model_file (JobSpec::model_sha256) is in a worker's task directory:
/// its agent puts the leader's copy there before the worker starts.
inline constexpr const char* kUploadedModelFile = "model_file.pt";
/// Where init_from's state_dict (JobSpec::init_sha256) is in a worker's task directory.
inline constexpr const char* kInitStateDictFile = "init_state_dict.pt";

/// A validated job. Field ranges are enforced by parse_job_toml(); the JSON form
/// (to_json / job_from_json) is what the leader sends to tasks.
struct JobSpec {
  std::string name = "job";        ///< free text shown in `dltrain list`
  ModelKind model = ModelKind::kCnn;
  /// model = "torchscript": the TorchScript archive (torch.jit.save) to train, absolute
  /// after parsing; the same path must hold the same file on every agent.
  std::string model_file;
  /// model = "torchscript" sent by `dltrain submit`: the SHA-256 (hex) of the file's content,
  /// which the client uploaded to the leader; each worker's agent fetches that content from
  /// the leader into the worker's task directory (kUploadedModelFile), and model_file only
  /// names it in messages. "" = model_file is read at its path (a shared file system).
  std::string model_sha256;
  /// Fine-tuning: the trained model to start from, a job id whose model the leader keeps
  /// ("job-3") or a model directory that `dltrain model get` wrote (on the client; relative
  /// to the job file). "" = fresh initial values.
  std::string init_from;
  /// init_from's state_dict.pt as the leader holds it (SHA-256, hex; set by the leader):
  /// each worker's agent fetches it into the task directory (kInitStateDictFile).
  std::string init_sha256;
  DatasetKind dataset = DatasetKind::kFashionMnist;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  ///< absolute after parsing
  /// A sharded data set's location (dataset = "shards"; docs/data.md): the directory or URL
  /// prefix that holds manifest.json and the shards — an absolute path (a local copy or a
  /// shared file system), file://, http(s)://, or s3://bucket/prefix. "" for the others.
  std::string data;
  /// Network input height and width in pixels, [8, 1024]: images are resized (shorter
  /// side) and centre-cropped to it. parse_job_toml sets the data set's default when the
  /// job file has none: 28 (IDX), 32 (cifar10), 224 (imagefolder).
  int image_size = 0;
  /// Input channels, 1 (gray) or 3 (RGB); default 1 for IDX, 3 otherwise (set by
  /// parse_job_toml). Images with the other count are converted (data/image.h).
  int channels = 0;
  /// Per-channel mean and standard deviation of pixel/255 used to standardise inputs:
  /// empty = the published figures for IDX, computed by every worker on the same seeded
  /// sample of 512 training images otherwise (and reported in its "data" event).
  std::vector<double> mean, std;
  /// Decoding and augmentation threads of each worker, [0, 64]; 0 = threads_per_task.
  int loader_threads = 0;
  /// Batches the loader may hold ready or in progress, [0, 1024]; 0 = 2 × loader_threads.
  int loader_queue = 0;
  /// ImageFolder: MiB of decoded pixels each worker keeps after an image's first decode,
  /// per split (train, and test on the evaluating worker), [0, 1048576]; 0 = decode every
  /// time. Later epochs copy a kept image instead of reading and decoding its file.
  std::int64_t loader_cache_mb = 256;
  data::AugmentSpec augment;       ///< [augment]: training-time augmentation, all off by default
  int epochs = 6;                  ///< passes over the training set, [1, 1000]
  int workers = 2;                 ///< worker tasks, [1, 1024]
  /// PS shard tasks, [1, 256]; with ps_shards_auto the one shard the job needs at least,
  /// until the leader starts it and fixes the count.
  int ps_shards = 1;
  int batch_size = 64;             ///< images per worker step, [1, 65536]
  int threads_per_task = 1;        ///< cores given to each task, [1, 256]
  /// Consistency model (ps/sync.h, docs/training.md "Consistency models"): async (ASGD),
  /// ssp (bounded staleness, Ho et al. 2013) or sync (BSP through the PS).
  ps::SyncMode sync = ps::SyncMode::kAsync;
  /// sync = ssp: the most steps a worker may be ahead of the slowest, [0, 1000].
  int staleness = 2;
  /// sync = "sync": pushes a step may go without (Chen et al. 2016), [0, workers).
  int backup_workers = 0;
  /// Push each partition from the backward pass as soon as its gradient is complete
  /// (docs/training.md, "Overlap"); not with compression.clip_norm > 0.
  bool overlap = false;
  /// Where workers train (docs/gpu.md): kCuda is LibTorch's CUDA device (needs a
  /// CUDA-enabled LibTorch and agents that offer GPUs). PS shards always run on the CPU.
  Device device = Device::kCpu;
  /// device = "cuda": GPUs given to each worker, [1, 64]; the leader places a worker only
  /// on an agent with this many free GPUs and starts it with CUDA_VISIBLE_DEVICES naming
  /// them. 0 after parsing a CPU job.
  int gpus_per_worker = 0;
  /// The workers of this job placed on one agent form a local group (group/local_group.h):
  /// they sum their gradients inside the machine (NCCL with cuda, loopback sockets with
  /// cpu) and one of them pushes the sum and shares the pulled parameters (BytePS's split).
  /// Only with sync = "async" and overlap = false.
  bool local_group = false;
  std::int64_t seed = 1;           ///< seeds model initialisation and data shuffling
  std::int64_t train_samples = 0;  ///< use the first N training images; 0 = all
  std::int64_t test_samples = 0;   ///< evaluate on the first N test images; 0 = all
  /// Images per forward pass when worker 0 evaluates the test set (and when the planner
  /// profiles evaluation), [1, 65536]. Evaluation's speed barely depends on it once the
  /// allocator keeps large blocks (docs/training.md, "Evaluation"); large values cost
  /// memory (activations of the whole batch at once).
  int eval_batch_size = 128;
  /// [ps] partition_size: max floats per PS partition, [1, 2^26]; with
  /// partition_size_auto the default the leader starts from (262,144).
  std::int64_t partition_size = 262144;
  /// [ps] timeout: seconds the PS shards may stay silent within one worker call before
  /// the worker gives up (ps::PsClientOptions::timeout), [1, 86400]
  double ps_timeout_seconds = 60;
  /// [ps] barrier_timeout: seconds a pull waits in ssp/sync before the shard drops the
  /// workers it waits for (ps::SyncOptions::barrier_timeout), below ps.timeout; 0 = half
  /// of ps.timeout.
  double barrier_timeout_seconds = 0;
  OptimizerSpec optimizer;
  CheckpointSpec checkpoint;
  ElasticSpec elastic;
  compress::CompressionSpec compression;  ///< [compression]; method none = dense ASGD

  // Planner (docs/planner.md).
  bool workers_auto = false;        ///< workers = "auto": the leader's planner chooses
  /// ps_shards = "auto", what a job file that leaves ps_shards out gets: the leader starts
  /// the job with one PS shard, plus one beside the workers on every other machine that
  /// holds some of them and has a free task slot, so that no link carries every worker's
  /// traffic (leader/placement.h, spread_shards; docs/training.md, "PS shards"). The
  /// leader sets the count in ps_shards and clears this when the job first starts.
  bool ps_shards_auto = false;
  /// [ps] partition_size = "auto", what a job file that leaves it out gets: when the job
  /// first starts, with its shard count fixed, the leader sets partition_size so that the
  /// shards hold even shares of a built-in model (planner::balanced_partition_size), and
  /// clears this; a TorchScript model keeps the default. Also lets ps_shards = "auto"
  /// spread a model smaller than one default partition.
  bool partition_size_auto = false;
  bool batch_auto = false;          ///< batch_size = "auto": the leader's planner chooses
  double target_accuracy = 0;       ///< final test accuracy to reach, (0, 1]; 0 = none
  double deadline_seconds = 0;      ///< wall time from start to end, > 0; 0 = none
  /// queue_timeout: seconds the job may wait in the queue before it fails with the
  /// reason, [1, 2592000]; 0 = the leader's queue_timeout (whose default is none).
  double queue_timeout_seconds = 0;
  std::vector<int> batch_sizes{32, 64, 128, 256};  ///< [planner] candidate per-worker batches
  int max_workers = 0;              ///< [planner] upper bound on workers; 0 = what fits
  double price_per_task_hour = 0;   ///< [planner] cost of one task for an hour; 0 = leader's price

  // Set by the leader for exploration runs; not accepted from job files.
  std::int64_t max_steps = 0;       ///< stop after this many steps per worker; 0 = no limit
  bool profile = false;             ///< measure throughput only (no evaluation)
};

/// True for the data sets held in IDX files (fashion-mnist, mnist).
bool is_idx_dataset(DatasetKind dataset);

/// The checks of a job's values that depend on each other (the consistency model's
/// fields, device and GPUs, local groups, warm-ups shorter than the job, data shapes, a
/// TorchScript model's file): the one validation that parse_job_toml and job_from_json
/// both end with. Fills the data fields left at 0 (apply_data_defaults). Throws
/// ConfigError naming the field. Thread-safe.
void validate_job(JobSpec& spec);

/// Fills the data fields a job left at 0 with its data set's defaults (image_size 28 /
/// 32 / 224, channels 1 / 3) and checks the fields that depend on each other (mean and
/// std: one value per channel, given together; augment.crop_padding < image_size).
/// parse_job_toml and job_from_json call it; so does the worker, for a JobSpec built in
/// code. Throws ConfigError naming the field.
void apply_data_defaults(JobSpec& spec);

/// Momentum the PS shards apply: 0 with dgc (its momentum lives at the workers, DGC
/// §3.2), optimizer.momentum otherwise.
double ps_momentum(const JobSpec& spec);

/// Settings of a job's [compression] known to cost accuracy (docs/compression.md,
/// "Defaults"), each as a sentence naming the key and what to write instead: a sparse
/// method without warm-up, every tensor sparsified (min_compress_bytes = 0), a fixed
/// downlink density below what the workers push between two pulls. Empty when none.
/// The leader returns them with the submit's reply; the client prints them. Thread-safe.
std::vector<std::string> compression_warnings(const JobSpec& spec);

/// The barrier timeout of a job's PS shards in ssp/sync, s: [ps] barrier_timeout, or half
/// of ps.timeout when it is not given.
double effective_barrier_timeout(const JobSpec& spec);

/// A sharded data set's manifest applied to its job: image_size and channels take the
/// manifest's when the job file has none (image_size clamped to [8, 1024]). Throws
/// ConfigError("data", …) when the data set has fewer training samples than the job has
/// workers (a fixed count), or the job's mean/std do not fit its channels.
void apply_manifest(JobSpec& spec, const data::Manifest& manifest);

/// The data set's name in the performance history and the plan's key: the dataset kind;
/// for a sharded data set "shards-<last component of data>-<first 8 hex digits of
/// SHA-256(data)>", so that two sharded data sets never share a history.
std::string dataset_label(const JobSpec& spec);

/// Parses and validates a job file's text. Relative `data_dir` values are resolved
/// against `base_dir` (the job file's directory). When `check_files` is true the data
/// directory must exist and hold the dataset: the four IDX files, the six CIFAR-10
/// files (whole records), or a valid ImageFolder layout (data/imagefolder.h; listed, not
/// decoded).
/// Throws ConfigError naming the offending field ("batch_size", "optimizer.lr", or the
/// unknown key) for a TOML syntax error, a wrong type, an out-of-range value, an unknown
/// key or a missing data directory. With `uploaded_model` (a torchscript job whose file the
/// client uploaded: the leader's copy), check_files checks that file in model_file's stead.
/// Thread-safe (no shared state).
JobSpec parse_job_toml(const std::string& text, const std::string& base_dir = ".", bool check_files = true,
                       const std::string& uploaded_model = "");

/// JSON form of a job (every field, flat except "optimizer").
void to_json(nlohmann::json& j, const JobSpec& spec);
/// Inverse of to_json, then validate_job; throws ConfigError on a missing or mistyped
/// field (an integer field takes only an integer that fits it, json_fields::get_value; a
/// closed set only one of its names) or values validate_job refuses.
JobSpec job_from_json(const nlohmann::json& j);
/// nlohmann's hook (so that a JobSpec is a field of a message body, json_fields): as
/// job_from_json, whose ConfigError it throws.
void from_json(const nlohmann::json& j, JobSpec& spec);


}  // namespace dltrain
