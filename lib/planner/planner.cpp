#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace dltrain::planner {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string minutes(double s) { return fmt("%.1f min", s / 60.0); }

// Position of v in sorted `xs`: lower index and interpolation fraction (clipped).
std::pair<std::size_t, double> locate(const std::vector<double>& xs, double v) {
  if (xs.size() == 1 || v <= xs.front()) return {0, 0.0};
  if (v >= xs.back()) return {xs.size() - 2, 1.0};
  const auto j = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), v) - xs.begin());
  return {j - 1, (v - xs[j - 1]) / (xs[j] - xs[j - 1])};
}

}  // namespace

Predictors::Predictors(const std::vector<store::Observation>& history, const std::string& hardware_class,
                       int epochs) {
  // Epoch time, as seconds per image of all workers together.
  std::map<std::pair<int, int>, std::pair<double, int>> cells;  // (w, b) → (Σ spi, n)
  std::vector<store::Observation> finals;
  double eval_sum = 0;
  int eval_n = 0;
  for (const auto& o : history) {
    if (o.final_accuracy >= 0) {
      finals.push_back(o);
      continue;
    }
    if (o.hardware_class == hardware_class && o.eval_seconds > 0) {
      eval_sum += o.eval_seconds;
      ++eval_n;
    }
    if (o.hardware_class != hardware_class || o.images_per_sec <= 0) continue;
    auto& c = cells[{o.workers, o.batch_size}];
    c.first += 1.0 / o.images_per_sec;
    c.second += 1;
  }
  eval_seconds_ = eval_n > 0 ? eval_sum / eval_n : 0.0;
  std::set<double> wset, bset;
  for (const auto& [k, v] : cells) {
    wset.insert(k.first);
    bset.insert(k.second);
  }
  ws_.assign(wset.begin(), wset.end());
  bs_.assign(bset.begin(), bset.end());
  if (!cells.empty()) {
    double mean = 0, n = 0;
    for (const auto& [k, v] : cells) {
      mean += v.first;
      n += v.second;
    }
    mean /= n;
    std::vector<std::vector<double>> y(ws_.size(), std::vector<double>(bs_.size(), mean));
    std::vector<std::vector<double>> w(ws_.size(), std::vector<double>(bs_.size(), 1e-9));
    t_count_.assign(ws_.size(), std::vector<int>(bs_.size(), 0));
    for (const auto& [k, v] : cells) {
      const auto r = static_cast<std::size_t>(std::lower_bound(ws_.begin(), ws_.end(), k.first) - ws_.begin());
      const auto c = static_cast<std::size_t>(std::lower_bound(bs_.begin(), bs_.end(), k.second) - bs_.begin());
      y[r][c] = v.first / v.second;
      w[r][c] = v.second;
      t_count_[r][c] = v.second;
    }
    t_fit_ = isotonic_grid(y, w, Direction::kDecreasing, Direction::kDecreasing).z;
    // Scatter of the individual measurements around the fit, relative to it.
    double sq = 0, n2 = 0;
    for (const auto& o : history) {
      if (o.final_accuracy >= 0 || o.hardware_class != hardware_class || o.images_per_sec <= 0) continue;
      const auto r = static_cast<std::size_t>(std::lower_bound(ws_.begin(), ws_.end(), o.workers) - ws_.begin());
      const auto c = static_cast<std::size_t>(std::lower_bound(bs_.begin(), bs_.end(), o.batch_size) - bs_.begin());
      const double f = t_fit_[r][c];
      if (f > 0) {
        sq += std::pow((1.0 / o.images_per_sec - f) / f, 2);
        n2 += 1;
      }
    }
    t_sigma_ = n2 > 0 ? std::sqrt(sq / n2) : 0;
  }
  // Final accuracy against the global batch size.
  std::vector<store::Observation> use;
  for (const auto& o : finals) {
    if (o.epoch == epochs) use.push_back(o);
  }
  same_epochs_ = !use.empty();
  if (use.empty()) use = finals;
  if (!use.empty()) {
    std::vector<double> x, y, w;
    std::map<double, int> counts;
    for (const auto& o : use) {
      const double g = static_cast<double>(o.workers) * o.batch_size;
      x.push_back(g);
      y.push_back(o.final_accuracy);
      w.push_back(1.0);
      ++counts[g];
    }
    acc_.emplace(x, y, w, Direction::kDecreasing);
    double sq = 0;
    for (std::size_t i = 0; i < x.size(); ++i) sq += std::pow(y[i] - acc_->predict(x[i]), 2);
    acc_sigma_ = std::sqrt(sq / static_cast<double>(x.size()));
    for (const auto& [g, n] : counts) acc_counts_.emplace_back(g, n);
  }
}

