// The events of a job: what a task reports on its stdout (one JSON object per line), what
// its agent adds, and what the leader relays to the clients that follow the job. One
// definition (names, types, units) used by every sender and every reader: the worker
// (train/trainer.cpp, worker_end.cpp, step_reporter.cpp), the PS task (daemon/ps_main.cpp),
// the agent, the leader and the client. docs/protocol.md ("Task events") lists them with their meaning.
// The leader's own events about a job (its state, plan, recovery, resizes, waits) are in
// wire/leader_events.h; its failure and summary are here.
//
// Every event is a JSON object whose "event" field names its kind. Each kind has a plain
// struct here with
//   - `kKind`, the value of "event";
//   - `to_json()`, the builder: {"event": kKind, <fields>};
//   - `from_json(j)`, the reader: fields absent from `j` keep their defaults (an older or
//     newer sender may omit some); a field of the wrong JSON type throws
//     nlohmann::json::type_error.
// Relayed events also carry "task" (e.g. "worker-1", added by the leader) and "job"
// (added to every event a follower receives); readers ignore fields they do not know.
// Thread-safety: plain values; none is shared.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_fields.h"
#include "common/sync_mode.h"

namespace dltrain::wire::events {

using json_fields::Fields;
using json_fields::Nullable;


/// The kind of an event: its "event" field, or "" when absent or not a string.
std::string kind_of(const nlohmann::json& ev);

/// A line of a task's standard output as the event its agent forwards: the JSON object
/// on the line, or a LogLine holding the line when it is not one (a stray print, JSON
/// nested deeper than kMaxJsonDepth of wire/control.h). Never throws.
nlohmann::json event_of_line(const std::string& line);

/// Writes `ev` as one line on `out` and flushes: how a task reports an event (its stdout
/// is a pipe its agent reads line by line). Not thread-safe on a shared stream.
void write_line(std::ostream& out, const nlohmann::json& ev);

/// dense ÷ actual (an achieved compression ratio), or empty when nothing was sent.
Nullable<double> ratio_or_null(double dense, double actual);

/// Bytes a worker's exchanges cost at its sockets (frame headers included), beside what
/// the same exchanges would have cost dense fp32. Gives the achieved compression ratio.
struct Traffic : Fields<Traffic> {
  std::uint64_t up = 0;          ///< bytes sent to the PS shards
  std::uint64_t down = 0;        ///< bytes received from them
  std::uint64_t dense_up = 0;    ///< bytes dense pushes would have sent
  std::uint64_t dense_down = 0;  ///< bytes dense pulls would have received
  /// dense ÷ actual over both directions, or null when nothing was sent.
  Nullable<double> ratio() const {
    return ratio_or_null(static_cast<double>(dense_up + dense_down), static_cast<double>(up + down));
  }
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("up", s.up), v("down", s.down), v("dense_up", s.dense_up), v("dense_down", s.dense_down);
  }
};

// ------------------------------------------------------------------ worker events

/// The byte counters that a worker's progress, epoch_end, profile and done events carry:
/// cumulative bytes at its sockets (handshakes and headers included) in this process.
struct ByteCounters : Fields<ByteCounters> {
  std::optional<std::uint64_t> bytes_pushed; ///< bytes sent to the PS shards
  std::optional<std::uint64_t> bytes_pulled; ///< bytes received from them
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("bytes_pushed", s.bytes_pushed), v("bytes_pulled", s.bytes_pulled);
  }
};

/// What a worker did since its process started, cumulative (a restart starts them at 0
/// again): the counters its agent exposes as Prometheus metrics. The four phase times
/// split a step: `data` gathers the batch, `compute` runs forward and backward and copies
/// the gradient out, `compress` selects top-k (momentum correction, error feedback),
/// `exchange` pushes and pulls (waiting for the PS included). Seconds of wall time.
struct StepCounters : Fields<StepCounters> {
  std::int64_t images = 0;           ///< images of the steps taken (skipped steps excluded)
  std::int64_t steps = 0;            ///< steps taken (pushed), this process
  double data_seconds = 0;
  double compute_seconds = 0;
  double compress_seconds = 0;
  double exchange_seconds = 0;
  std::int64_t resyncs = 0;          ///< dense resyncs after a lost PS connection
  /// overlap: partition pushes written from within the backward pass (the rest went
  /// after it: partitions whose last gradient came last, or the parameters without one)
  std::int64_t overlapped_pushes = 0;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("images", s.images), v("steps", s.steps), v("data_seconds", s.data_seconds),
        v("compute_seconds", s.compute_seconds), v("compress_seconds", s.compress_seconds),
        v("exchange_seconds", s.exchange_seconds), v("resyncs", s.resyncs),
        v("overlapped_pushes", s.overlapped_pushes);
  }
};

