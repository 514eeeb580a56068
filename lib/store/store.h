// The leader's durable state in RocksDB: performance history, jobs and job events.
//
// Column families and key encodings (all integers big-endian so keys sort numerically):
//   history  <model> 0x00 <dataset> 0x00 <u64 unix time, µs> <u32 sequence>  → Observation JSON
//   jobs     <u64 job number>                                               → job JSON
//   events   <u64 job number> <u64 event sequence>                          → event JSON
//   default  "meta/<name>"                                                  → UTF-8 text / JSON
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace dltrain::store {

/// A RocksDB failure, converted at the store's boundary. The message names the database
/// path, the operation and RocksDB's status text, and says what to do when it can
/// (another process holds the lock, permissions, corruption).
class StoreError : public IoError {
 public:
  using IoError::IoError;
};

/// One performance observation (docs/planner.md, "History (RocksDB)"). Either per epoch
/// (`final_accuracy` < 0) or the end of a job (`final_accuracy` in [0, 1]).
struct Observation {
  std::string model;
  std::string dataset;
  std::string hardware_class = "cpu";
  std::string job;
  int workers = 1;
  int ps_shards = 1;
  int batch_size = 1;           ///< per worker
  int epoch = 0;                ///< epoch this row measures (1-based); epochs run for final rows
  double epoch_seconds = 0;     ///< wall time of the epoch (s); for final rows, mean over the run
  double images_per_sec = 0;    ///< all workers together
  double bytes_per_epoch = 0;   ///< pushed + pulled, headers included, all workers
  double final_accuracy = -1;   ///< final test accuracy, final rows only
  /// Worker 0's evaluation after an epoch (BatchNorm re-estimation and the test set), s;
  /// epoch and profile rows; 0 = not measured (rows stored before it was).
  double eval_seconds = 0;
  double timestamp = 0;         ///< unix time, s
  std::string source = "job";   ///< "job" or "profile" (exploration)
  std::string compression = "none";  ///< the job's compression method
};
void to_json(nlohmann::json& j, const Observation& o);
void from_json(const nlohmann::json& j, Observation& o);

/// How the store treats its disk.
struct StoreOptions {
  /// Writes are refused (StoreError, "… MiB free …") while the file system holding the
  /// database has less than this free for unprivileged users (statvfs f_bavail), so that
  /// RocksDB itself never meets a full disk: Debian's librocksdb 7.8 is built with
  /// assertions, and a write-ahead-log append that fails with ENOSPC aborts the process
  /// (WritableFileWriter::AssertFalseAndGetStatusForPrevError). 0 disables the check.
  std::uint64_t min_free_bytes = 64ull << 20;
};

/// The store. Thread-safety: RocksDB's (concurrent readers and writers are safe); the
/// sequence counters are guarded internally.
///
/// Writes (add_observation, put_job, append_event, put_meta, flush) throw StoreError
/// naming the database, the operation and the cause — a disk below the free-space
/// reserve (StoreOptions) and a read-only file system included, each with what to do —
/// and leave what was stored before intact; once space is freed, writes are taken again.
/// Should RocksDB still report a write error (with a librocksdb built without
/// assertions), the next write first resumes the database (DB::Resume). Reads keep
/// working throughout.
class Store {
 public:
  /// Opens or creates the database in directory `path`. On a read-only file system it
  /// opens the database read-only instead (read_only(): reads work, every write throws
  /// StoreError saying so). Throws StoreError with a clear message when the directory
  /// cannot be created or read, another live process holds the database (RocksDB's LOCK
  /// file is an fcntl lock, so one left behind by a killed process does not block), or
  /// the files are corrupt. Never crashes.
  static std::unique_ptr<Store> open(const std::string& path, const StoreOptions& options = {});
  ~Store();

  void add_observation(const Observation& o);
  /// Observations, oldest first; empty filters match everything.
  std::vector<Observation> history(const std::string& model = "", const std::string& dataset = "") const;

  /// Jobs by number (the N of "job-N").
  void put_job(std::uint64_t number, const nlohmann::json& job);
  std::vector<std::pair<std::uint64_t, nlohmann::json>> jobs() const;
  void append_event(std::uint64_t job, const nlohmann::json& event);
  std::vector<nlohmann::json> events(std::uint64_t job) const;
  /// Removes job `number`'s record and every event of it, in one atomic write batch (the
  /// leader's job retention); its observations in the history stay. Removing a job that
  /// is not stored does nothing. Throws StoreError as the other writes do.
  void delete_job(std::uint64_t number);

  void put_meta(const std::string& name, const std::string& value);
  std::optional<std::string> get_meta(const std::string& name) const;

  /// Flushes memtables to disk (called on shutdown); nothing on a read-only store.
  void flush();
  /// True when the database was opened read-only (see open()).
  bool read_only() const;
  const std::string& path() const;

  struct Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::store
