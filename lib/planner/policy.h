// The planner's policy as the leader applies it (docs/planner.md): how a job and the
// cluster become a PlanRequest, how a chosen plan is kept for the next job of the same
// model and dataset, what an exploration run is, and which history rows a job leaves
// behind. Plain functions: the leader's adapter (leader/planning.cpp) feeds them its
// jobs, its agents and its store. With planner.h this module holds the whole second
// method; nothing here touches a socket. Thread-safe (no shared state).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "job/job_spec.h"
#include "planner/planner.h"
#include "store/store.h"

namespace dltrain::planner {

/// The leader's planner settings (from its agent configuration).
struct PolicyOptions {
  double switch_threshold = 0.10;       ///< relative predicted gain needed to change a plan
  double margin_sigmas = 0.0;           ///< safety margin (PlanRequest::margin_sigmas)
  std::map<std::string, double> prices{{"cpu", 1.0}};  ///< per task-hour, by hardware class
  int explore_steps = 40;               ///< steps per worker of an exploration run
  double method_tie = 0.05;             ///< PlanRequest::method_tie
};

/// What the policy needs to know of the cluster.
struct ClusterView {
  std::string hardware_class = "cpu";   ///< of the agents the job will run on
  int task_slots = 0;                   ///< tasks of the job's threads_per_task that fit when idle
  double link_bytes_per_sec = 0;        ///< the slowest live agent's measured link; 0 = none measured
  int live_agents = 0;                  ///< agents tasks may go to now; 0 = not known
};

/// Training images per epoch (all workers together): train_samples, or the 60,000 of the
/// IDX datasets.
double train_examples(const JobSpec& spec);

/// The request for `spec` on `cluster`: worker options 1 … (task_slots − ps_shards,
/// capped by max_workers) when workers = "auto", else the job's count if it fits; batch
/// options from the job; the price from the job, else the hardware class's, else 1; the
/// method options (method_options), the cluster's link and the model's tensor sizes
/// (none for a TorchScript model or an ImageFolder whose classes cannot be counted).
PlanRequest plan_request(const JobSpec& spec, const ClusterView& cluster, const PolicyOptions& options,
                         double exploration_seconds, const std::vector<store::Observation>& history = {});

/// The compression methods `spec`'s plan considers: with method = "auto",
/// auto_method_options() and every PowerSGD rank `history` measured; else the job's own.
std::vector<MethodOption> method_options(const JobSpec& spec, const std::vector<store::Observation>& history);

/// Gives `spec` the method `m` with its recipe's defaults (compress::apply_method_defaults,
/// every other [compression] key at its default), method_auto cleared: the planner's
/// choice for a method = "auto" job.
void apply_method(JobSpec& spec, const MethodOption& m);

/// The history rows that inform `spec`'s plan: same model and dataset (the store's
/// query) and the same compression method; every method's for method = "auto".
std::vector<store::Observation> relevant_history(std::vector<store::Observation> rows, const JobSpec& spec);

/// The store meta key of the last plan for the job's model and dataset: "plan/<model>/<dataset>".
std::string plan_key(const JobSpec& spec);
/// The stored form of a plan's choice: {"workers": W, "batch_size": B, "method": M,
/// "setting": S}.
std::string encode_plan(const Config& c);
/// The choice back from its stored form (method none when it has none: plans stored
/// before the planner chose methods). Throws ProtocolError naming `key` and the problem
/// when the text is not such an object.
Config decode_plan(const std::string& text, const std::string& key);

/// The specification of the exploration run of `parent` (job `parent_id`) at `c`: one
/// epoch capped at `explore_steps` steps, no warm-ups, profile only; with method =
/// "auto", c's method (apply_method).
JobSpec exploration_spec(const JobSpec& parent, const std::string& parent_id, const Config& c, int explore_steps);

/// The fields every history row of job `job_id` shares (time stamp: now).
store::Observation base_observation(const JobSpec& spec, const std::string& job_id, const std::string& hardware_class);

/// The row of one finished epoch: the job's epoch time is its slowest worker's latest
/// epoch (`worker_epoch_seconds`, s), its throughput the training set over that;
/// `bytes_this_epoch`: pushed + pulled since the previous row; `eval_seconds`: worker 0's
/// evaluation after the epoch (s; 0 when it did not report one).
store::Observation epoch_observation(store::Observation base, int epoch, const std::vector<double>& worker_epoch_seconds,
                                     double bytes_this_epoch, const JobSpec& spec, double eval_seconds = 0);

/// The row of a finished job: final accuracy, epochs, mean epoch time (wall ÷ epochs),
/// the sum of the workers' latest images/s, bytes per epoch.
store::Observation final_observation(store::Observation base, double test_accuracy, int epochs_done,
                                     double wall_seconds, double images_per_sec, double bytes_total);

/// The row of a finished exploration run (source "profile"), or nullopt when it measured
/// no throughput. `images_per_sec`: the sum over its workers; `bytes_total`: pushed +
/// pulled over the run (0: none), less every worker's first dense pull and worker 0's
/// evaluation pull (4 bytes a parameter each, for a built-in model), scaled to an epoch
/// from the images its workers trained: each min(max_steps, ⌈share / batch⌉) batches.
std::optional<store::Observation> profile_observation(store::Observation base, double images_per_sec,
                                                      const JobSpec& spec, double bytes_total = 0);

}  // namespace dltrain::planner