bool Predictors::accuracy_beyond_history(const Config& c) const {
  if (acc_counts_.empty()) return false;
  return static_cast<double>(c.workers) * c.batch_size > acc_counts_.back().first;
}

int Predictors::time_cells() const {
  int n = 0;
  for (const auto& row : t_count_) {
    for (int c : row) n += c > 0 ? 1 : 0;
  }
  return n;
}

std::optional<std::pair<double, int>> Predictors::seconds_per_image(const Config& c) const {
  if (t_fit_.empty()) return std::nullopt;
  const auto [r, fr] = locate(ws_, c.workers);
  const auto [k, fc] = locate(bs_, c.batch_size);
  auto at = [&](std::size_t i, std::size_t j) {
    return t_fit_[std::min(i, ws_.size() - 1)][std::min(j, bs_.size() - 1)];
  };
  const double v = (1 - fr) * ((1 - fc) * at(r, k) + fc * at(r, k + 1)) +
                   fr * ((1 - fc) * at(r + 1, k) + fc * at(r + 1, k + 1));
  int n = 0;
  for (std::size_t i = 0; i < ws_.size(); ++i) {
    for (std::size_t j = 0; j < bs_.size(); ++j) {
      if (ws_[i] == c.workers && bs_[j] == c.batch_size) n = t_count_[i][j];
    }
  }
  return std::make_pair(v, n);
}

std::optional<std::pair<double, int>> Predictors::accuracy(const Config& c) const {
  if (!acc_) return std::nullopt;
  const double g = static_cast<double>(c.workers) * c.batch_size;
  int n = 0;
  for (const auto& [x, cnt] : acc_counts_) {
    if (x == g) n = cnt;
  }
  return std::make_pair(acc_->predict(g), n);
}