/// A worker holds the PS's parameters and starts training.
struct Started : Fields<Started> {
  static constexpr const char* kKind = "started";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::int64_t train_examples = 0;   ///< images in this worker's shard of the training set
  std::int64_t steps_per_epoch = 0;  ///< steps per epoch of this worker's shard
  std::int64_t parameters = 0;       ///< floats in the model
  std::int64_t partitions = 0;       ///< PS partitions the parameters are cut into
  double load_seconds = 0;           ///< from process start to here (data, model, PS init)
  int resume_epoch = 0;              ///< epochs finished before a restart; 0 on a first start
  /// The process's malloc and BLAS, common/native_libs.h ("tcmalloc (gperftools 2.10)",
  /// "glibc malloc"; "OpenBLAS 0.3.21 ...", "reference BLAS")
  std::optional<std::string> allocator, blas;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("train_examples", s.train_examples), v("steps_per_epoch", s.steps_per_epoch),
        v("parameters", s.parameters), v("partitions", s.partitions), v("load_seconds", s.load_seconds),
        v("resume_epoch", s.resume_epoch), v("allocator", s.allocator), v("blas", s.blas);
  }
};

/// Periodic progress (every WorkerConfig::progress_interval_s seconds).
struct Progress : Fields<Progress> {
  static constexpr const char* kKind = "progress";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  int epoch = 0;                     ///< 1-based epoch in progress
  std::int64_t step = 0;             ///< 1-based step within the epoch
  std::int64_t steps_per_epoch = 0;  ///< steps per epoch of this worker's shard
  std::int64_t global_step = 0;      ///< steps since the job started (all epochs)
  double loss = 0;                   ///< mean training loss since the previous progress event
  double lr = 0;                     ///< learning rate of the latest step
  double images_per_sec = 0;         ///< this worker, since the previous progress event
  std::uint64_t bytes_pushed = 0;    ///< cumulative, this process (task incarnation)
  std::uint64_t bytes_pulled = 0;    ///< bytes received from them, cumulative, this process
  double density = 1.0;              ///< uplink density of the latest step, (0, 1]
  Nullable<double> compression_ratio;  ///< dense ÷ actual bytes so far
  std::int64_t skipped_steps = 0;    ///< steps skipped for a NaN/Inf loss or gradient
  std::optional<StepCounters> counters;  ///< cumulative counters of this process (metrics)
  /// Seconds the steps since the previous progress event spent waiting for the data
  /// loader (0 when the batches were always ready; absent for in-memory IDX data).
  std::optional<double> data_wait_seconds;
  std::optional<double> data_wait_fraction;  ///< data_wait_seconds ÷ the wall time since then, [0, 1]
  /// Unreadable images skipped in this epoch so far (training; rank 0 adds its latest
  /// evaluation's). Absent for in-memory IDX data.
  std::optional<std::int64_t> skipped_images;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("epoch", s.epoch), v("step", s.step), v("steps_per_epoch", s.steps_per_epoch),
        v("global_step", s.global_step), v("loss", s.loss), v("lr", s.lr), v("images_per_sec", s.images_per_sec),
        v("bytes_pushed", s.bytes_pushed), v("bytes_pulled", s.bytes_pulled), v("density", s.density),
        v("compression_ratio", s.compression_ratio), v("skipped_steps", s.skipped_steps),
        v("data_wait_seconds", s.data_wait_seconds), v("data_wait_fraction", s.data_wait_fraction),
        v("skipped_images", s.skipped_images), v("counters", s.counters);
  }
};

