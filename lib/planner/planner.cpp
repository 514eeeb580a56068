#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/enum_names.h"

namespace dltrain::planner {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string minutes(double s) { return fmt("%.1f min", s / 60.0); }

// "4 workers × batch 64", and ", dgc 1%" when the plan chooses the method too.
std::string config_label(const Config& c, bool with_method) {
  return std::to_string(c.workers) + " workers × batch " + std::to_string(c.batch_size) +
         (with_method ? ", " + method_label(c.compression) : std::string());
}

std::string mbit(double bytes_per_sec) { return fmt("%.0f Mbit/s", bytes_per_sec * 8 / 1e6); }

}  // namespace

Predictors::Predictors(const std::vector<store::Observation>& history, const std::string& hardware_class, int epochs)
    : Predictors(history, [&] {
        PlanRequest r;
        r.hardware_class = hardware_class;
        r.epochs = epochs;
        return r;
      }()) {}

Predictors::Predictors(const std::vector<store::Observation>& history, const PlanRequest& req) : req_(req) {
  if (req_.method_options.empty()) req_.method_options.push_back(MethodOption{});
  std::vector<store::Observation> rows, finals;
  double eval_sum = 0;
  int eval_n = 0;
  for (const auto& o : history) {
    if (o.final_accuracy >= 0) {
      finals.push_back(o);
      continue;
    }
    if (o.hardware_class != req_.hardware_class) continue;
    if (o.eval_seconds > 0) {
      eval_sum += o.eval_seconds;
      ++eval_n;
    }
    if (o.images_per_sec > 0) rows.push_back(o);
  }
  eval_seconds_ = eval_n > 0 ? eval_sum / eval_n : 0.0;
  fit_time(rows);
  if (req_.tensor_sizes.empty()) {
    // A model whose tensors the leader does not know (TorchScript): its size from a dense
    // method's measured bytes per step (8 bytes a float for none, 4 for fp16), as one
    // tensor, so that the other methods' bytes follow from the wire model.
    for (const auto& [label, per_float] : {std::pair<std::string, double>{"none", 8.0}, {"fp16", 4.0}}) {
      const auto b = bytes_.find(label);
      if (b == bytes_.end() || b->second.by_workers.empty()) continue;
      const auto& [sum, n] = b->second.by_workers.begin()->second;
      req_.tensor_sizes = {std::max<std::int64_t>(1, std::llround(sum / n / per_float))};
      break;
    }
  }
  fit_accuracy(finals, req_.epochs);
}

std::optional<MethodOption> Predictors::option_of(const store::Observation& o) const {
  std::optional<MethodOption> unrecorded;  // a row without its setting: the method's one option, if one
  int same_method = 0;
  for (const auto& m : req_.method_options) {
    if (enum_name(m.method) != o.compression) continue;
    ++same_method;
    if (o.compression_setting > 0 && std::abs(o.compression_setting - m.setting) <= 1e-9 * m.setting) return m;
    if (o.compression_setting <= 0) unrecorded = m;
  }
  return same_method == 1 ? unrecorded : std::nullopt;
}

int Predictors::shards_for(int workers) const {
  if (!req_.shards_follow_workers) return req_.ps_shards;
  return req_.auto_shards_cap > 0 ? std::min(workers, req_.auto_shards_cap) : workers;
}

