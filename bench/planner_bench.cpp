// Planner benchmark on a measured grid (bench/planner_grid.py): prediction error of epoch
// time and final accuracy against the number of observations, and, over random
// (target accuracy, deadline) scenarios, how often the planner's choice truly meets the
// target, its regret against the true optimum and its cost against the independent
// baseline (most workers available, default batch 64). The truth is always the other
// seed's runs: the planner is fitted on seed A and scored on seed B, then the reverse.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "planner/planner.h"

using namespace dltrain;
using json = nlohmann::json;

namespace {

struct Run {
  int workers, batch, seed;
  double accuracy;           // final test accuracy
  std::vector<double> ips;   // images/s of all workers, per epoch
  std::vector<double> secs;  // worker 0's epoch seconds, per epoch
  double train_seconds() const {
    double s = 0;
    for (double x : secs) s += x;
    return s;
  }
};

std::vector<store::Observation> observations(const std::vector<const Run*>& runs, int epochs) {
  std::vector<store::Observation> out;
  double ts = 0;
  for (const Run* r : runs) {
    for (std::size_t e = 0; e < r->ips.size(); ++e) {
      store::Observation o;
      o.model = "cnn";
      o.dataset = "fashion-mnist";
      o.workers = r->workers;
      o.batch_size = r->batch;
      o.epoch = static_cast<int>(e + 1);
      o.epoch_seconds = r->secs[e];
      o.images_per_sec = r->ips[e];
      o.timestamp = ++ts;
      out.push_back(o);
    }
    store::Observation f;
    f.model = "cnn";
    f.dataset = "fashion-mnist";
    f.workers = r->workers;
    f.batch_size = r->batch;
    f.epoch = epochs;
    f.final_accuracy = r->accuracy;
    f.images_per_sec = r->ips.empty() ? 0 : r->ips.back();
    f.timestamp = ++ts;
    out.push_back(f);
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string in_path = argc > 1 ? argv[1] : "bench/results/planner_grid.json";
  const std::string out_path = argc > 2 ? argv[2] : "bench/results/planner_bench.json";
  std::ifstream in(in_path);
  if (!in) {
    std::cerr << "planner_bench: cannot read " << in_path << " (run bench/planner_grid.py first)\n";
    return 2;
  }
  const json grid = json::parse(in);
  const int epochs = grid.at("epochs").get<int>();
  const double examples = grid.at("train_samples").get<double>();
  std::map<int, std::vector<Run>> by_seed;
  for (const auto& r : grid.at("runs")) {
    if (r.value("state", "") != "succeeded") continue;
    Run run{r["workers"], r["batch_size"], r["seed"], r["final_accuracy"], {}, {}};
    // The job's epoch time is its slowest worker's (async workers drift apart; worker 0
    // also evaluates between epochs), and its throughput is the training set over that.
    std::map<int, double> secs;
    for (const auto& e : r["epoch_rows"]) {
      auto& m = secs[e["epoch"].get<int>()];
      m = std::max(m, e["epoch_seconds"].get<double>());
    }
    for (auto& [ep, v] : secs) {
      run.secs.push_back(v);
      run.ips.push_back(grid.at("train_samples").get<double>() / v);
    }
    by_seed[run.seed].push_back(run);
  }
  if (by_seed.size() < 2) {
    std::cerr << "planner_bench: need runs of two seeds\n";
    return 2;
  }
  const int seed_a = by_seed.begin()->first, seed_b = std::next(by_seed.begin())->first;
  std::mt19937 rng(12345);
  json result;

  // 1. Prediction error against the number of fitted configurations.
  std::cout << "## Prediction error (fit on one seed, truth from the other)\n\n"
            << "| configurations fitted | epoch-time observations | epoch time MAPE | accuracy MAE (points) |\n"
            << "|---|---|---|---|\n";
  json err = json::array();
  const std::size_t nconf = by_seed[seed_a].size();
  for (std::size_t n : {std::size_t{2}, std::size_t{4}, std::size_t{8}, std::size_t{12}, std::size_t{16}, nconf - 1}) {
    if (n >= nconf) continue;
    std::vector<double> t_err, a_err;
    for (int trial = 0; trial < 200; ++trial) {
      for (auto [fit_seed, truth_seed] : {std::pair{seed_a, seed_b}, std::pair{seed_b, seed_a}}) {
        auto& fit_runs = by_seed[fit_seed];
        std::vector<std::size_t> idx(fit_runs.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::shuffle(idx.begin(), idx.end(), rng);
        std::vector<const Run*> fit;
        std::set<std::pair<int, int>> fitted;
        for (std::size_t i = 0; i < n; ++i) {
          fit.push_back(&fit_runs[idx[i]]);
          fitted.insert({fit_runs[idx[i]].workers, fit_runs[idx[i]].batch});
        }
        planner::Predictors p(observations(fit, epochs), "cpu", epochs);
        for (const auto& t : by_seed[truth_seed]) {
          if (fitted.count({t.workers, t.batch})) continue;  // held out only
          const auto spi = p.seconds_per_image({t.workers, t.batch});
          if (spi && !t.secs.empty()) {
            const double pred = spi->first * examples;
            const double truth = mean(t.secs);
            t_err.push_back(std::fabs(pred - truth) / truth);
          }
          const auto acc = p.accuracy({t.workers, t.batch});
          if (acc) a_err.push_back(std::fabs(acc->first - t.accuracy) * 100);
        }
      }
    }
    std::printf("| %zu | %zu | %.1f%% | %.2f |\n", n, n * static_cast<std::size_t>(epochs), 100 * mean(t_err), mean(a_err));
    err.push_back({{"configurations", n}, {"observations", n * epochs}, {"epoch_time_mape", mean(t_err)},
                   {"accuracy_mae_points", mean(a_err)}});
  }
  result["prediction_error"] = err;

  // 2. Scenarios, without and with a one-sigma safety margin.
  json scen = json::array();
  for (double margin : {0.0, 1.0}) {
  rng.seed(777);
  int scenarios = 0, met = 0, declined = 0, infeasible_truth = 0, baseline_met = 0, both = 0;
  std::vector<double> regret, vs_baseline;
  for (int s = 0; s < 1000; ++s) {
    const auto [fit_seed, truth_seed] = s % 2 == 0 ? std::pair{seed_a, seed_b} : std::pair{seed_b, seed_a};
    const auto& truth = by_seed[truth_seed];
    double amin = 1, amax = 0, tmin = 1e18, tmax = 0;
    for (const auto& t : truth) {
      amin = std::min(amin, t.accuracy);
      amax = std::max(amax, t.accuracy);
      tmin = std::min(tmin, t.train_seconds());
      tmax = std::max(tmax, t.train_seconds());
    }
    std::uniform_real_distribution<double> ua(amin, amax), ut(tmin, tmax * 1.2);
    planner::PlanRequest req;
    req.model = "cnn";
    req.dataset = "fashion-mnist";
    req.epochs = epochs;
    req.train_examples = static_cast<std::int64_t>(examples);
    req.target_accuracy = ua(rng);
    req.deadline_seconds = ut(rng);
    std::set<int> ws, bs;
    for (const auto& t : truth) {
      ws.insert(t.workers);
      bs.insert(t.batch);
    }
    req.margin_sigmas = margin;
    req.worker_options.assign(ws.begin(), ws.end());
    req.batch_options.assign(bs.begin(), bs.end());
    auto cost = [&](const Run& r) { return (r.workers + 1) * r.train_seconds() / 3600.0; };
    auto ok = [&](const Run& r) { return r.accuracy >= req.target_accuracy && r.train_seconds() <= req.deadline_seconds; };
    const Run* best = nullptr;
    for (const auto& t : truth) {
      if (ok(t) && (!best || cost(t) < cost(*best))) best = &t;
    }
    if (!best) {
      ++infeasible_truth;
      continue;
    }
    ++scenarios;
    std::vector<const Run*> fit;
    for (const auto& r : by_seed[fit_seed]) fit.push_back(&r);
    const auto plan = planner::make_plan(req, observations(fit, epochs));
    const Run* baseline = nullptr;
    for (const auto& t : truth) {
      if (t.workers == *ws.rbegin() && t.batch == 64) baseline = &t;
    }
    const bool base_ok = baseline && ok(*baseline);
    baseline_met += base_ok ? 1 : 0;
    if (!plan.feasible) {
      ++declined;
      continue;
    }
    const Run* chosen = nullptr;
    for (const auto& t : truth) {
      if (t.workers == plan.choice.workers && t.batch == plan.choice.batch_size) chosen = &t;
    }
    if (!chosen) continue;
    if (ok(*chosen)) {
      ++met;
      regret.push_back(cost(*chosen) / cost(*best) - 1);
    }
    if (baseline) {
      ++both;
      vs_baseline.push_back(cost(*chosen) / cost(*baseline));
    }
  }
  std::printf("\n## Scenarios, safety margin %.0f sigma (%d with a truly feasible configuration; %d without, skipped)\n\n",
              margin, scenarios, infeasible_truth);
  std::printf("| figure | value |\n|---|---|\n");
  std::printf("| planner's choice truly meets target and deadline | %.1f%% |\n", 100.0 * met / scenarios);
  std::printf("| planner declined (predicted nothing feasible) | %.1f%% |\n", 100.0 * declined / scenarios);
  std::printf("| of the configurations it chose, truly meet both | %.1f%% |\n",
              100.0 * met / std::max(1, scenarios - declined));
  std::printf("| mean regret (true cost / true optimum − 1), when met | %.1f%% |\n", 100 * mean(regret));
  int wmax_all = 0;
  for (const auto& r : by_seed[seed_a]) wmax_all = std::max(wmax_all, r.workers);
  std::printf("| baseline (%d workers, batch 64) truly meets both | %.1f%% |\n", wmax_all, 100.0 * baseline_met / scenarios);
  std::printf("| planner's true cost / baseline's true cost (mean) | %.2f |\n", mean(vs_baseline));
  scen.push_back({{"margin_sigmas", margin},
                  {"met_of_chosen", static_cast<double>(met) / std::max(1, scenarios - declined)},
                  {"count", scenarios},
                         {"skipped_no_truth", infeasible_truth},
                         {"met", static_cast<double>(met) / scenarios},
                         {"declined", static_cast<double>(declined) / scenarios},
                         {"mean_regret", mean(regret)},
                         {"baseline_met", static_cast<double>(baseline_met) / scenarios},
                         {"cost_vs_baseline", mean(vs_baseline)}});
  }
  result["scenarios"] = scen;
  std::ofstream(out_path) << result.dump(2) << "\n";
  return 0;
}
