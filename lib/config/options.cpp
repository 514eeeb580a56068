#include "config/options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "common/toml_fields.h"
#include "common/host_port.h"

namespace dltrain::config {

using toml_fields::get_bool;
using toml_fields::get_double;
using toml_fields::get_int;
using toml_fields::get_string;

namespace {

using Node = toml::node;
using Handler = std::function<void(AgentOptions&, const Node&, const std::string&)>;

// Longest duration accepted for a setting, in seconds (about 31 years): bounds the
// conversion to integer milliseconds.
constexpr double kMaxDurationSeconds = 1e9;

// `v` as milliseconds: a positive duration string, at least `min_ms`.
std::chrono::milliseconds duration_ms(const Node& n, const std::string& k, std::int64_t min_ms = 1) {
  const double sec = toml_fields::get_duration(n, k, "1s");
  if (sec <= 0) throw ConfigError(k, "must be positive");
  if (sec > kMaxDurationSeconds) {
    throw ConfigError(k, "expected at most " + std::to_string(static_cast<std::int64_t>(kMaxDurationSeconds)) +
                             "s, got \"" + *n.value<std::string>() + "\"");
  }
  const std::chrono::milliseconds v(static_cast<std::int64_t>(sec * 1000));
  if (v.count() < min_ms) {
    throw ConfigError(k, "expected at least " + std::to_string(min_ms) + "ms, got " + std::to_string(v.count()) + "ms");
  }
  return v;
}

// Every key of an agent configuration, with how it is read: the one list of its keys.
// `resolve` makes a path relative to the configuration's directory absolute.
std::map<std::string, Handler> key_handlers(const std::function<std::string(const std::string&)>& resolve) {
  auto str = [](std::string AgentOptions::*f) {
    return Handler([f](AgentOptions& o, const Node& n, const std::string& k) { o.*f = get_string(n, k, true); });
  };
  auto path = [resolve](std::string AgentOptions::*f) {
    return Handler(
        [f, resolve](AgentOptions& o, const Node& n, const std::string& k) { o.*f = resolve(get_string(n, k, true)); });
  };
  auto flag = [](bool AgentOptions::*f) {
    return Handler([f](AgentOptions& o, const Node& n, const std::string& k) { o.*f = get_bool(n, k); });
  };
  auto dur = [](std::chrono::milliseconds AgentOptions::*f, std::int64_t min_ms = 1) {
    return Handler([f, min_ms](AgentOptions& o, const Node& n, const std::string& k) { o.*f = duration_ms(n, k, min_ms); });
  };
  auto integer = [](int AgentOptions::*f, std::int64_t lo, std::int64_t hi) {
    return Handler(
        [f, lo, hi](AgentOptions& o, const Node& n, const std::string& k) { o.*f = static_cast<int>(get_int(n, k, lo, hi)); });
  };
  auto token_file = [resolve](std::string AgentOptions::*f) {
    return Handler([f, resolve](AgentOptions& o, const Node& n, const std::string& k) {
      o.*f = read_private_file(resolve(get_string(n, k, true)), k);
    });
  };
  return {
      // An agent without a name cannot register (nor name its log): refused here.
      {"name", [](AgentOptions& o, const Node& n, const std::string& k) { o.name = get_string(n, k); }},
      {"leader", flag(&AgentOptions::leader)},
      {"leader_url",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         // One URL, or the HA candidates' URLs: the agent follows whichever serves.
         o.leader_urls.clear();
         if (const auto* arr = n.as_array()) {
           if (arr->empty()) throw ConfigError(k, "expected at least one URL");
           for (std::size_t i = 0; i < arr->size(); ++i) {
             o.leader_urls.push_back(get_string((*arr)[i], k + "[" + std::to_string(i) + "]"));
           }
         } else if (n.is_string()) {
           o.leader_urls.push_back(get_string(n, k));
         } else {
           throw ConfigError(k, "expected a URL such as \"ws://HOST:7070\" or a list of them, got " +
                                    toml_fields::type_name(n));
         }
         o.leader_url = o.leader_urls.front();
       }},
      {"listen_address", str(&AgentOptions::listen_address)},
      {"listen_port",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.listen_port = static_cast<std::uint16_t>(get_int(n, k, 0, 65535));
       }},
      {"advertise_address", str(&AgentOptions::advertise_address)},
      {"metrics_address", str(&AgentOptions::metrics_address)},
      {"metrics_port",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.metrics_port = static_cast<std::uint16_t>(get_int(n, k, 0, 65535));
       }},
      {"metrics_token", str(&AgentOptions::metrics_token)},
      {"metrics_token_file", token_file(&AgentOptions::metrics_token)},
      {"task_bind_address", str(&AgentOptions::task_bind_address)},
      {"host_tasks", flag(&AgentOptions::host_tasks)},
      {"shared_plan", flag(&AgentOptions::shared_plan)},
      {"cores", integer(&AgentOptions::cores, 0, 4096)},
      {"memory_mb",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.memory_mb = get_int(n, k, 0, std::numeric_limits<std::int64_t>::max());
       }},
      {"hardware_class", str(&AgentOptions::hardware_class)},
      {"gpus",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         if (n.is_string()) {
           const std::string v = toml_fields::get_choice(n, k, {"auto", "none"});
           o.gpus = v == "auto" ? std::nullopt : std::optional<std::vector<int>>(std::vector<int>{});
           return;
         }
         const auto* arr = n.as_array();
         if (!arr) {
           throw ConfigError(k, "expected \"auto\", \"none\" or a list of GPU indices such as [0, 2], got " +
                                    toml_fields::type_name(n));
         }
         if (arr->size() > wire::kMaxGpus) {
           throw ConfigError(k, "at most " + std::to_string(wire::kMaxGpus) + " GPUs, got " + std::to_string(arr->size()));
         }
         std::vector<int> v;
         for (std::size_t i = 0; i < arr->size(); ++i) {
           v.push_back(static_cast<int>(get_int((*arr)[i], k + "[" + std::to_string(i) + "]", 0,
                                                static_cast<std::int64_t>(wire::kMaxGpus) - 1)));
         }
         o.gpus = std::move(v);
       }},
      {"nvml_library",
       [resolve](AgentOptions& o, const Node& n, const std::string& k) {
         // A bare file name is for the loader's search path; a path is the configuration's.
         const std::string v = get_string(n, k);
         o.nvml_library = v.find('/') == std::string::npos ? v : resolve(v);
       }},
      {"state_dir", path(&AgentOptions::state_dir)},
      {"agent_token", str(&AgentOptions::agent_token)},
      {"client_token", str(&AgentOptions::client_token)},
      {"agent_token_file", token_file(&AgentOptions::agent_token)},
      {"client_token_file", token_file(&AgentOptions::client_token)},
      {"task_bin_dir", path(&AgentOptions::task_bin_dir)},
      {"task_log_max_bytes",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.task_log_max_bytes = static_cast<std::uintmax_t>(get_int(n, k, 4096, std::int64_t{1} << 40));
       }},
      {"tls_cert_file", path(&AgentOptions::tls_cert_file)},
      {"tls_key_file", path(&AgentOptions::tls_key_file)},
      {"tls_ca_file", path(&AgentOptions::tls_ca_file)},
      {"heartbeat_interval", dur(&AgentOptions::heartbeat_interval)},
      {"heartbeat_timeout", dur(&AgentOptions::heartbeat_timeout)},
      {"task_stop_grace", dur(&AgentOptions::task_stop_grace)},
      {"reassign_timeout", dur(&AgentOptions::reassign_timeout)},
      {"ps_checkpoint_interval", dur(&AgentOptions::ps_checkpoint_interval, 100)},
      {"queue_timeout", dur(&AgentOptions::queue_timeout)},
      {"progress_interval", dur(&AgentOptions::progress_interval, 100)},
      {"log_level", str(&AgentOptions::log_level)},
      {"explore_steps", integer(&AgentOptions::explore_steps, 10, 100000)},
      {"link_probe_bytes",
       [](AgentOptions& o, const Node& n, const std::string& k) { o.link_probe_bytes = get_int(n, k, 0, std::int64_t{3} << 20); }},
      {"cache_bytes",
       [](AgentOptions& o, const Node& n, const std::string& k) { o.cache_bytes = get_int(n, k, 0, std::int64_t{1} << 50); }},
      {"cache_dir", path(&AgentOptions::cache_dir)},
      {"s3_endpoint", str(&AgentOptions::s3_endpoint)},
      {"s3_region", str(&AgentOptions::s3_region)},
      {"s3_credentials_file", path(&AgentOptions::s3_credentials_file)},
      {"method_tie",
       [](AgentOptions& o, const Node& n, const std::string& k) { o.method_tie = get_double(n, k, 0.0, 1.0, false, false); }},
      {"task_max_restarts", integer(&AgentOptions::task_max_restarts, 0, 100)},
      {"job_retention", integer(&AgentOptions::job_retention, 1, 10000)},
      {"model_retention", integer(&AgentOptions::model_retention, 1, 10000)},
      {"margin_sigmas",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.margin_sigmas = get_double(n, k, 0.0, 5.0, false, false);
       }},
      {"straggler_factor",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.straggler_factor = get_double(n, k, 0.0, 1000.0, false, false);
         if (o.straggler_factor != 0 && o.straggler_factor <= 1) {
           throw ConfigError(k, "expected 0 (off) or a factor > 1, got " + std::to_string(o.straggler_factor));
         }
       }},
      {"switch_threshold",
       [](AgentOptions& o, const Node& n, const std::string& k) {
         o.switch_threshold = get_double(n, k, 0.0, 1.0, false, true);
       }},
  };
}

