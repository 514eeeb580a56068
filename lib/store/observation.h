// One row of the leader's performance history: what the planner fits and a Store keeps.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dltrain::store {

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
  /// The method's setting (planner::MethodOption::setting: a sparse method's density, powersgd's
  /// rank, 1 for none and fp16); 0 = not recorded (rows stored before it was).
  double compression_setting = 0;
  /// The slowest live agent's measured link when the row was recorded, bytes/s each way
  /// (the agents' probe, docs/planner.md); 0 = not measured. The planner takes the time the
  /// row's bytes needed over it out of the row's epoch time, leaving the computation.
  double link_bytes_per_sec = 0;
};
void to_json(nlohmann::json& j, const Observation& o);
void from_json(const nlohmann::json& j, Observation& o);

}  // namespace dltrain::store