/// A worker finished an epoch; rank 0 adds the test accuracy of the PS's parameters.
struct EpochEnd : Fields<EpochEnd> {
  static constexpr const char* kKind = "epoch_end";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  int epoch = 0;                     ///< 1-based epoch just finished
  int epochs = 0;                    ///< the job's epochs
  double train_loss = 0;             ///< mean over the epoch's steps
  double epoch_seconds = 0;          ///< wall time of the epoch, s
  double images_per_sec = 0;         ///< this worker's shard ÷ epoch_seconds
  std::optional<double> test_accuracy;  ///< rank 0 only, in [0, 1]
  std::optional<double> eval_seconds;   ///< rank 0 only
  std::uint64_t bytes_pushed = 0;    ///< bytes sent to the PS shards, cumulative, this process
  std::uint64_t bytes_pulled = 0;    ///< bytes received from them, cumulative, this process
  std::optional<double> data_wait_seconds;     ///< the epoch's steps' wait for the loader, s
  /// Unreadable images this worker skipped in the epoch (rank 0 adds the test set's): the
  /// workers' figures of one epoch add up to the data set's unreadable files.
  std::optional<std::int64_t> skipped_images;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("epoch", s.epoch), v("epochs", s.epochs), v("train_loss", s.train_loss),
        v("epoch_seconds", s.epoch_seconds), v("images_per_sec", s.images_per_sec),
        v("test_accuracy", s.test_accuracy), v("eval_seconds", s.eval_seconds), v("bytes_pushed", s.bytes_pushed),
        v("bytes_pulled", s.bytes_pulled), v("data_wait_seconds", s.data_wait_seconds),
        v("skipped_images", s.skipped_images);
  }
};

/// A worker finished the job (its last event before it exits 0).
struct Done : Fields<Done> {
  static constexpr const char* kKind = "done";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  Nullable<double> test_accuracy;    ///< rank 0: the final test accuracy
  std::int64_t steps = 0;            ///< global steps taken
  std::int64_t skipped_steps = 0;    ///< steps skipped for a NaN/Inf loss or gradient
  double wall_seconds = 0;           ///< this process's life
  std::uint64_t bytes_pushed = 0;    ///< bytes sent to the PS shards, cumulative, this process
  std::uint64_t bytes_pulled = 0;    ///< bytes received from them, cumulative, this process
  std::optional<Traffic> traffic;               ///< over the whole run
  std::optional<Traffic> traffic_after_warmup;  ///< after compression.warmup_epochs
  Nullable<double> compression_ratio;               ///< traffic->ratio()
  Nullable<double> compression_ratio_after_warmup;  ///< traffic_after_warmup->ratio()
  std::optional<StepCounters> counters;  ///< their final values
  std::optional<std::int64_t> skipped_images;  ///< as in this worker's last epoch_end
  std::optional<double> data_wait_seconds;     ///< all steps' wait for the loader, s
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("skipped_images", s.skipped_images), v("data_wait_seconds", s.data_wait_seconds);
    v("rank", s.rank), v("test_accuracy", s.test_accuracy), v("steps", s.steps), v("skipped_steps", s.skipped_steps),
        v("wall_seconds", s.wall_seconds), v("bytes_pushed", s.bytes_pushed), v("bytes_pulled", s.bytes_pulled),
        v("traffic", s.traffic), v("traffic_after_warmup", s.traffic_after_warmup),
        v("compression_ratio", s.compression_ratio),
        v("compression_ratio_after_warmup", s.compression_ratio_after_warmup), v("counters", s.counters);
  }
};

/// A step whose loss or gradient was NaN/Inf was not pushed.
struct SkippedStep : Fields<SkippedStep> {
  static constexpr const char* kKind = "skipped_step";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  int epoch = 0;                     ///< 1-based
  std::int64_t step = 0;             ///< 1-based within the epoch
  Nullable<double> loss;             ///< null when the loss itself was not finite
  std::int64_t skipped_steps = 0;    ///< so far, this process
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("epoch", s.epoch), v("step", s.step), v("loss", s.loss),
        v("skipped_steps", s.skipped_steps);
  }
};