void Predictors::fit_time(const std::vector<store::Observation>& rows) {
  if (rows.empty()) return;
  std::vector<MonotoneGrid::Point> points;
  std::vector<std::string> labels;  // of each point: its option's, else its own method's
  std::set<std::string> distinct;
  for (const auto& o : rows) {
    const double images = o.epoch_seconds > 0 ? o.images_per_sec * o.epoch_seconds
                                              : static_cast<double>(req_.train_examples);
    const double bytes_per_image = images > 0 ? o.bytes_per_epoch / images : 0.0;
    const double spi = 1.0 / o.images_per_sec;
    // A row recorded before links were measured is taken to have run over today's link.
    const double link = o.link_bytes_per_sec > 0 ? o.link_bytes_per_sec : req_.link_bytes_per_sec;
    const double comm = o.bytes_per_epoch > 0
                            ? comm_seconds_per_image(bytes_per_image, o.workers, std::max(1, o.ps_shards), link)
                            : 0.0;
    // The computation is what is left; never taken below a twentieth of the measured time,
    // whatever a link measured faster than it ran says.
    points.push_back({static_cast<double>(o.workers), static_cast<double>(o.batch_size), std::max(spi - comm, 0.05 * spi), 1.0});
    const auto opt = option_of(o);
    const std::string label = opt ? method_label(*opt) : o.compression;
    labels.push_back(label);
    distinct.insert(label);
    if (!opt) continue;
    ++time_counts_[label][{o.workers, o.batch_size}];
    if (o.bytes_per_epoch > 0) {
      // A worker's bytes per step: the epoch's bytes over its steps (images / batch).
      const double per_step = bytes_per_image * o.batch_size;
      auto& b = bytes_[label];
      auto& cell = b.by_workers[o.workers];
      cell.first += per_step;
      cell.second += 1;
      if (const auto model = wire_bytes_per_step(*opt, req_.tensor_sizes, o.workers, default_min_compress_bytes(*opt));
          model && *model > 0) {
        b.model_ratio_sum += per_step / *model;
        ++b.model_ratio_n;
      }
    }
  }
  compute_.emplace(points, Direction::kDecreasing, Direction::kDecreasing);
  t_sigma_ = compute_->rms_residual(true);
  if (distinct.size() < 2) return;  // one method: the pooled fit is its own
  std::map<std::string, std::pair<double, int>> ratio;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double fit = compute_->predict(points[i].x, points[i].y);
    if (fit <= 0) continue;
    auto& r = ratio[labels[i]];
    r.first += points[i].value / fit;
    r.second += 1;
  }
  for (const auto& [label, r] : ratio) compute_ratio_[label] = r.first / r.second;
}

void Predictors::fit_accuracy(const std::vector<store::Observation>& finals, int epochs) {
  std::vector<store::Observation> use;
  for (const auto& o : finals) {
    if (o.epoch == epochs) use.push_back(o);
  }
  same_epochs_ = !use.empty();
  if (use.empty()) use = finals;
  std::vector<MonotoneGrid::Point> dense;
  std::map<double, std::vector<MonotoneGrid::Point>> ranks;
  for (const auto& o : use) {
    compress::Method method{};
    try {
      method = parse_enum<compress::Method>(o.compression, "compression");
    } catch (const std::exception&) {
      continue;  // a method this build does not know
    }
    MethodOption m{method, o.compression_setting};
    if (m.setting <= 0) {
      const auto opt = option_of(o);
      if (opt) {
        m = *opt;
      } else if (method == compress::Method::kNone || method == compress::Method::kFp16) {
        m.setting = 1.0;
      } else {
        continue;  // a sparse method's density not recorded
      }
    }
    const double g = static_cast<double>(o.workers) * o.batch_size;
    acc_max_global_ = std::max(acc_max_global_, g);
    ++acc_counts_[method_label(m)][g];
    if (const auto d = method_density(m)) {
      dense.push_back({g, *d, o.final_accuracy, 1.0});
    } else {
      ranks[m.setting].push_back({g, 0.0, o.final_accuracy, 1.0});
    }
  }
  double sq = 0;
  std::size_t n = 0;
  if (!dense.empty()) {
    acc_density_.emplace(dense, Direction::kDecreasing, Direction::kIncreasing);
    min_density_ = acc_density_->ys().front();
    sq += std::pow(acc_density_->rms_residual(false), 2) * static_cast<double>(dense.size());
    n += dense.size();
  }
  for (const auto& [rank, pts] : ranks) {
    const auto& fit = acc_rank_.emplace(rank, MonotoneGrid(pts, Direction::kDecreasing, Direction::kIncreasing)).first->second;
    sq += std::pow(fit.rms_residual(false), 2) * static_cast<double>(pts.size());
    n += pts.size();
  }
  acc_sigma_ = n > 0 ? std::sqrt(sq / static_cast<double>(n)) : 0.0;
}

bool Predictors::accuracy_beyond_history(const Config& c) const {
  if (acc_counts_.empty()) return false;
  return static_cast<double>(c.workers) * c.batch_size > acc_max_global_;
}

int Predictors::time_cells() const { return compute_ ? compute_->cells() : 0; }

std::vector<int> Predictors::time_workers() const {
  std::vector<int> out;
  if (compute_) {
    for (double x : compute_->xs()) out.push_back(static_cast<int>(std::lround(x)));
  }
  return out;
}

