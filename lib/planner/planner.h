// The leader's configuration planner: predicts epoch time and final accuracy from the
// performance history by isotonic regression and picks the (workers, batch size) that
// meets the job's accuracy target within its deadline at minimum resource cost
// (docs/planner.md).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/compression_model.h"
#include "planner/isotonic.h"
#include "store/store.h"

namespace dltrain::planner {

/// A configuration: worker count, per-worker batch size and compression.
struct Config {
  int workers = 1;
  int batch_size = 32;
  MethodOption compression;  ///< the job's own method, or the candidate's for method = "auto"
  Config() = default;
  Config(int w, int b, MethodOption m = {}) : workers(w), batch_size(b), compression(m) {}
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
  int task_slots = 0;                   ///< tasks of the job's size the live agents hold when idle (for messages)
  int requested_workers = 0;            ///< the job's fixed worker count; 0 with workers = "auto" (for messages)
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
  /// The compression methods to consider: the job's own, or auto_method_options() (and
  /// measured ones) for method = "auto"; empty means {none}.
  std::vector<MethodOption> method_options;
  /// The slowest live agent's measured link, bytes/s each way; 0 = not measured, and
  /// communication is not separated from computation (every method then predicts alike).
  double link_bytes_per_sec = 0;
  /// Element counts of the model's parameter tensors (ps_memory.h), for the bytes of
  /// methods not measured yet; empty for a TorchScript model.
  std::vector<std::int64_t> tensor_sizes;
  /// PS shards that carry the traffic: ps_shards, or each candidate's worker count when
  /// the job's ps_shards is "auto" (a shard beside every worker) — comm_seconds_per_image.
  bool shards_follow_workers = false;
  /// With shards_follow_workers: at most this many shards (the live agents, and the
  /// model's partitions: ps_shards = "auto" places one per machine, each holding some);
  /// 0 = no cap known.
  int auto_shards_cap = 0;
  /// Relative cost within which candidates of different methods count as tied; of tied
  /// candidates the plan takes the one predicted most accurate, then the densest method
  /// (the smaller risk for the same price). Only with more than one method option.
  double method_tie = 0.05;
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
  /// "history", "history (other epochs)", "history of other methods (monotone in density)",
  /// "prior (density below any measured)", "beyond history" or "prior".
  std::string accuracy_source;
  double cost = 0;                ///< (workers + PS shards) × price × total hours
  double bytes_per_step = 0;      ///< a worker's link per step, push + pull (0: link unknown or no bytes model)
  double comm_seconds_per_epoch = 0;  ///< of seconds_per_epoch: the bytes over the measured link
  /// Where the epoch time comes from: "measured" (this method at this configuration),
  /// "model" (the computation measured, this method's bytes over the link).
  std::string time_source;
  bool feasible = false;
  std::string reason;             ///< why rejected; empty when feasible
};

/// The decision.
struct Plan {
  bool feasible = false;
  Config choice;                      ///< valid when feasible
  /// Every candidate, cheapest feasible first (with several methods, the tie-break of
  /// PlanRequest::method_tie may put a slightly dearer one first: the choice).
  std::vector<CandidateRow> table;
  std::string explanation;            ///< one paragraph a person reads
  /// Configurations to profile first: the corners of a thin history, or, when the plan
  /// chooses the method, the choice itself if its method was never measured (the plan
  /// is then feasible too: what it would choose without the profile).
  std::vector<Config> explore;
  bool kept_previous = false;         ///< the previous choice was kept (gain under threshold)
  double link_bytes_per_sec = 0;      ///< the link the plan assumed (PlanRequest), 0 = unknown
  bool chooses_method = false;        ///< more than one method was a candidate
};

/// The planner's models (docs/planner.md, "The models").
///
/// Epoch time: the computation's seconds per image, non-increasing in workers and in
/// batch size, fitted (MonotoneGrid) over the measured (workers, batch) of every method's
/// rows after the time each row's bytes needed over its recorded link
/// (comm_seconds_per_image) is taken out; a method whose own rows sit above or below the
/// pooled fit carries that ratio (its selection or conversion cost), and a method never
/// run the smallest such ratio (optimism that exploration then checks); plus the
/// communication of the candidate's method over the request's link: its bytes per step
/// measured at that worker count, else the analytic wire_bytes_per_step scaled by what
/// the method's rows measured against it; plus worker 0's evaluation after each epoch.
///
/// Final accuracy: non-increasing in the global batch (workers × batch) and
/// non-decreasing in the method's density (method_density), one 2-D isotonic fit over
/// the final rows of every method with a density, and a 1-D fit per PowerSGD rank; from
/// runs of the same epochs when there are any, else all. A density below every measured
/// one gets the accuracy of the lowest measured (Lin et al. 2018, Table 3: DGC at 0.1 %
/// density with its warm-up matched dense training) and says it is a prior.
class Predictors {
 public:
  Predictors(const std::vector<store::Observation>& history, const PlanRequest& req);
  /// The legacy form: one method (none), no link.
  Predictors(const std::vector<store::Observation>& history, const std::string& hardware_class, int epochs);