// Makes a path relative to `base_dir` (the configuration's directory) absolute.
std::function<std::string(const std::string&)> resolve_in(const std::string& base_dir) {
  return [base_dir](const std::string& p) {
    std::filesystem::path path(p);
    return (path.is_relative() ? std::filesystem::path(base_dir) / path : path).string();
  };
}

// The [ha] table (HaOptions): every key, each checked as it is read.
// The [users] table: one [users.NAME] table per user (UserOptions).
std::vector<UserOptions> read_users(const toml::table& t, const std::function<std::string(const std::string&)>& resolve) {
  using toml_fields::int_key;
  const toml_fields::KeyTable<UserOptions> keys{
      {"token",
       [](UserOptions& u, const Node& n, const std::string& k) {
         u.token = get_string(n, k);
         u.token_key = "token";
       }},
      {"token_file",
       [resolve](UserOptions& u, const Node& n, const std::string& k) {
         u.token = read_private_file(resolve(get_string(n, k)), k);
         u.token_key = "token_file";
       }},
      {"role",
       [](UserOptions& u, const Node& n, const std::string& k) {
         u.admin = toml_fields::get_choice(n, k, {"user", "admin"}) == "admin";
       }},
      {"max_cores", int_key(&UserOptions::max_cores, 0, 1 << 20)},
      {"max_gpus", int_key(&UserOptions::max_gpus, 0, 1 << 20)},
      {"max_running_jobs", int_key(&UserOptions::max_running_jobs, 0, 1 << 20)},
      {"priority", int_key(&UserOptions::priority, -1000, 1000)},
  };
  std::vector<UserOptions> users;
  for (auto&& [key, node] : t) {
    UserOptions u;
    u.name = std::string(key.str());
    const std::string f = "users." + u.name;
    const bool name_ok = !u.name.empty() && u.name.size() <= 64 &&
                         std::all_of(u.name.begin(), u.name.end(), [](unsigned char c) {
                           return std::isalnum(c) || c == '_' || c == '.' || c == '-';
                         });
    if (!name_ok) throw ConfigError(f, "a user name is 1 to 64 letters, digits, '_', '.' or '-'");
    if (u.name == "admin") {
      throw ConfigError(f, "\"admin\" is the user of the client token (client_token); name this user otherwise");
    }
    if (!node.is_table()) {
      throw ConfigError(f, "expected a table such as [users." + u.name + "] with token_file and role, got " +
                               toml_fields::type_name(node));
    }
    if (node.as_table()->contains("token") && node.as_table()->contains("token_file")) {
      throw ConfigError(f + ".token", "give token or token_file, not both");
    }
    toml_fields::read_keys(*node.as_table(), f + ".", keys, u);
    if (u.token.empty()) {
      throw ConfigError(f + ".token_file", "required (or token): the token this user's clients present");
    }
    users.push_back(std::move(u));
  }
  return users;
}

