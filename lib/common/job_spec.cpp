#include "common/job_spec.h"

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "common/errors.h"

namespace dltrain {
namespace {

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::string render(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.value<std::string>().value_or("") << '"';
  } else if (n.is_integer()) {
    os << *n.value<std::int64_t>();
  } else if (n.is_floating_point()) {
    os << *n.value<double>();
  } else if (n.is_boolean()) {
    os << (*n.value<bool>() ? "true" : "false");
  } else {
    os << type_name(n);
  }
  return os.str();
}

std::int64_t get_int(const toml::node& n, const std::string& field, std::int64_t lo,
                     std::int64_t hi) {
  if (!n.is_integer()) {
    throw ConfigError(field, "expected an integer in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "], got " + type_name(n) + " " + render(n));
  }
  auto v = *n.value<std::int64_t>();
  if (v < lo || v > hi) {
    throw ConfigError(field, "expected an integer in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "], got " + std::to_string(v));
  }
  return v;
}

double get_double(const toml::node& n, const std::string& field, double lo, double hi,
                  bool lo_open, bool hi_open) {
  if (!n.is_number()) {
    throw ConfigError(field, "expected a number, got " + type_name(n) + " " + render(n));
  }
  double v = *n.value<double>();
  std::ostringstream range;
  range << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
  bool bad = !std::isfinite(v) || (lo_open ? v <= lo : v < lo) || (hi_open ? v >= hi : v > hi);
  if (bad) {
    std::ostringstream os;
    os << "expected a number in " << range.str() << ", got " << v;
    throw ConfigError(field, os.str());
  }
  return v;
}

std::string get_choice(const toml::node& n, const std::string& field,
                       std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) list += (list.empty() ? "" : " | ") + std::string(c);
  if (!n.is_string()) {
    throw ConfigError(field, "expected one of " + list + ", got " + type_name(n) + " " + render(n));
  }
  auto v = *n.value<std::string>();
  for (const char* c : choices) {
    if (v == c) return v;
  }
  throw ConfigError(field, "expected one of " + list + ", got \"" + v + "\"");
}

std::string get_string(const toml::node& n, const std::string& field) {
  if (!n.is_string()) {
    throw ConfigError(field, "expected a string, got " + type_name(n) + " " + render(n));
  }
  auto v = *n.value<std::string>();
  if (v.empty()) throw ConfigError(field, "must not be empty");
  return v;
}

void parse_optimizer(const toml::table& t, OptimizerSpec& o) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string f = "optimizer." + k;
    if (k == "lr") {
      o.lr = get_double(node, f, 0.0, 10.0, true, false);
    } else if (k == "momentum") {
      o.momentum = get_double(node, f, 0.0, 1.0, false, true);
    } else if (k == "weight_decay") {
      o.weight_decay = get_double(node, f, 0.0, 1.0, false, true);
    } else if (k == "lr_schedule") {
      o.lr_schedule = get_choice(node, f, {"constant", "cosine", "step"});
    } else if (k == "warmup_epochs") {
      o.warmup_epochs = get_double(node, f, 0.0, 1000.0, false, false);
    } else {
      throw ConfigError(f, "unknown key (expected lr, momentum, weight_decay, lr_schedule, "
                           "warmup_epochs)");
    }
  }
}

}  // namespace