/// A worker's data set as it will train on it (sent once, after loading).
struct DataInfo : Fields<DataInfo> {
  static constexpr const char* kKind = "data";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::string dataset;               ///< JobSpec::dataset
  std::int64_t classes = 0;          ///< class count (the model's outputs)
  std::int64_t train_images = 0;     ///< the whole training set (all shards)
  std::int64_t test_images = 0;      ///< the test set (rank 0 reads it)
  int image_size = 0;                ///< input height and width, pixels
  int channels = 0;                  ///< 1 or 3
  std::vector<double> mean, std;     ///< per channel, of pixel/255
  /// Where mean and std come from: "job" (the job file), "published" (IDX) or "sample"
  /// (computed on `sample_images` training images).
  std::string normalization;
  std::optional<std::int64_t> sample_images;
  std::optional<int> loader_threads;  ///< absent when the data stays in memory as tensors
  std::optional<int> loader_queue;    ///< batches the loader may hold
  /// The classes' names by label (ImageFolder's folders, the published ones of the IDX
  /// data sets and CIFAR-10); empty when unknown.
  std::vector<std::string> class_names;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("class_names", s.class_names);
    v("rank", s.rank), v("dataset", s.dataset), v("classes", s.classes), v("train_images", s.train_images),
        v("test_images", s.test_images), v("image_size", s.image_size), v("channels", s.channels),
        v("mean", s.mean), v("std", s.std), v("normalization", s.normalization), v("sample_images", s.sample_images),
        v("loader_threads", s.loader_threads), v("loader_queue", s.loader_queue);
  }
};

/// An image that could not be read was skipped (the first 20 of each worker are
/// reported; the rest only counted in skipped_images).
struct SkippedImage : Fields<SkippedImage> {
  static constexpr const char* kKind = "skipped_image";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::string message;               ///< the file and why it could not be read
  std::int64_t skipped_images = 0;   ///< DataFeed's count when it was found
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("message", s.message), v("skipped_images", s.skipped_images);
  }
};

/// Where a stopped worker saved its parameter replica (ps::write_replica_file): either
/// path, steps, epochs_done and pulled_at, or only error.
struct Replica : Fields<Replica> {
  std::optional<std::string> path;   ///< the replica file
  std::optional<std::int64_t> steps;     ///< global step of the replica
  std::optional<int> epochs_done;    ///< epochs finished when it stopped
  std::optional<double> pulled_at;       ///< Unix time (s) its values last came from the PS
  std::optional<std::string> error;      ///< why it was not saved
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("path", s.path), v("steps", s.steps), v("epochs_done", s.epochs_done), v("pulled_at", s.pulled_at),
        v("error", s.error);
  }
};

/// A worker asked to stop (SIGTERM) gave up; `replica` is null when it did not hold the
/// PS's parameters yet or had nowhere to save them. (Always present: it tells this
/// event from a PS shard's "stopped".)
struct WorkerStopped : Fields<WorkerStopped> {
  static constexpr const char* kKind = "stopped";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::optional<int> epochs_done;    ///< epochs finished when it stopped
  Nullable<Replica> replica;         ///< null: nothing saved
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("epochs_done", s.epochs_done), v("replica", s.replica);
  }
};

/// A worker of an elastic job left it (a scale-down, docs/training.md "Elastic jobs"):
/// its last step's push counted, its unfinished data chunks went back to the dispatch; it
/// exits 0 next.
struct Left : Fields<Left> {
  static constexpr const char* kKind = "left";
  int rank = 0;                      ///< the worker's rank
  std::int64_t steps = 0;            ///< steps this process took
  std::int64_t members = 0;          ///< the job's workers still training after it left
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("steps", s.steps), v("members", s.members);
  }
};

/// An exploration run (JobSpec::profile) measured its throughput.
struct Profile : Fields<Profile> {
  static constexpr const char* kKind = "profile";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::int64_t steps = 0;            ///< global steps taken
  std::int64_t measured_images = 0;  ///< images after the warm-up steps
  double measured_seconds = 0;       ///< wall time of the measured steps, s
  double images_per_sec = 0;         ///< measured_images ÷ measured_seconds; 0 if none
  std::uint64_t bytes_pushed = 0;    ///< bytes sent to the PS shards, cumulative, this process
  std::uint64_t bytes_pulled = 0;    ///< bytes received from them, cumulative, this process
  /// Rank 0: one evaluation as after an epoch (BatchNorm re-estimation and the test set), s,
  /// so that the planner counts evaluation in the epoch time it predicts
  std::optional<double> eval_seconds;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("steps", s.steps), v("measured_images", s.measured_images),
        v("measured_seconds", s.measured_seconds), v("images_per_sec", s.images_per_sec),
        v("bytes_pushed", s.bytes_pushed), v("bytes_pulled", s.bytes_pulled), v("eval_seconds", s.eval_seconds);
  }
};