void read_ha(const toml::table& t, const std::function<std::string(const std::string&)>& resolve, HaOptions& ha) {
  using toml_fields::Key;
  const auto file = [resolve](std::string HaOptions::*f) {
    return [f, resolve](HaOptions& o, const Node& n, const std::string& k) { o.*f = resolve(get_string(n, k)); };
  };
  const toml_fields::KeyTable<HaOptions> keys{
      {"etcd",
       [](HaOptions& o, const Node& n, const std::string& k) {
         const auto* arr = n.as_array();
         if (!arr || arr->empty()) {
           throw ConfigError(k, "expected a list of etcd client URLs such as [\"http://10.0.0.1:2379\"], got " +
                                    (arr ? std::string("an empty list") : toml_fields::type_name(n)));
         }
         o.etcd.clear();
         for (std::size_t i = 0; i < arr->size(); ++i) {
           const std::string f = k + "[" + std::to_string(i) + "]";
           const std::string url = get_string((*arr)[i], f);
           if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) {
             throw ConfigError(f, "expected http://HOST:PORT or https://HOST:PORT, got \"" + url + "\"");
           }
           o.etcd.push_back(url);
         }
       }},
      {"user", [](HaOptions& o, const Node& n, const std::string& k) { o.user = get_string(n, k); }},
      {"password", [](HaOptions& o, const Node& n, const std::string& k) { o.password = get_string(n, k); }},
      {"password_file",
       [resolve](HaOptions& o, const Node& n, const std::string& k) {
         o.password = read_private_file(resolve(get_string(n, k)), k);
       }},
      {"ca_file", file(&HaOptions::ca_file)},
      {"cert_file", file(&HaOptions::cert_file)},
      {"key_file", file(&HaOptions::key_file)},
      {"lease_ttl",
       [](HaOptions& o, const Node& n, const std::string& k) {
         const double sec = toml_fields::get_duration(n, k, "10s");
         if (sec < 2 || sec > 300 || sec != static_cast<double>(static_cast<int>(sec))) {
           throw ConfigError(k, "expected whole seconds from 2s to 300s, got " + toml_fields::render(n));
         }
         o.lease_ttl_seconds = static_cast<int>(sec);
       }},
      {"prefix",
       [](HaOptions& o, const Node& n, const std::string& k) {
         const std::string v = get_string(n, k);
         if (v.front() != '/' || v.back() == '/') {
           throw ConfigError(k, "expected a key prefix such as \"/dltrain\" (starting with /, not ending with /), got \"" +
                                    v + "\"");
         }
         o.prefix = v;
       }},
      {"request_timeout",
       [](HaOptions& o, const Node& n, const std::string& k) { o.request_timeout = duration_ms(n, k, 100); }},
      {"replication_timeout",
       [](HaOptions& o, const Node& n, const std::string& k) {
         const double sec = toml_fields::get_duration(n, k, "60s");
         if (sec < 0 || sec > 3600) throw ConfigError(k, "expected 0s to 1h, got " + toml_fields::render(n));
         o.replication_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(sec * 1000));
       }},
  };
  HaOptions out;
  toml_fields::read_keys(t, "ha.", keys, out);
  if (out.etcd.empty()) throw ConfigError("ha.etcd", "required in [ha]: the etcd members' client URLs");
  if (out.user.empty() != out.password.empty()) {
    throw ConfigError(out.user.empty() ? "ha.user" : "ha.password", "etcd credentials need both user and password "
                                                                    "(or password_file)");
  }
  if (out.cert_file.empty() != out.key_file.empty()) {
    throw ConfigError(out.cert_file.empty() ? "ha.cert_file" : "ha.key_file", "a client certificate needs both "
                                                                              "cert_file and key_file");
  }
  ha = std::move(out);
}

}  // namespace

