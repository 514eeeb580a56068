#include "agent/options.h"

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/secret.h"
#include "common/toml_fields.h"

namespace dltrain::agent {

using toml_fields::get_bool;
using toml_fields::get_double;
using toml_fields::get_int;
using toml_fields::get_string;

AgentOptions parse_agent_options(const std::string& text, const std::string& base_dir) {
  const toml::table root = toml_fields::parse(text);
  AgentOptions o;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  o.name = host;
  auto resolve = [&](const std::string& p) {
    std::filesystem::path path(p);
    return (path.is_relative() ? std::filesystem::path(base_dir) / path : path).string();
  };
  auto ms = [&](const toml::node& n, const std::string& k) {
    const double sec = toml_fields::get_duration(n, k, "1s");
    if (sec <= 0) throw ConfigError(k, "must be positive");
    return std::chrono::milliseconds(static_cast<std::int64_t>(sec * 1000));
  };
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "name") o.name = get_string(node, k, true);
    else if (k == "leader") o.leader = get_bool(node, k);
    else if (k == "leader_url") o.leader_url = get_string(node, k, true);
    else if (k == "listen_address") o.listen_address = get_string(node, k, true);
    else if (k == "listen_port") {
      o.listen_port = static_cast<std::uint16_t>(get_int(node, k, 0, 65535));
    } else if (k == "advertise_address") o.advertise_address = get_string(node, k, true);
    else if (k == "task_bind_address") o.task_bind_address = get_string(node, k, true);
    else if (k == "host_tasks") o.host_tasks = get_bool(node, k);
    else if (k == "cores") {
      o.cores = static_cast<int>(get_int(node, k, 0, 4096));
    } else if (k == "memory_mb") {
      o.memory_mb = get_int(node, k, 0, std::numeric_limits<std::int64_t>::max());
    } else if (k == "hardware_class") o.hardware_class = get_string(node, k, true);
    else if (k == "state_dir") o.state_dir = resolve(get_string(node, k, true));
    else if (k == "agent_token") o.agent_token = get_string(node, k, true);
    else if (k == "client_token") o.client_token = get_string(node, k, true);
    else if (k == "agent_token_file")
      o.agent_token = read_private_file(resolve(get_string(node, k, true)), k);
    else if (k == "client_token_file")
      o.client_token = read_private_file(resolve(get_string(node, k, true)), k);
    else if (k == "task_bin_dir") o.task_bin_dir = resolve(get_string(node, k, true));
    else if (k == "tls_cert_file") o.tls_cert_file = resolve(get_string(node, k, true));
    else if (k == "tls_key_file") o.tls_key_file = resolve(get_string(node, k, true));
    else if (k == "tls_ca_file") o.tls_ca_file = resolve(get_string(node, k, true));
    else if (k == "heartbeat_interval") o.heartbeat_interval = ms(node, k);
    else if (k == "heartbeat_timeout") o.heartbeat_timeout = ms(node, k);
    else if (k == "task_stop_grace") o.task_stop_grace = ms(node, k);
    else if (k == "reassign_timeout") o.reassign_timeout = ms(node, k);
    else if (k == "ps_checkpoint_interval") {
      o.ps_checkpoint_interval = ms(node, k);
      if (o.ps_checkpoint_interval < std::chrono::milliseconds(100)) {
        throw ConfigError(k, "expected at least 100ms, got " + std::to_string(o.ps_checkpoint_interval.count()) + "ms");
      }
    }
    else if (k == "queue_timeout") o.queue_timeout = ms(node, k);
    else if (k == "progress_interval") {
      o.progress_interval = ms(node, k);
      if (o.progress_interval < std::chrono::milliseconds(100)) {
        throw ConfigError(k, "expected at least 100ms, got " + std::to_string(o.progress_interval.count()) + "ms");
      }
    }
    else if (k == "log_level") o.log_level = get_string(node, k, true);
    else if (k == "prices") {
      o.prices.clear();
      for (auto&& [ck, cv] : toml_fields::get_table(node, k)) {
        const std::string f = "prices." + std::string(ck.str());
        o.prices[std::string(ck.str())] = get_double(cv, f, 0.0, std::numeric_limits<double>::max(), true, false);
      }
    } else if (k == "explore_steps") {
      o.explore_steps = static_cast<int>(get_int(node, k, 10, 100000));
    } else if (k == "task_max_restarts") {
      o.task_max_restarts = static_cast<int>(get_int(node, k, 0, 100));
    } else if (k == "margin_sigmas") {
      o.margin_sigmas = get_double(node, k, 0.0, 5.0, false, false);
    } else if (k == "switch_threshold") {
      o.switch_threshold = get_double(node, k, 0.0, 1.0, false, true);
    }
    else throw ConfigError(k, "unknown key");
  }
  if (o.agent_token.empty()) throw ConfigError("agent_token", "required (or agent_token_file)");
  if (o.leader && o.client_token.empty()) throw ConfigError("client_token", "required on the leader (or client_token_file)");
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    throw ConfigError(o.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "TLS needs both tls_cert_file and tls_key_file");
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
    throw ConfigError("", std::string(e.what()) + " (in " + path + ")");
  }
}

}  // namespace dltrain::agent