std::optional<Predictors::Time> Predictors::time(const Config& c) const {
  if (!compute_) return std::nullopt;
  const std::string label = method_label(c.compression);
  Time t;
  // A method never run computes, optimistically, as the fastest measured one: if that
  // makes it the choice, it is profiled first (make_plan), and its own rows then decide.
  double ratio = 1.0;
  if (const auto own = compute_ratio_.find(label); own != compute_ratio_.end()) {
    ratio = own->second;
  } else if (!compute_ratio_.empty()) {
    ratio = std::min_element(compute_ratio_.begin(), compute_ratio_.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; })->second;
  }
  const double compute = compute_->predict(c.workers, c.batch_size) * ratio;
  // The method's bytes per step at this worker count: measured there, else the model
  // scaled by what its rows measured against the model, else measured elsewhere.
  std::optional<double> bytes;
  const auto b = bytes_.find(label);
  if (b != bytes_.end()) {
    if (const auto at = b->second.by_workers.find(c.workers); at != b->second.by_workers.end()) {
      bytes = at->second.first / at->second.second;
    }
  }
  if (!bytes) {
    if (auto model = wire_bytes_per_step(c.compression, req_.tensor_sizes, c.workers, default_min_compress_bytes(c.compression))) {
      if (b != bytes_.end() && b->second.model_ratio_n > 0) *model *= b->second.model_ratio_sum / b->second.model_ratio_n;
      bytes = model;
    } else if (b != bytes_.end() && !b->second.by_workers.empty()) {
      double sum = 0;
      int n = 0;
      for (const auto& [w, v] : b->second.by_workers) {
        sum += v.first;
        n += v.second;
      }
      bytes = sum / n;
    }
  }
  const auto counts = time_counts_.find(label);
  if (req_.link_bytes_per_sec > 0 && !bytes && counts == time_counts_.end()) return std::nullopt;
  // Without bytes (rows from before they were counted) a method's own rows carry its
  // communication: nothing is added to them.
  t.bytes_per_step = bytes.value_or(0.0);
  t.comm_seconds_per_image =
      comm_seconds_per_image(t.bytes_per_step / c.batch_size, c.workers, shards_for(c.workers), req_.link_bytes_per_sec);
  t.seconds_per_image = compute + t.comm_seconds_per_image;
  if (counts != time_counts_.end()) {
    t.measured_method = true;
    if (const auto n = counts->second.find({c.workers, c.batch_size}); n != counts->second.end()) t.observations = n->second;
  }
  return t;
}

bool Predictors::method_measured(const MethodOption& m) const { return time_counts_.count(method_label(m)) > 0; }

bool Predictors::method_has_finals(const MethodOption& m) const { return acc_counts_.count(method_label(m)) > 0; }

std::optional<std::pair<double, int>> Predictors::seconds_per_image(const Config& c) const {
  const auto t = time(c);
  if (!t) return std::nullopt;
  return std::make_pair(t->seconds_per_image, static_cast<int>(compute_->weight_at(c.workers, c.batch_size)));
}

std::optional<Predictors::Accuracy> Predictors::accuracy_of(const Config& c) const {
  const double g = static_cast<double>(c.workers) * c.batch_size;
  Accuracy a;
  if (const auto d = method_density(c.compression)) {
    if (!acc_density_) return std::nullopt;
    a.density_prior = *d < min_density_;
    a.value = acc_density_->predict(g, std::max(*d, min_density_));
  } else {
    const auto fit = acc_rank_.find(c.compression.setting);
    if (fit == acc_rank_.end()) return std::nullopt;
    a.value = fit->second.predict(g, 0.0);
  }
  if (const auto counts = acc_counts_.find(method_label(c.compression)); counts != acc_counts_.end()) {
    if (const auto n = counts->second.find(g); n != counts->second.end()) a.observations = n->second;
  }
  return a;
}

std::optional<std::pair<double, int>> Predictors::accuracy(const Config& c) const {
  const auto a = accuracy_of(c);
  if (!a) return std::nullopt;
  return std::make_pair(a->value, a->observations);
}