Plan make_plan(const PlanRequest& req, const std::vector<store::Observation>& history) {
  Plan plan;
  Predictors pred(history, req.hardware_class, req.epochs);
  std::vector<Config> cands;
  for (int w : req.worker_options) {
    for (int b : req.batch_options) cands.push_back({w, b});
  }
  if (cands.empty()) {
    plan.explanation = "no candidate configuration: no worker count fits the free agents or no batch size is allowed";
    return plan;
  }
  if (pred.time_cells() < req.min_time_cells) {
    // Thin history: profile the corners most likely to be cheapest and fastest.
    const int wmax = *std::max_element(req.worker_options.begin(), req.worker_options.end());
    const int wmin = *std::min_element(req.worker_options.begin(), req.worker_options.end());
    const int bmax = *std::max_element(req.batch_options.begin(), req.batch_options.end());
    const int bmin = *std::min_element(req.batch_options.begin(), req.batch_options.end());
    for (Config c : {Config{wmax, bmax}, Config{wmin, bmin}, Config{wmax, bmin}}) {
      const auto known = pred.seconds_per_image(c);
      if ((!known || known->second == 0) && std::find(plan.explore.begin(), plan.explore.end(), c) == plan.explore.end()) {
        plan.explore.push_back(c);
      }
    }
  }
  int min_global = INT32_MAX;
  for (const auto& c : cands) min_global = std::min(min_global, c.workers * c.batch_size);
  for (const auto& c : cands) {
    CandidateRow row;
    row.config = c;
    const auto t = pred.seconds_per_image(c);
    if (!t) {
      row.reason = "no epoch-time measurements for " + req.model + " on " + req.dataset + " (" + req.hardware_class + ")";
      plan.table.push_back(row);
      continue;
    }
    row.eval_seconds = pred.eval_seconds();
    row.seconds_per_epoch = t->first * static_cast<double>(req.train_examples) + row.eval_seconds;
    row.time_observations = t->second;
    row.total_seconds = req.epochs * row.seconds_per_epoch + req.exploration_seconds;
    const auto a = pred.accuracy(c);
    const bool beyond = pred.accuracy_beyond_history(c);
    if (a) {
      row.accuracy = a->first;
      row.accuracy_observations = a->second;
      row.accuracy_source = beyond                              ? "beyond history"
                            : pred.accuracy_from_same_epochs() ? "history"
                                                               : "history (other epochs)";
    } else {
      // Conservative prior: only the smallest global batch is assumed to reach the target.
      row.accuracy = c.workers * c.batch_size == min_global ? req.target_accuracy : 0.0;
      row.accuracy_source = "prior";
    }
    row.cost = (c.workers + req.ps_shards) * req.price_per_task_hour * row.total_seconds / 3600.0;
    row.accuracy_margin = row.accuracy_source == "prior" ? 0.0 : req.margin_sigmas * pred.accuracy_sigma();
    row.time_margin = req.margin_sigmas * pred.time_sigma();
    std::vector<std::string> why;
    if (req.target_accuracy > 0 && beyond && a) {
      why.push_back("global batch " + std::to_string(c.workers * c.batch_size) +
                    " is larger than any with a measured accuracy: only an upper bound " + fmt("%.4f", row.accuracy) +
                    " is known");
    } else if (req.target_accuracy > 0 && row.accuracy - row.accuracy_margin < req.target_accuracy) {
      const double lower = row.accuracy - row.accuracy_margin;
      why.push_back("predicted accuracy " + fmt("%.4f", row.accuracy) +
                    (row.accuracy_margin > 0 ? " (" + fmt("%.4f", lower) + " with the margin)" : std::string()) +
                    " < target " + fmt("%.4f", req.target_accuracy) + " (short by " +
                    fmt("%.4f", req.target_accuracy - lower) + ")");
    }
    const double upper = row.total_seconds * (1.0 + row.time_margin);
    if (req.deadline_seconds > 0 && upper > req.deadline_seconds) {
      why.push_back("predicted time " + minutes(row.total_seconds) +
                    (row.time_margin > 0 ? " (" + minutes(upper) + " with the margin)" : std::string()) + " > deadline " +
                    minutes(req.deadline_seconds) + " (over by " + minutes(upper - req.deadline_seconds) + ")");
    }
    row.feasible = why.empty();
    for (const auto& w : why) row.reason += (row.reason.empty() ? "" : "; ") + w;
    plan.table.push_back(row);
  }
  std::stable_sort(plan.table.begin(), plan.table.end(), [](const CandidateRow& a, const CandidateRow& b) {
    if (a.feasible != b.feasible) return a.feasible;
    const bool ta = a.total_seconds > 0, tb = b.total_seconds > 0;
    if (ta != tb) return ta;
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.total_seconds != b.total_seconds) return a.total_seconds < b.total_seconds;
    return a.config.workers < b.config.workers;
  });
  const auto best = std::find_if(plan.table.begin(), plan.table.end(), [](const auto& r) { return r.feasible; });
  if (best != plan.table.end()) {
    plan.feasible = true;
    plan.choice = best->config;
    plan.explanation = std::to_string(best->config.workers) + " workers × batch " + std::to_string(best->config.batch_size) +
                       ": cheapest configuration predicted to reach " + fmt("%.4f", best->accuracy) + " in " +
                       minutes(best->total_seconds) + " at cost " + fmt("%.4f", best->cost);
    if (req.previous) {
      const auto prev = std::find_if(plan.table.begin(), plan.table.end(),
                                     [&](const auto& r) { return r.config == *req.previous; });
      if (prev != plan.table.end() && prev->feasible && !(best->config == *req.previous) &&
          best->cost >= prev->cost * (1.0 - req.switch_threshold)) {
        plan.choice = prev->config;
        plan.kept_previous = true;
        plan.explanation = "kept the previous choice " + std::to_string(prev->config.workers) + " workers × batch " +
                           std::to_string(prev->config.batch_size) + ": the cheapest alternative saves " +
                           fmt("%.1f", 100.0 * (1.0 - best->cost / prev->cost)) + "% of its cost, under the " +
                           fmt("%.0f", 100.0 * req.switch_threshold) + "% switching threshold";
      }
    }
    return plan;
  }
  // Nothing feasible: say which constraint fails and by how much.
  const CandidateRow* most_accurate = nullptr;
  const CandidateRow* fastest = nullptr;
  for (const auto& r : plan.table) {
    if (r.total_seconds <= 0) continue;
    if (!most_accurate || r.accuracy - r.accuracy_margin > most_accurate->accuracy - most_accurate->accuracy_margin) {
      most_accurate = &r;
    }
    if (!fastest || r.total_seconds < fastest->total_seconds) fastest = &r;
  }
  if (!most_accurate) {
    plan.explanation = "no epoch-time history for " + req.model + " on " + req.dataset +
                       (plan.explore.empty() ? std::string() : "; profile the suggested configurations first");
    return plan;
  }
  std::string s = "no configuration meets every constraint.";
  if (req.target_accuracy > 0 && most_accurate->accuracy < req.target_accuracy) {
    s += " Accuracy: the best prediction is " + fmt("%.4f", most_accurate->accuracy) +
         (most_accurate->accuracy_margin > 0
              ? " (" + fmt("%.4f", most_accurate->accuracy - most_accurate->accuracy_margin) + " with the margin)"
              : std::string()) +
         " (" +
         std::to_string(most_accurate->config.workers) + " workers × batch " +
         std::to_string(most_accurate->config.batch_size) + "), short of the target " +
         fmt("%.4f", req.target_accuracy) + " by " +
         fmt("%.4f", req.target_accuracy - (most_accurate->accuracy - most_accurate->accuracy_margin)) + ".";
  }
  if (req.deadline_seconds > 0 && fastest->total_seconds > req.deadline_seconds) {
    s += " Time: the fastest prediction is " + minutes(fastest->total_seconds) + " (" +
         std::to_string(fastest->config.workers) + " workers × batch " + std::to_string(fastest->config.batch_size) +
         "), over the deadline " + minutes(req.deadline_seconds) + " by " +
         minutes(fastest->total_seconds - req.deadline_seconds) + ".";
  }
  if (s == "no configuration meets every constraint.") {
    s += " The configurations that reach the target miss the deadline and the ones within the deadline miss the target.";
  }
  plan.explanation = s;
  return plan;
}