JobSpec parse_job_toml(const std::string& text, const std::string& base_dir, bool check_files) {
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "TOML syntax error at line " << e.source().begin.line << ", column "
       << e.source().begin.column << ": " << e.description();
    throw ConfigError("", os.str());
  }
  if (root.empty()) throw ConfigError("", "the job file is empty: it needs at least a model and its data");
  JobSpec s;
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "name") {
      s.name = get_string(node, k);
    } else if (k == "model") {
      s.model = get_choice(node, k, {"cnn", "mlp", "mlp-large"});
    } else if (k == "dataset") {
      s.dataset = get_choice(node, k, {"fashion-mnist", "mnist"});
    } else if (k == "data_dir") {
      s.data_dir = get_string(node, k);
    } else if (k == "epochs") {
      s.epochs = static_cast<int>(get_int(node, k, 1, 1000));
    } else if (k == "workers") {
      if (node.is_string() && *node.value<std::string>() == "auto") {
        s.workers_auto = true;
      } else {
        s.workers = static_cast<int>(get_int(node, k, 1, 1024));
      }
    } else if (k == "ps_shards") {
      s.ps_shards = static_cast<int>(get_int(node, k, 1, 256));
    } else if (k == "batch_size") {
      if (node.is_string() && *node.value<std::string>() == "auto") {
        s.batch_auto = true;
      } else {
        s.batch_size = static_cast<int>(get_int(node, k, 1, 65536));
      }
    } else if (k == "target_accuracy") {
      s.target_accuracy = get_double(node, k, 0.0, 1.0, true, false);
    } else if (k == "deadline") {
      if (!node.is_string()) {
        throw ConfigError(k, "expected a duration string such as \"30m\", got " + type_name(node) + " " + render(node));
      }
      s.deadline_seconds = parse_duration_seconds(*node.value<std::string>(), k);
      if (s.deadline_seconds <= 0) throw ConfigError(k, "must be positive");
    } else if (k == "planner") {
      if (!node.is_table()) throw ConfigError(k, "expected a table, got " + type_name(node));
      for (auto&& [pk, pn] : *node.as_table()) {
        const std::string f = "planner." + std::string(pk.str());
        if (pk.str() == "batch_sizes") {
          if (!pn.is_array() || pn.as_array()->empty()) throw ConfigError(f, "expected a non-empty array of integers");
          s.batch_sizes.clear();
          for (auto&& e : *pn.as_array()) s.batch_sizes.push_back(static_cast<int>(get_int(e, f, 1, 65536)));
        } else if (pk.str() == "max_workers") {
          s.max_workers = static_cast<int>(get_int(pn, f, 1, 1024));
        } else if (pk.str() == "price_per_task_hour") {
          s.price_per_task_hour = get_double(pn, f, 0.0, 1e9, true, false);
        } else {
          throw ConfigError(f, "unknown key (expected batch_sizes, max_workers, price_per_task_hour)");
        }
      }
    } else if (k == "threads_per_task") {
      s.threads_per_task = static_cast<int>(get_int(node, k, 1, 256));
    } else if (k == "sync") {
      s.sync = get_choice(node, k, {"async", "ssp", "sync"});
      if (s.sync != "async") {
        throw ConfigError(k, "\"" + s.sync + "\" is not implemented yet; use \"async\"");
      }
    } else if (k == "seed") {
      s.seed = get_int(node, k, 0, std::int64_t{1} << 62);
    } else if (k == "train_samples") {
      s.train_samples = get_int(node, k, 0, 100000000);
    } else if (k == "test_samples") {
      s.test_samples = get_int(node, k, 0, 100000000);
    } else if (k == "optimizer") {
      if (!node.is_table()) throw ConfigError(k, "expected a table, got " + type_name(node));
      parse_optimizer(*node.as_table(), s.optimizer);
    } else if (k == "compression") {
      if (!node.is_table()) throw ConfigError(k, "expected a table, got " + type_name(node));
      auto& c = s.compression;
      for (auto&& [ck, cn] : *node.as_table()) {
        const std::string f = "compression." + std::string(ck.str());
        const std::string name(ck.str());
        if (name == "method") {
          c.method = compress::parse_method(get_choice(cn, f, {"none", "topk", "dgc", "randomk", "fp16"}));
        } else if (name == "ratio") {
          c.ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else if (name == "downlink_ratio") {
          c.downlink_ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else if (name == "warmup_epochs") {
          c.warmup_epochs = get_double(cn, f, 0.0, 1000.0, false, false);
        } else if (name == "momentum") {
          c.momentum = get_double(cn, f, 0.0, 1.0, false, true);
        } else if (name == "clip_norm") {
          c.clip_norm = get_double(cn, f, 0.0, 1e9, false, false);
        } else if (name == "sample_ratio") {
          c.sample_ratio = get_double(cn, f, 0.0, 1.0, true, false);
        } else {
          throw ConfigError(f, "unknown key (expected method, ratio, downlink_ratio, warmup_epochs, momentum, "
                               "clip_norm, sample_ratio)");
        }
      }
    } else if (k == "ps") {
      if (!node.is_table()) throw ConfigError(k, "expected a table, got " + type_name(node));
      for (auto&& [pk, pn] : *node.as_table()) {
        const std::string f = "ps." + std::string(pk.str());
        if (pk.str() == "partition_size") {
          s.partition_size = get_int(pn, f, 1, std::int64_t{1} << 26);
        } else if (pk.str() == "timeout") {
          if (!pn.is_string()) {
            throw ConfigError(f, "expected a duration string such as \"60s\", got " + type_name(pn) + " " + render(pn));
          }
          s.ps_timeout_seconds = parse_duration_seconds(*pn.value<std::string>(), f);
          if (s.ps_timeout_seconds < 1 || s.ps_timeout_seconds > 86400) {
            throw ConfigError(f, "expected a duration in [1s, 24h], got \"" + *pn.value<std::string>() + "\"");
          }
        } else {
          throw ConfigError(f, "unknown key (expected partition_size, timeout)");
        }
      }
    } else {
      throw ConfigError(k, "unknown key (expected name, model, dataset, data_dir, epochs, "
                           "workers, ps_shards, batch_size, threads_per_task, sync, seed, "
                           "train_samples, test_samples, target_accuracy, deadline, [optimizer], [compression], [planner], "
                           "[ps])");
    }
  }
  if (s.optimizer.warmup_epochs >= s.epochs) {
    std::ostringstream os;
    os << "must be less than epochs (" << s.epochs << "), got " << s.optimizer.warmup_epochs;
    throw ConfigError("optimizer.warmup_epochs", os.str());
  }
  if (s.compression.warmup_epochs >= s.epochs) {
    std::ostringstream os;
    os << "must be less than epochs (" << s.epochs << "), got " << s.compression.warmup_epochs;
    throw ConfigError("compression.warmup_epochs", os.str());
  }
  namespace fs = std::filesystem;
  fs::path dir(s.data_dir);
  if (dir.is_relative()) dir = fs::path(base_dir) / dir;
  s.data_dir = dir.lexically_normal().string();
  if (check_files) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" does not exist on the leader" +
                                        (s.data_dir == "/usr/share/datasets/fashion-mnist"
                                             ? " (install it with: apt-get install dataset-fashion-mnist)"
                                             : ""));
    }
    for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      if (!fs::exists(dir / f, ec) && !fs::exists(dir / (std::string(f) + ".gz"), ec)) {
        throw ConfigError("data_dir", "directory \"" + s.data_dir + "\" has no " + f +
                                          "[.gz] file");
      }
    }
  }
  return s;
}

