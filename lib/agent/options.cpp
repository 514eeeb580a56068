#include "agent/options.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/secret.h"

namespace dltrain::agent {
namespace {

template <typename T>
T need(const toml::node& n, const std::string& key, const char* what) {
  auto v = n.value<T>();
  if (!v || (std::is_same_v<T, std::int64_t> && !n.is_integer()) || (std::is_same_v<T, bool> && !n.is_boolean()) ||
      (std::is_same_v<T, std::string> && !n.is_string())) {
    throw ConfigError(key, std::string("expected ") + what);
  }
  return *v;
}

}  // namespace

AgentOptions parse_agent_options(const std::string& text, const std::string& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "TOML syntax error at line " << e.source().begin.line << ": " << e.description();
    throw ConfigError("", os.str());
  }
  AgentOptions o;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  o.name = host;
  auto resolve = [&](const std::string& p) {
    std::filesystem::path path(p);
    return (path.is_relative() ? std::filesystem::path(base_dir) / path : path).string();
  };
  auto ms = [&](const toml::node& n, const std::string& k) {
    const auto s = need<std::string>(n, k, "a duration string such as \"1s\"");
    const double sec = parse_duration_seconds(s, k);
    if (sec <= 0) throw ConfigError(k, "must be positive");
    return std::chrono::milliseconds(static_cast<std::int64_t>(sec * 1000));
  };
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "name") o.name = need<std::string>(node, k, "a string");
    else if (k == "leader") o.leader = need<bool>(node, k, "true or false");
    else if (k == "leader_url") o.leader_url = need<std::string>(node, k, "a string ws://HOST:PORT");
    else if (k == "listen_address") o.listen_address = need<std::string>(node, k, "an IP address string");
    else if (k == "listen_port") {
      const auto p = need<std::int64_t>(node, k, "an integer port");
      if (p < 0 || p > 65535) throw ConfigError(k, "expected 0..65535, got " + std::to_string(p));
      o.listen_port = static_cast<std::uint16_t>(p);
    } else if (k == "advertise_address") o.advertise_address = need<std::string>(node, k, "a string");
    else if (k == "task_bind_address") o.task_bind_address = need<std::string>(node, k, "an IP address string");
    else if (k == "host_tasks") o.host_tasks = need<bool>(node, k, "true or false");
    else if (k == "cores") {
      const auto c = need<std::int64_t>(node, k, "an integer");
      if (c < 0 || c > 4096) throw ConfigError(k, "expected 0..4096, got " + std::to_string(c));
      o.cores = static_cast<int>(c);
    } else if (k == "memory_mb") {
      o.memory_mb = need<std::int64_t>(node, k, "an integer");
      if (o.memory_mb < 0) throw ConfigError(k, "must be >= 0");
    } else if (k == "hardware_class") o.hardware_class = need<std::string>(node, k, "a string");
    else if (k == "state_dir") o.state_dir = resolve(need<std::string>(node, k, "a path string"));
    else if (k == "agent_token") o.agent_token = need<std::string>(node, k, "a string");
    else if (k == "client_token") o.client_token = need<std::string>(node, k, "a string");
    else if (k == "agent_token_file")
      o.agent_token = read_private_file(resolve(need<std::string>(node, k, "a path")), k);
    else if (k == "client_token_file")
      o.client_token = read_private_file(resolve(need<std::string>(node, k, "a path")), k);
    else if (k == "task_bin_dir") o.task_bin_dir = resolve(need<std::string>(node, k, "a path string"));
    else if (k == "tls_cert_file") o.tls_cert_file = resolve(need<std::string>(node, k, "a path string"));
    else if (k == "tls_key_file") o.tls_key_file = resolve(need<std::string>(node, k, "a path string"));
    else if (k == "tls_ca_file") o.tls_ca_file = resolve(need<std::string>(node, k, "a path string"));
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
    else if (k == "log_level") o.log_level = need<std::string>(node, k, "a string");
    else if (k == "prices") {
      if (!node.is_table()) throw ConfigError(k, "expected a table of class = price per task-hour");
      o.prices.clear();
      for (auto&& [ck, cv] : *node.as_table()) {
        if (!cv.is_number() || *cv.value<double>() <= 0) {
          throw ConfigError("prices." + std::string(ck.str()), "expected a positive number");
        }
        o.prices[std::string(ck.str())] = *cv.value<double>();
      }
    } else if (k == "explore_steps") {
      const auto v = need<std::int64_t>(node, k, "an integer");
      if (v < 10 || v > 100000) throw ConfigError(k, "expected 10..100000, got " + std::to_string(v));
      o.explore_steps = static_cast<int>(v);
    } else if (k == "task_max_restarts") {
      const auto v = need<std::int64_t>(node, k, "an integer");
      if (v < 0 || v > 100) throw ConfigError(k, "expected 0..100, got " + std::to_string(v));
      o.task_max_restarts = static_cast<int>(v);
    } else if (k == "margin_sigmas") {
      if (!node.is_number() || *node.value<double>() < 0 || *node.value<double>() > 5) {
        throw ConfigError(k, "expected a number in [0, 5]");
      }
      o.margin_sigmas = *node.value<double>();
    } else if (k == "switch_threshold") {
      if (!node.is_number() || *node.value<double>() < 0 || *node.value<double>() >= 1) {
        throw ConfigError(k, "expected a number in [0, 1)");
      }
      o.switch_threshold = *node.value<double>();
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

std::string random_token() { return to_hex(random_bytes(32)); }

}  // namespace dltrain::agent