/// A worker of a re-assigned job loaded its saved replica to initialise the new shards.
struct ReplicaLoaded : Fields<ReplicaLoaded> {
  static constexpr const char* kKind = "replica_loaded";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  std::string path;                  ///< the replica file
  std::int64_t steps = 0;            ///< global step the replica was saved at
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("path", s.path), v("steps", s.steps);
  }
};

/// A worker reconnected to a PS shard that went away and took its parameters again.
struct PsResync : Fields<PsResync> {
  static constexpr const char* kKind = "ps_resync";
  int rank = 0;                      ///< the worker's rank, [0, workers)
  int shard = -1;                    ///< the shard whose connection was lost
  std::string reason;                ///< why the connection was lost
  double seconds = 0;                ///< the resync's duration
  std::optional<int> resyncs;        ///< so far, this process
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("rank", s.rank), v("shard", s.shard), v("reason", s.reason), v("seconds", s.seconds), v("resyncs", s.resyncs);
  }
};

/// A task failed; its last words (it then exits non-zero).
struct TaskError : Fields<TaskError> {
  static constexpr const char* kKind = "error";
  std::string message;               ///< what failed, in words
  /// What kind of failure, when the task knows: "divergence" (NaN/Inf steps in a row),
  /// "timeout" (a peer did not answer in time), "config" (bad arguments or files).
  std::optional<std::string> cause;
  /// The event of an exception that ends a task: its message, and its cause from its
  /// type (DivergedError, TimeoutError, ConfigError; none for the others).
  static TaskError of(const std::exception& e);
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("message", s.message), v("cause", s.cause);
  }
};

// ------------------------------------------------------------------ PS shard events

/// What a PS shard found in its checkpoint when it started: restored with its counts, or
/// refused with the error.
struct CheckpointLoad : Fields<CheckpointLoad> {
  bool restored = false;             ///< the checkpoint was loaded
  std::optional<std::int64_t> partitions; ///< partitions restored
  std::optional<std::int64_t> workers_done; ///< finished workers restored
  std::optional<std::uint64_t> pushes; ///< pushes the shard had applied
  std::optional<std::string> error;  ///< why the checkpoint was refused
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("restored", s.restored), v("partitions", s.partitions), v("workers_done", s.workers_done),
        v("pushes", s.pushes), v("error", s.error);
  }
};

/// A PS shard listens. Its agent adds `address` (its advertise_address).
struct Listening : Fields<Listening> {
  static constexpr const char* kKind = "listening";
  int port = 0;                      ///< the bound port
  int shard = 0;                     ///< shard index, 0-based
  std::optional<std::string> address;         ///< set by the agent
  std::optional<CheckpointLoad> checkpoint;   ///< absent when there was no checkpoint file
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("port", s.port), v("shard", s.shard), v("address", s.address), v("checkpoint", s.checkpoint);
  }
};