void to_json(nlohmann::json& j, const JobSpec& s) {
  j = nlohmann::json{{"name", s.name},
                     {"model", s.model},
                     {"dataset", s.dataset},
                     {"data_dir", s.data_dir},
                     {"epochs", s.epochs},
                     {"workers", s.workers},
                     {"ps_shards", s.ps_shards},
                     {"batch_size", s.batch_size},
                     {"threads_per_task", s.threads_per_task},
                     {"sync", s.sync},
                     {"seed", s.seed},
                     {"train_samples", s.train_samples},
                     {"test_samples", s.test_samples},
                     {"partition_size", s.partition_size},
                     {"ps_timeout_seconds", s.ps_timeout_seconds},
                     {"optimizer",
                      {{"lr", s.optimizer.lr},
                       {"momentum", s.optimizer.momentum},
                       {"weight_decay", s.optimizer.weight_decay},
                       {"lr_schedule", s.optimizer.lr_schedule},
                       {"warmup_epochs", s.optimizer.warmup_epochs}}},
                     {"compression",
                      {{"method", compress::to_string(s.compression.method)},
                       {"ratio", s.compression.ratio},
                       {"downlink_ratio", s.compression.downlink_ratio},
                       {"warmup_epochs", s.compression.warmup_epochs},
                       {"momentum", s.compression.momentum},
                       {"clip_norm", s.compression.clip_norm},
                       {"sample_ratio", s.compression.sample_ratio}}},
                     {"workers_auto", s.workers_auto},
                     {"batch_auto", s.batch_auto},
                     {"target_accuracy", s.target_accuracy},
                     {"deadline_seconds", s.deadline_seconds},
                     {"batch_sizes", s.batch_sizes},
                     {"max_workers", s.max_workers},
                     {"price_per_task_hour", s.price_per_task_hour},
                     {"max_steps", s.max_steps},
                     {"profile", s.profile}};
}