  /// A time prediction.
  struct Time {
    double seconds_per_image = 0;   ///< computation + communication, all workers together
    double comm_seconds_per_image = 0;  ///< of seconds_per_image: the bytes over the request's link
    double bytes_per_step = 0;      ///< a worker's, push + pull; 0 when not known
    int observations = 0;           ///< rows of this method at exactly this (workers, batch)
    bool measured_method = false;   ///< the method's own rows informed it
  };
  /// Nullopt without a computation measurement, or, with a measured link, without bytes
  /// for the method (neither measured nor modelled).
  std::optional<Time> time(const Config& c) const;
  /// Seconds per image of c (its method's, time()) and the rows of every method at exactly
  /// (w, b): what decides whether (w, b) needs exploring.
  std::optional<std::pair<double, int>> seconds_per_image(const Config& c) const;
  /// Accuracy, the count of final rows at exactly this global batch and method, and
  /// whether it is the density prior; nullopt without data for the method's family.
  struct Accuracy {
    double value = 0;
    int observations = 0;
    bool density_prior = false;  ///< the method's density is below every measured one
  };
  std::optional<Accuracy> accuracy_of(const Config& c) const;
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
  int time_cells() const;  ///< distinct (workers, batch) with computation measurements
  /// The distinct worker counts of the computation measurements, ascending; empty without.
  std::vector<int> time_workers() const;
  /// Whether the history holds epoch-time rows of method `m` (at any configuration).
  bool method_measured(const MethodOption& m) const;
  /// Whether the history holds finished runs of method `m` (its own final accuracies).
  bool method_has_finals(const MethodOption& m) const;

 private:
  void fit_time(const std::vector<store::Observation>& rows);
  void fit_accuracy(const std::vector<store::Observation>& finals, int epochs);
  /// The request's option a row measured (same method; same setting, or none recorded).
  std::optional<MethodOption> option_of(const store::Observation& o) const;
  int shards_for(int workers) const;

  PlanRequest req_;
  std::optional<MonotoneGrid> compute_;           ///< computation seconds per image over (w, b)
  std::map<std::string, double> compute_ratio_;   ///< by method_label: its rows over the pooled fit
  /// By method_label: measured bytes per step by worker count (sum, n), and the mean of
  /// measured / wire_bytes_per_step over its rows.
  struct Bytes {
    std::map<int, std::pair<double, int>> by_workers;
    double model_ratio_sum = 0;
    int model_ratio_n = 0;
  };
  std::map<std::string, Bytes> bytes_;
  std::map<std::string, std::map<std::pair<int, int>, int>> time_counts_;  ///< label → (w, b) → rows
  std::optional<MonotoneGrid> acc_density_;        ///< over (global batch, density)
  std::map<double, MonotoneGrid> acc_rank_;        ///< PowerSGD, by rank, over (global batch, 0)
  std::map<std::string, std::map<double, int>> acc_counts_;  ///< label → global batch → final rows
  double acc_max_global_ = 0;
  double min_density_ = 1;
  bool same_epochs_ = false;
  double acc_sigma_ = 0, t_sigma_ = 0;
  double eval_seconds_ = 0;
};

/// Plans a job. Pure function of the request and the history; thread-safe.
Plan make_plan(const PlanRequest& req, const std::vector<store::Observation>& history);

/// JSON form of a plan for `dltrain plan --json` and the job record.
nlohmann::json to_json(const Plan& p);

}  // namespace dltrain::planner
