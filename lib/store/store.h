// The leader's durable state behind one interface: performance history, jobs, their
// events and a few named values. The leader opens its backend in one place
// (Leader::start, leader.cpp) and otherwise uses only this interface; the backend in use
// is RocksDB (store/rocksdb_store.h). A second backend is one class deriving from Store,
// its choice in that one place, and one line in tests/unit/store_contract_test.cpp,
// which runs the whole contract below against every backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "store/observation.h"

namespace dltrain::store {

/// A backend's failure, converted at the store's boundary: no backend's own status or
/// exception type crosses it. The message names the store's location, the operation and
/// the cause, and says what to do when it can (another process holds the lock,
/// permissions, corruption, a full or read-only disk).
class StoreError : public IoError {
 public:
  using IoError::IoError;
};

/// The contract every backend keeps.
///
/// Thread-safety: every method may be called from any thread concurrently.
///
/// Writes (add_observation, put_job, append_event, delete_job, put_meta, flush) survive
/// the leader's process being killed once they return (a power loss may take the latest:
/// flush() writes them to the backend's files), and throw StoreError naming the location,
/// the operation and the cause; a failed write leaves what was stored before intact.
/// Reads return what the returned writes stored and throw StoreError on a corrupt record
/// or a failed read.
class Store {
 public:
  virtual ~Store() = default;

  /// Appends one observation to the history.
  virtual void add_observation(const Observation& o) = 0;
  /// Observations matching `model` and `dataset` (an empty filter matches everything),
  /// oldest first (by Observation::timestamp).
  virtual std::vector<Observation> history(const std::string& model = "",
                                           const std::string& dataset = "") const = 0;

  /// Stores (or replaces) job `number`'s record (the N of "job-N").
  virtual void put_job(std::uint64_t number, const nlohmann::json& job) = 0;
  /// Every stored job record, by ascending number.
  virtual std::vector<std::pair<std::uint64_t, nlohmann::json>> jobs() const = 0;
  /// Appends one event to job `job`'s log; the log continues across reopenings.
  virtual void append_event(std::uint64_t job, const nlohmann::json& event) = 0;
  /// Job `job`'s events in the order appended (empty for an unknown job).
  virtual std::vector<nlohmann::json> events(std::uint64_t job) const = 0;
  /// Removes job `number`'s record and every event of it atomically (the leader's job
  /// retention); its observations in the history stay. Removing a job that is not stored
  /// does nothing.
  virtual void delete_job(std::uint64_t number) = 0;

  /// Stores a named value (UTF-8 text or JSON; e.g. "next_job", the planner's last plan
  /// for a model and dataset).
  virtual void put_meta(const std::string& name, const std::string& value) = 0;
  /// The named value, or nullopt when it was never stored.
  virtual std::optional<std::string> get_meta(const std::string& name) const = 0;

  /// Writes every returned write into the backend's own files (called on shutdown);
  /// nothing on a read-only store.
  virtual void flush() = 0;
  /// True when the store serves reads only (every write throws StoreError saying why).
  virtual bool read_only() const = 0;
  /// Where the store is, for messages and logs (a directory, an endpoint list).
  virtual const std::string& location() const = 0;
};

}  // namespace dltrain::store
