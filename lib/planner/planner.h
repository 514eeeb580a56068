// The leader's configuration planner: predicts epoch time and final accuracy from the
// performance history by isotonic regression and picks the (workers, batch size) that
// meets the job's accuracy target within its deadline at minimum resource cost
// (docs/planner.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/isotonic.h"
#include "store/store.h"

namespace dltrain::planner {

/// A configuration: worker count and per-worker batch size.
struct Config {
  int workers = 1;
  int batch_size = 32;
  bool operator==(const Config&) const = default;
};

/// What the leader asks the planner.
struct PlanRequest {
  std::string model, dataset, hardware_class = "cpu";
  int ps_shards = 1;
  int epochs = 1;
  std::int64_t train_examples = 60000;  ///< images per epoch (all workers together)
  double target_accuracy = 0;           ///< 0 = no accuracy constraint
  double deadline_seconds = 0;          ///< 0 = no deadline
  std::vector<int> worker_options;      ///< worker counts that fit the free agents
  std::vector<int> batch_options;       ///< per-worker batch sizes the model/memory allow
  double price_per_task_hour = 1.0;     ///< of the hardware class, per task (worker or PS shard)
  double exploration_seconds = 0;       ///< already spent profiling for this plan
  std::optional<Config> previous;       ///< the last plan for this model and dataset
  double switch_threshold = 0.10;       ///< relative cost gain needed to leave `previous`
  int min_time_cells = 2;               ///< distinct configurations measured before trusting T
  /// Safety margin in standard deviations: a candidate is feasible when
  /// accuracy − k·σ_acc ≥ target and time·(1 + k·σ_time) ≤ deadline, with σ the RMS
  /// residuals of the fits (the measurements' scatter around the monotone fit).
  double margin_sigmas = 0.0;
};

/// One candidate as the planner saw it.
struct CandidateRow {
  Config config;
  double seconds_per_epoch = 0;   ///< predicted T(workers, batch) + eval_seconds
  double eval_seconds = 0;        ///< predicted evaluation after each epoch, s (in seconds_per_epoch)
  int time_observations = 0;      ///< epoch measurements at exactly this configuration
  double total_seconds = 0;       ///< epochs × T + exploration
  double accuracy = 0;            ///< predicted final accuracy after `epochs`
  double accuracy_margin = 0;     ///< k·σ_acc subtracted before comparing with the target
  double time_margin = 0;         ///< k·σ_time: relative margin added before the deadline
  int accuracy_observations = 0;  ///< final accuracies at exactly this global batch size
  std::string accuracy_source;    ///< "history", "history (other epochs)", "beyond history" or "prior"
  double cost = 0;                ///< (workers + PS shards) × price × total hours
  bool feasible = false;
  std::string reason;             ///< why rejected; empty when feasible
};

/// The decision.
struct Plan {
  bool feasible = false;
  Config choice;                      ///< valid when feasible
  std::vector<CandidateRow> table;    ///< every candidate, cheapest feasible first
  std::string explanation;            ///< one paragraph a person reads
  std::vector<Config> explore;        ///< configurations to profile first (thin history)
  bool kept_previous = false;         ///< the previous choice was kept (gain under threshold)
};

/// Epoch-time predictor: seconds per image, non-increasing in workers and in batch size,
/// plus worker 0's evaluation after each epoch (eval_seconds);
/// fitted by isotonic_grid over the grid of measured (workers, batch) values with
/// weights = observation counts; predictions interpolate bilinearly between grid points
/// and clip outside. Accuracy predictor: final test accuracy non-increasing in the
/// global batch size (workers × batch), by 1-D weighted PAVA, from runs of the same
/// epochs when there are any, else all runs of the model and dataset.
class Predictors {
 public:
  Predictors(const std::vector<store::Observation>& history, const std::string& hardware_class, int epochs);
  /// Seconds per image and the observation count at exactly (w, b); nullopt without data.
  std::optional<std::pair<double, int>> seconds_per_image(const Config& c) const;
  /// Accuracy and the count at exactly this global batch; nullopt without data.
  std::optional<std::pair<double, int>> accuracy(const Config& c) const;
  bool accuracy_from_same_epochs() const { return same_epochs_; }
  /// RMS residual of the accuracy fit (accuracy units) and relative RMS residual of the
  /// epoch-time fit; 0 without data.
  double accuracy_sigma() const { return acc_sigma_; }
  double time_sigma() const { return t_sigma_; }
  /// Worker 0's evaluation after each epoch, s: the mean of the measured rows (epoch and
  /// profile rows of this hardware class); 0 without any. It does not depend on the
  /// workers or the batch size (worker 0 evaluates the whole test set in batches of the
  /// job's eval_batch_size), so it is one number added to every configuration's epoch.
  double eval_seconds() const { return eval_seconds_; }
  /// True when c's global batch is larger than any with a measured accuracy: accuracy
  /// is non-increasing in the global batch, so the history only bounds it from above
  /// there, and the planner does not count on it.
  bool accuracy_beyond_history(const Config& c) const;
  int time_cells() const;  ///< distinct configurations with epoch measurements

 private:
  std::vector<double> ws_, bs_;
  std::vector<std::vector<double>> t_fit_;
  std::vector<std::vector<int>> t_count_;
  std::optional<IsotonicFit> acc_;
  std::vector<std::pair<double, int>> acc_counts_;
  bool same_epochs_ = false;
  double acc_sigma_ = 0, t_sigma_ = 0;
  double eval_seconds_ = 0;
};

/// Plans a job. Pure function of the request and the history; thread-safe.
Plan make_plan(const PlanRequest& req, const std::vector<store::Observation>& history);

/// JSON form of a plan for `dltrain plan --json` and the job record.
nlohmann::json to_json(const Plan& p);

}  // namespace dltrain::planner