double ps_momentum(const JobSpec& spec) {
  return spec.compression.method == compress::Method::kDgc ? 0.0 : spec.optimizer.momentum;
}

JobSpec job_from_json(const nlohmann::json& j) {
  try {
    JobSpec s;
    s.name = j.at("name").get<std::string>();
    s.model = j.at("model").get<std::string>();
    s.dataset = j.at("dataset").get<std::string>();
    s.data_dir = j.at("data_dir").get<std::string>();
    s.epochs = j.at("epochs").get<int>();
    s.workers = j.at("workers").get<int>();
    s.ps_shards = j.at("ps_shards").get<int>();
    s.batch_size = j.at("batch_size").get<int>();
    s.threads_per_task = j.at("threads_per_task").get<int>();
    s.sync = j.at("sync").get<std::string>();
    s.seed = j.at("seed").get<std::int64_t>();
    s.train_samples = j.at("train_samples").get<std::int64_t>();
    s.test_samples = j.at("test_samples").get<std::int64_t>();
    s.partition_size = j.at("partition_size").get<std::int64_t>();
    s.ps_timeout_seconds = j.value("ps_timeout_seconds", 60.0);
    const auto& o = j.at("optimizer");
    s.optimizer.lr = o.at("lr").get<double>();
    s.optimizer.momentum = o.at("momentum").get<double>();
    s.optimizer.weight_decay = o.at("weight_decay").get<double>();
    s.optimizer.lr_schedule = o.at("lr_schedule").get<std::string>();
    s.optimizer.warmup_epochs = o.at("warmup_epochs").get<double>();
    if (j.contains("compression")) {
      const auto& c = j.at("compression");
      s.compression.method = compress::parse_method(c.at("method").get<std::string>());
      s.compression.ratio = c.at("ratio").get<double>();
      s.compression.downlink_ratio = c.at("downlink_ratio").get<double>();
      s.compression.warmup_epochs = c.at("warmup_epochs").get<double>();
      s.compression.momentum = c.at("momentum").get<double>();
      s.compression.clip_norm = c.at("clip_norm").get<double>();
      s.compression.sample_ratio = c.at("sample_ratio").get<double>();
    }
    s.workers_auto = j.value("workers_auto", false);
    s.batch_auto = j.value("batch_auto", false);
    s.target_accuracy = j.value("target_accuracy", 0.0);
    s.deadline_seconds = j.value("deadline_seconds", 0.0);
    if (j.contains("batch_sizes")) s.batch_sizes = j.at("batch_sizes").get<std::vector<int>>();
    s.max_workers = j.value("max_workers", 0);
    s.price_per_task_hour = j.value("price_per_task_hour", 0.0);
    s.max_steps = j.value("max_steps", std::int64_t{0});
    s.profile = j.value("profile", false);
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("job", std::string("malformed job JSON: ") + e.what());
  }
}

double parse_duration_seconds(const std::string& text, const std::string& field) {
  static const std::map<std::string, double> units{
      {"ms", 1e-3}, {"s", 1.0}, {"m", 60.0}, {"h", 3600.0}, {"d", 86400.0}};
  double total = 0;
  std::size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    std::size_t j = i;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
    std::size_t k = j;
    while (k < text.size() && std::isalpha(static_cast<unsigned char>(text[k]))) ++k;
    auto unit = units.find(text.substr(j, k - j));
    if (j == i || unit == units.end()) {
      throw ConfigError(field, "expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \"" +
                                   text + "\"");
    }
    total += std::stod(text.substr(i, j - i)) * unit->second;
    any = true;
    i = k;
  }
  if (!any) throw ConfigError(field, "expected a duration such as \"30m\", got an empty string");
  return total;
}

}  // namespace dltrain