Plan make_plan(const PlanRequest& req, const std::vector<store::Observation>& history) {
  Plan plan;
  const Predictors pred(history, req);
  std::vector<MethodOption> methods = req.method_options;
  if (methods.empty()) methods.push_back(MethodOption{});
  plan.link_bytes_per_sec = req.link_bytes_per_sec;
  plan.chooses_method = methods.size() > 1;
  const bool wm = plan.chooses_method;
  std::vector<Config> cands;
  for (int w : req.worker_options) {
    for (int b : req.batch_options) {
      for (const auto& m : methods) cands.push_back({w, b, m});
    }
  }
  if (cands.empty()) {
    plan.explanation =
        req.batch_options.empty() ? "no candidate configuration: no batch size is allowed"
        : req.requested_workers > 0
            ? "no candidate configuration: workers = " + std::to_string(req.requested_workers) + " and " +
                  std::to_string(req.ps_shards) + " PS shard(s) need " +
                  std::to_string(req.requested_workers + req.ps_shards) + " task slots; the live agents offer " +
                  std::to_string(req.task_slots) + " (cores ÷ threads_per_task, when idle)"
            : "no candidate configuration: no worker count fits the live agents' " + std::to_string(req.task_slots) +
                  " task slots beside " + std::to_string(req.ps_shards) + " PS shard(s)";
    return plan;
  }
  if (pred.time_cells() < req.min_time_cells) {
    // Thin history: profile the corners most likely to be cheapest and fastest.
    const int wmax = *std::max_element(req.worker_options.begin(), req.worker_options.end());
    const int wmin = *std::min_element(req.worker_options.begin(), req.worker_options.end());
    const int bmax = *std::max_element(req.batch_options.begin(), req.batch_options.end());
    const int bmin = *std::min_element(req.batch_options.begin(), req.batch_options.end());
    // Exploration measures the computation; the methods' bytes follow from their model.
    // It runs the method that sends least, so that a slow link costs it least.
    MethodOption lightest = methods.front();
    double least = -1;
    for (const auto& m : methods) {
      const auto bytes = wire_bytes_per_step(m, req.tensor_sizes, wmax, default_min_compress_bytes(m));
      if (bytes && (least < 0 || *bytes < least)) {
        least = *bytes;
        lightest = m;
      }
    }
    for (Config c : {Config{wmax, bmax, lightest}, Config{wmin, bmin, lightest}, Config{wmax, bmin, lightest}}) {
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
    const auto t = pred.time(c);
    if (!t) {
      row.reason = pred.time_cells() == 0
                       ? "no epoch-time measurements for " + req.model + " on " + req.dataset + " (" + req.hardware_class + ")"
                       : "no bytes per step known for " + method_label(c.compression) + " (not measured; the model's tensors unknown)";
      plan.table.push_back(row);
      continue;
    }
    const auto images = static_cast<double>(req.train_examples);
    row.eval_seconds = pred.eval_seconds();
    row.seconds_per_epoch = t->seconds_per_image * images + row.eval_seconds;
    row.comm_seconds_per_epoch = t->comm_seconds_per_image * images;
    row.bytes_per_step = t->bytes_per_step;
    row.time_source = t->observations > 0 ? "measured" : "model";
    row.time_observations = t->observations;
    row.total_seconds = req.epochs * row.seconds_per_epoch + req.exploration_seconds;
    const auto a = pred.accuracy_of(c);
    const bool beyond = pred.accuracy_beyond_history(c);
    if (a) {
      row.accuracy = a->value;
      row.accuracy_observations = a->observations;
      row.accuracy_source = beyond                              ? "beyond history"
                            : a->density_prior                 ? "prior (density below any measured)"
                            : wm && !pred.method_has_finals(c.compression) ? "history of other methods (monotone in density)"
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
  auto best = std::find_if(plan.table.begin(), plan.table.end(), [](const auto& r) { return r.feasible; });
  std::string tie_note;
  if (best != plan.table.end() && wm) {
    // Candidates within method_tie of the cheapest are tied: the most accurate, then the
    // densest method of them, goes first (the same price for a smaller risk).
    const double limit = best->cost * (1.0 + req.method_tie);
    auto pick = best;
    for (auto it = best; it != plan.table.end() && it->feasible && it->cost <= limit; ++it) {
      const double da = method_density(it->config.compression).value_or(0.0);
      const double db = method_density(pick->config.compression).value_or(0.0);
      if (it->accuracy > pick->accuracy + 1e-12 || (std::abs(it->accuracy - pick->accuracy) <= 1e-12 && da > db)) pick = it;
    }
    if (pick != best) {
      tie_note = "; within " + fmt("%.0f", 100.0 * req.method_tie) + "% of the cost of " + config_label(best->config, true) +
                 " (" + fmt("%.4f", best->cost) + "), taken for its " +
                 (pick->accuracy > best->accuracy + 1e-12 ? std::string("higher predicted accuracy") : std::string("higher density"));
      std::rotate(best, pick, pick + 1);
    }
  }
  if (best != plan.table.end()) {
    plan.feasible = true;
    plan.choice = best->config;
    plan.explanation = config_label(best->config, wm) + ": cheapest configuration predicted to " +
                       (best->accuracy_source == "prior" && req.target_accuracy <= 0
                            ? std::string("finish (its accuracy not known yet: no finished run in the history)")
                            : "reach " + fmt("%.4f", best->accuracy)) +
                       " in " + minutes(best->total_seconds) + " at cost " + fmt("%.4f", best->cost) +
                       " (task-hours × price)" + tie_note;
    if (wm) {
      plan.explanation += req.link_bytes_per_sec > 0
                              ? "; the link measured " + mbit(req.link_bytes_per_sec) + ", " +
                                    fmt("%.1f", best->comm_seconds_per_epoch) + " s of each epoch on the wire"
                              : "; no link measured, so the methods differ only in computation";
    }
    if (req.previous) {
      const auto prev = std::find_if(plan.table.begin(), plan.table.end(),
                                     [&](const auto& r) { return r.config == *req.previous; });
      if (prev != plan.table.end() && prev->feasible && !(best->config == *req.previous) &&
          best->cost >= prev->cost * (1.0 - req.switch_threshold)) {
        plan.choice = prev->config;
        plan.kept_previous = true;
        plan.explanation = "kept the previous choice " + config_label(prev->config, wm) + ": the cheapest alternative saves " +
                           fmt("%.1f", 100.0 * (1.0 - best->cost / prev->cost)) + "% of its cost, under the " +
                           fmt("%.0f", 100.0 * req.switch_threshold) + "% switching threshold";
      }
    }
    if (wm && plan.explore.empty() && !pred.method_measured(plan.choice.compression)) {
      // The choice's method was never run here: its selection or conversion cost is a
      // guess. Profile it first (the leader plans again after, a bounded number of rounds).
      plan.explore.push_back(plan.choice);
      plan.explanation += "; first profiling " + method_label(plan.choice.compression) +
                          ", never run here: its computation is so far assumed that of the fastest method measured";
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
         " (" + config_label(most_accurate->config, wm) + "), short of the target " +
         fmt("%.4f", req.target_accuracy) + " by " +
         fmt("%.4f", req.target_accuracy - (most_accurate->accuracy - most_accurate->accuracy_margin)) + ".";
  }
  if (req.deadline_seconds > 0 && fastest->total_seconds > req.deadline_seconds) {
    s += " Time: the fastest prediction is " + minutes(fastest->total_seconds) + " (" + config_label(fastest->config, wm) +
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
  const auto method_json = [](nlohmann::json& j, const MethodOption& m) {
    j["compression"] = method_label(m);
    j["method"] = enum_name(m.method);
    j["setting"] = m.setting;
  };
  nlohmann::json table = nlohmann::json::array();
  nlohmann::json methods = nlohmann::json::array();
  std::set<std::string> seen;
  for (const auto& r : p.table) {
    nlohmann::json row{{"workers", r.config.workers},
                       {"batch_size", r.config.batch_size},
                       {"feasible", r.feasible},
                       {"reason", r.reason}};
    method_json(row, r.config.compression);
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
      row["bytes_per_step"] = r.bytes_per_step;
      row["comm_seconds_per_epoch"] = r.comm_seconds_per_epoch;
      row["time_source"] = r.time_source;
    }
    // The best row of each method: the table is sorted, so its first of each.
    if (p.chooses_method && seen.insert(method_label(r.config.compression)).second) methods.push_back(row);
    table.push_back(row);
  }
  nlohmann::json j{{"feasible", p.feasible}, {"explanation", p.explanation}, {"table", table},
                   {"kept_previous", p.kept_previous}, {"link_bytes_per_sec", p.link_bytes_per_sec},
                   {"chooses_method", p.chooses_method}};
  if (p.chooses_method) j["methods"] = methods;
  if (p.feasible) {
    j["choice"] = {{"workers", p.choice.workers}, {"batch_size", p.choice.batch_size}};
    method_json(j["choice"], p.choice.compression);
  }
  nlohmann::json ex = nlohmann::json::array();
  for (const auto& c : p.explore) {
    nlohmann::json e{{"workers", c.workers}, {"batch_size", c.batch_size}};
    method_json(e, c.compression);
    ex.push_back(e);
  }
  j["explore"] = ex;
  return j;
}

}  // namespace dltrain::planner