/// A PS shard's counters, cumulative since its process started (a restart starts them at
/// 0 again), every progress interval: what its agent exposes as Prometheus metrics.
struct PsStats : Fields<PsStats> {
  static constexpr const char* kKind = "ps_stats";
  int shard = 0;                     ///< shard index, 0-based
  std::uint64_t pushes = 0;          ///< pushes applied (frames, all partitions, all workers)
  std::uint64_t pulls = 0;           ///< pulls answered (dense and sparse frames)
  double apply_seconds = 0;          ///< wall time spent applying pushes, s
  std::uint64_t bytes_in = 0;        ///< bytes read from workers
  std::uint64_t bytes_out = 0;       ///< bytes written to workers
  std::int64_t connections = 0;      ///< worker connections open now
  std::uint64_t refused_handshakes = 0;  ///< connections refused in the authentication handshake
  std::uint64_t rejected_connections = 0; ///< connections closed for a failed handshake or a bad frame
  std::uint64_t checkpoints = 0;     ///< checkpoints written
  Nullable<double> last_checkpoint_unix;  ///< Unix time (s) of the latest checkpoint; null: none yet
  // The step barrier's record (ps::SyncStats; all 0 with sync = "async").
  ps::SyncMode sync = ps::SyncMode::kAsync;  ///< the consistency model ("async" | "ssp" | "sync")
  std::uint64_t sync_steps = 0;      ///< sync: steps applied, summed over partitions
  std::uint64_t late_pushes = 0;     ///< sync: pushes dropped because their step was applied
  std::uint64_t sync_waits = 0;      ///< pulls that waited for the barrier
  double sync_wait_seconds = 0;      ///< time they waited, summed, s
  std::uint64_t workers_dropped = 0; ///< workers dropped from the barrier by its timeout
  std::uint64_t max_lead = 0;        ///< most steps a worker was ahead of the slowest when served
  // An elastic job's membership and data dispatch (ps::SyncStats, ps::DispatchStats).
  std::optional<std::uint64_t> members_joined;   ///< workers that became members after the start
  std::optional<std::uint64_t> members_left;     ///< members that left (scale-downs)
  std::optional<std::uint64_t> chunks_served;    ///< shard 0: training chunks handed out
  std::optional<std::uint64_t> chunks_returned;  ///< shard 0: chunks given back unfinished
  std::optional<std::uint64_t> chunks_reissued;  ///< shard 0: given-back chunks handed out again
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("members_joined", s.members_joined), v("members_left", s.members_left), v("chunks_served", s.chunks_served),
        v("chunks_returned", s.chunks_returned), v("chunks_reissued", s.chunks_reissued);
    v("shard", s.shard), v("pushes", s.pushes), v("pulls", s.pulls), v("apply_seconds", s.apply_seconds),
        v("bytes_in", s.bytes_in), v("bytes_out", s.bytes_out), v("connections", s.connections),
        v("refused_handshakes", s.refused_handshakes), v("rejected_connections", s.rejected_connections),
        v("checkpoints", s.checkpoints), v("last_checkpoint_unix", s.last_checkpoint_unix), v("sync", s.sync),
        v("sync_steps", s.sync_steps), v("late_pushes", s.late_pushes), v("sync_waits", s.sync_waits),
        v("sync_wait_seconds", s.sync_wait_seconds), v("workers_dropped", s.workers_dropped),
        v("max_lead", s.max_lead);
  }
};

/// A PS shard stopped (SIGTERM/SIGINT) after its final checkpoint.
struct PsStopped : Fields<PsStopped> {
  static constexpr const char* kKind = "stopped";
  int shard = 0;                     ///< shard index, 0-based
  std::uint64_t pushes = 0;          ///< pushes applied (all workers)
  std::uint64_t bytes_in = 0;        ///< bytes read from workers
  std::uint64_t bytes_out = 0;       ///< bytes written to workers
  std::uint64_t rejected_connections = 0; ///< connections refused (handshake or frame)
  /// Partitions rebuilt from a worker's replica that had seen more pushes than the
  /// shard's own state (ps::ShardState::rebuilds) since this task started.
  std::uint64_t rebuilds = 0;
  std::optional<std::string> checkpoint_error;  ///< the final checkpoint failed
  std::optional<std::uint64_t> checkpoints;     ///< saves, when it checkpoints at all
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("shard", s.shard), v("pushes", s.pushes), v("bytes_in", s.bytes_in), v("bytes_out", s.bytes_out),
        v("rejected_connections", s.rejected_connections), v("rebuilds", s.rebuilds),
        v("checkpoint_error", s.checkpoint_error),
        v("checkpoints", s.checkpoints);
  }
};

// ------------------------------------------------------------------ agent events

/// An agent restarts a task that died (worker: resume_epoch; PS shard: port).
struct Restarting : Fields<Restarting> {
  static constexpr const char* kKind = "restarting";
  std::string kind;                  ///< "worker" | "ps"
  std::optional<int> attempt;        ///< 1-based
  int max_restarts = 0;              ///< the agent's task_max_restarts
  std::string reason = "died";       ///< ExitStatus::describe()
  std::string last_error;            ///< the task's last error event, if any
  std::optional<int> resume_epoch;   ///< worker
  std::optional<int> port;           ///< PS shard
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("kind", s.kind), v("attempt", s.attempt), v("max_restarts", s.max_restarts), v("reason", s.reason),
        v("last_error", s.last_error), v("resume_epoch", s.resume_epoch), v("port", s.port);
  }
};

/// A line of a task's stdout that was not a JSON object.
struct LogLine : Fields<LogLine> {
  static constexpr const char* kKind = "log";
  std::string line;                  ///< the line as printed
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("line", s.line);
  }
};