AgentOptions parse_agent_options(const std::string& text, const std::string& base_dir) {
  const toml::table root = toml_fields::parse(text);
  AgentOptions o;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  o.name = host;
  const auto handlers = key_handlers(resolve_in(base_dir));
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "ha") {
      read_ha(toml_fields::get_table(node, k), resolve_in(base_dir), o.ha);
      continue;
    }
    if (k == "users") {
      o.users = read_users(toml_fields::get_table(node, k), resolve_in(base_dir));
      continue;
    }
    if (k == "prices") {
      o.prices.clear();
      for (auto&& [ck, cv] : toml_fields::get_table(node, k)) {
        const std::string c(ck.str());
        const std::string f = "prices." + c;
        if (handlers.count(c)) {
          // TOML puts every key written after a [table] header into that table.
          throw ConfigError(f, "\"" + c + "\" is a top-level key written below the [prices] table, so TOML reads "
                               "it as a price; move it above [prices]");
        }
        o.prices[c] = get_double(cv, f, 0.0, std::numeric_limits<double>::max(), true, false);
      }
      continue;
    }
    const auto h = handlers.find(k);
    if (h == handlers.end()) throw ConfigError(k, "unknown key");
    h->second(o, node, k);
  }
  if (o.agent_token.empty()) throw ConfigError("agent_token", "required (or agent_token_file)");
  if (o.leader && o.client_token.empty()) throw ConfigError("client_token", "required on the leader (or client_token_file)");
  if (!o.users.empty() && !o.leader) throw ConfigError("users", "only the leader (leader = true) has users");
  for (std::size_t i = 0; i < o.users.size(); ++i) {
    const auto& u = o.users[i];
    const std::string f = "users." + u.name + "." + u.token_key;
    if (u.token == o.client_token) throw ConfigError(f, "the same token as client_token (the admin's): give each user its own");
    if (u.token == o.agent_token) throw ConfigError(f, "the same token as agent_token: a user's token must not let it join as an agent");
    for (std::size_t j = 0; j < i; ++j) {
      if (o.users[j].token == u.token) {
        throw ConfigError(f, "the same token as user \"" + o.users[j].name + "\": each user needs its own");
      }
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    throw ConfigError(o.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "TLS needs both tls_cert_file and tls_key_file");
  }
  if (!o.metrics_address.empty() && !is_loopback_address(o.metrics_address) && o.metrics_token.empty()) {
    throw ConfigError("metrics_token", "required when metrics_address (\"" + o.metrics_address +
                                           "\") is not a loopback address (or metrics_token_file): anyone who "
                                           "reaches it could read the metrics");
  }
  if (o.ha.enabled() && !o.leader) {
    throw ConfigError("ha", "only a leader candidate (leader = true) takes part in the election; an agent lists the "
                            "candidates' URLs in leader_url");
  }
  if (o.ha.enabled() && o.host_tasks && !root.contains("leader_url")) {
    throw ConfigError("leader_url", "a leader candidate that hosts tasks (host_tasks = true) lists every candidate's "
                                    "URL here, so that its agent follows whichever serves (or host_tasks = false)");
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    throw ConfigError("heartbeat_timeout", "must be longer than heartbeat_interval");
  }
  return o;
}

AgentOptions load_agent_options(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("", "cannot read agent configuration \"" + path + "\"");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_agent_options(ss.str(), std::filesystem::path(path).parent_path().string());
  } catch (const ConfigError& e) {
    // The same message with the file named, and the key kept for callers that ask.
    std::string msg = e.what();
    const std::string prefix = e.field() + ": ";
    if (!e.field().empty() && msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
    throw ConfigError(e.field(), msg + " (in " + path + ")");
  }
}

}  // namespace dltrain::config