nlohmann::json to_json(const Plan& p) {
  nlohmann::json table = nlohmann::json::array();
  for (const auto& r : p.table) {
    nlohmann::json row{{"workers", r.config.workers},
                       {"batch_size", r.config.batch_size},
                       {"feasible", r.feasible},
                       {"reason", r.reason}};
    if (r.total_seconds > 0) {
      row["seconds_per_epoch"] = r.seconds_per_epoch;
      row["eval_seconds"] = r.eval_seconds;
      row["time_observations"] = r.time_observations;
      row["total_seconds"] = r.total_seconds;
      row["accuracy"] = r.accuracy;
      row["accuracy_observations"] = r.accuracy_observations;
      row["accuracy_source"] = r.accuracy_source;
      row["accuracy_margin"] = r.accuracy_margin;
      row["time_margin"] = r.time_margin;
      row["cost"] = r.cost;
    }
    table.push_back(row);
  }
  nlohmann::json j{{"feasible", p.feasible}, {"explanation", p.explanation}, {"table", table},
                   {"kept_previous", p.kept_previous}};
  if (p.feasible) j["choice"] = {{"workers", p.choice.workers}, {"batch_size", p.choice.batch_size}};
  nlohmann::json ex = nlohmann::json::array();
  for (const auto& c : p.explore) ex.push_back({{"workers", c.workers}, {"batch_size", c.batch_size}});
  j["explore"] = ex;
  return j;
}

}  // namespace dltrain::planner