/// The task whose failure failed a job, and how: what `dltrain status` and the summary
/// show. The first task that failed for good (out of restarts, or not restartable).
struct Failure : Fields<Failure> {
  std::string task;                  ///< "worker-1"
  std::string agent;                 ///< the agent it ran on
  /// "divergence" | "timeout" | "config" (what the task said), "oom" (SIGKILL while the
  /// agent's cgroup counted an OOM kill), "signal", "exit_code", "start" (could not be
  /// started). classify_exit() below.
  std::string cause;
  std::optional<int> exit_code;      ///< when it exited
  std::optional<int> signal;         ///< when a signal ended it
  std::string message;               ///< how it ended and its last error, in words
  std::vector<std::string> last_lines;  ///< the last lines of its log, oldest first
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("task", s.task), v("agent", s.agent), v("cause", s.cause), v("exit_code", s.exit_code), v("signal", s.signal),
        v("message", s.message), v("last_lines", s.last_lines);
  }
};

/// The cause of a failed exit (exit code != 0 or a signal), one of Failure::cause: the
/// task's own word first ("divergence", "timeout", "config": `reported`, from its last
/// error event), then "oom" for a SIGKILL while its cgroup counted a new OOM kill
/// (`oom_killed`, agent/failure.h), "signal" for any other signal, "start" for exit code
/// 126 (the agent could not start it), "exit_code" otherwise. Pure; the agent says it, and
/// the leader for an exit report that carries no cause.
std::string classify_exit(int exit_code, int signal, const std::string& reported, bool oom_killed);

/// The job's summary: the last event a follower receives, and the core of a job in
/// `dltrain status`. Compression ratios are dense bytes ÷ bytes sent, counted at the
/// workers' sockets with headers, over the run and after warm-up; present once a worker
/// reported its traffic, null where nothing was sent.
struct Summary : Fields<Summary> {
  static constexpr const char* kKind = "summary";
  std::string job, name, state;      ///< "job-3", the job's name, its state
  Nullable<double> test_accuracy;    ///< final test accuracy, [0, 1]
  int epochs = 0;                    ///< epochs finished
  double wall_seconds = 0;           ///< from submission to the end (or now)
  std::uint64_t bytes_pushed = 0;    ///< all workers, all generations
  std::uint64_t bytes_pulled = 0;    ///< bytes received from them, cumulative, this process
  double images_per_sec = 0;         ///< sum of the workers' latest epoch throughputs
  std::string compression = "none";  ///< the method, e.g. "dgc"
  std::optional<Nullable<double>> compression_ratio, compression_ratio_up, compression_ratio_down;
  std::optional<Nullable<double>> compression_ratio_after_warmup, compression_ratio_up_after_warmup,
      compression_ratio_down_after_warmup;
  std::optional<std::string> error;  ///< why it failed
  std::optional<Failure> failure;    ///< the first task that failed it, when a task did
  /// Unreadable images: the sum of the workers' latest epoch_end figures (each file is
  /// read once an epoch), test set included; absent for in-memory IDX data.
  std::optional<std::int64_t> skipped_images;
  /// The trained model the leader keeps (`dltrain model get JOB --checkpoint NAME`): its
  /// checkpoint name ("last"), absent when none was stored; model_error says why not.
  std::optional<std::string> model_checkpoint, model_error;
  template <typename S, typename V>
  static void fields(S& s, V&& v) {
    v("skipped_images", s.skipped_images), v("model_checkpoint", s.model_checkpoint), v("model_error", s.model_error);
    v("job", s.job), v("name", s.name), v("state", s.state), v("test_accuracy", s.test_accuracy),
        v("epochs", s.epochs), v("wall_seconds", s.wall_seconds), v("bytes_pushed", s.bytes_pushed),
        v("bytes_pulled", s.bytes_pulled), v("images_per_sec", s.images_per_sec), v("compression", s.compression),
        v("compression_ratio", s.compression_ratio), v("compression_ratio_up", s.compression_ratio_up),
        v("compression_ratio_down", s.compression_ratio_down),
        v("compression_ratio_after_warmup", s.compression_ratio_after_warmup),
        v("compression_ratio_up_after_warmup", s.compression_ratio_up_after_warmup),
        v("compression_ratio_down_after_warmup", s.compression_ratio_down_after_warmup), v("error", s.error),
        v("failure", s.failure);
  }
  /// Sets the three ratios (suffix "" or "_after_warmup") from the workers' traffic.
  void set_ratios(const Traffic& sum, bool after_warmup);
};

}  // namespace dltrain::wire::events
