// The Store on RocksDB, in a directory of the leader's machine (state_dir/db).
//
// Column families and key encodings (all integers big-endian so keys sort numerically):
//   history  <model> 0x00 <dataset> 0x00 <u64 unix time, µs> <u32 sequence>  → Observation JSON
//   jobs     <u64 job number>                                               → job JSON
//   events   <u64 job number> <u64 event sequence>                          → event JSON
//   default  "meta/<name>"                                                  → UTF-8 text / JSON
// RocksDB's Status never leaves rocksdb_store.cpp: every failure becomes a StoreError.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "store/store.h"

namespace dltrain::store {

/// How the RocksDB store treats its disk.
struct RocksDbOptions {
  /// Writes are refused (StoreError, "… MiB free …") while the file system holding the
  /// database has less than this free for unprivileged users (statvfs f_bavail), so that
  /// RocksDB itself never meets a full disk: Debian's librocksdb 7.8 is built with
  /// assertions, and a write-ahead-log append that fails with ENOSPC aborts the process
  /// (WritableFileWriter::AssertFalseAndGetStatusForPrevError). 0 disables the check.
  std::uint64_t min_free_bytes = 64ull << 20;
};

/// The RocksDB backend. Thread-safety: RocksDB's (concurrent readers and writers are
/// safe); the sequence counters are guarded internally.
///
/// Beyond the Store contract: a disk below the free-space reserve (RocksDbOptions) and a
/// read-only file system each refuse writes with what to do; once space is freed, writes
/// are taken again. Should RocksDB still report a write error (with a librocksdb built
/// without assertions), the next write first resumes the database (DB::Resume). Reads
/// keep working throughout.
class RocksDbStore final : public Store {
 public:
  /// Opens or creates the database in directory `path`. On a read-only file system it
  /// opens the database read-only instead (read_only(): reads work, every write throws
  /// StoreError saying so). Throws StoreError with a clear message when the directory
  /// cannot be created or read, another live process holds the database (RocksDB's LOCK
  /// file is an fcntl lock, so one left behind by a killed process does not block), or
  /// the files are corrupt. Never crashes.
  static std::unique_ptr<RocksDbStore> open(const std::string& path, const RocksDbOptions& options = {});
  ~RocksDbStore() override;

  void add_observation(const Observation& o) override;
  std::vector<Observation> history(const std::string& model = "", const std::string& dataset = "") const override;
  void put_job(std::uint64_t number, const nlohmann::json& job) override;
  std::vector<std::pair<std::uint64_t, nlohmann::json>> jobs() const override;
  void append_event(std::uint64_t job, const nlohmann::json& event) override;
  std::vector<nlohmann::json> events(std::uint64_t job) const override;
  void delete_job(std::uint64_t number) override;
  void put_meta(const std::string& name, const std::string& value) override;
  std::optional<std::string> get_meta(const std::string& name) const override;
  void flush() override;
  bool read_only() const override;
  /// The database directory.
  const std::string& location() const override;

  struct Impl;

 private:
  explicit RocksDbStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::store
