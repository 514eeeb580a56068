#include "leader_target.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "common/errors.h"
#include "common/secret.h"
#include "common/toml_fields.h"
#include "control/client.h"

namespace dltrain::client {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The token in a client configuration's `token_file`: its first line. A file that
// cannot be read is an error here, where its name is known, rather than a "no client
// token" later that says nothing about why.
std::string read_token_file(const fs::path& config, const std::string& token_file) {
  try {
    const std::string text = read_file_text(token_file, "", "token file");
    std::string token = text.substr(0, text.find('\n'));
    if (token.empty()) throw ConfigError("", "token file \"" + token_file + "\" has an empty first line");
    return token;
  } catch (const ConfigError& e) {
    throw ConfigError("token_file", "client config " + config.string() + ": " + e.what());
  }
}

// The client configurations, most specific first.
std::vector<fs::path> client_configs() {
  std::vector<fs::path> configs;
  if (!env("DLTRAIN_CLIENT_CONFIG").empty()) configs.emplace_back(env("DLTRAIN_CLIENT_CONFIG"));
  const std::string xdg = env("XDG_CONFIG_HOME");
  const std::string home = env("HOME").empty() ? "/root" : env("HOME");
  configs.push_back(fs::path(xdg.empty() ? home + "/.config" : xdg) / "dltrain/client.toml");
  configs.emplace_back("/etc/dltrain/client.toml");
  return configs;
}

}  // namespace

Target find_leader(const std::string& flag_leader, const std::string& flag_token, const std::string& flag_ca) {
  Target t{flag_leader, flag_token, "flags", flag_ca};
  if (t.ca_file.empty() && !env("DLTRAIN_CA_FILE").empty()) {
    t.ca_file = env("DLTRAIN_CA_FILE");
    t.ca_source = "DLTRAIN_CA_FILE";
  }
  auto fill = [&](const std::string& leader, const std::string& token, const std::string& source) {
    if (t.leader.empty() && !leader.empty()) {
      t.leader = leader;
      t.source = source;
    }
    if (t.token.empty() && !token.empty()) t.token = token;
  };
  fill(env("DLTRAIN_LEADER"), env("DLTRAIN_TOKEN"), "environment");
  for (const auto& p : client_configs()) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    toml::table tbl;
    try {
      tbl = toml_fields::parse_file(p.string());
    } catch (const ConfigError& e) {
      throw ConfigError("", "client config " + std::string(e.what()));
    }
    // One string key of the configuration ("" when absent); a value of another type is
    // refused, naming the key and the file.
    auto key = [&](const char* k) {
      const auto* n = tbl.get(k);
      if (n == nullptr) return std::string();
      try {
        return toml_fields::get_string(*n, k, true);
      } catch (const ConfigError& e) {
        throw ConfigError(k, "client config " + p.string() + ": " + e.what());
      }
    };
    std::string token = key("token");
    if (token.empty() && t.token.empty()) {
      if (const auto tf = key("token_file"); !tf.empty()) token = read_token_file(p, tf);
    }
    fill(key("leader"), token, p.string());
    if (t.ca_file.empty()) {
      if (const auto ca = key("ca_file"); !ca.empty()) {
        // Relative to the configuration file, as the agent's paths are.
        const fs::path cp(ca);
        t.ca_file = (cp.is_relative() ? p.parent_path() / cp : cp).string();
        t.ca_source = "ca_file in " + p.string();
      }
    }
  }
  const std::string sa = control::default_standalone_client_file();
  std::error_code ec;
  if (fs::exists(sa, ec)) {
    std::ifstream in(sa);
    try {
      auto j = json::parse(in);
      fill(j.value("leader", ""), j.value("client_token", ""), sa);
    } catch (const json::exception&) {
      throw ConfigError("", "standalone client file " + sa + " is not valid JSON");
    }
  }
  if (t.leader.empty()) {
    throw ConfigError("leader",
                      "no leader configured: pass --leader ws://HOST:PORT, set DLTRAIN_LEADER, write "
                      "~/.config/dltrain/client.toml, or start a local cluster with "
                      "`dltrain-agent --standalone`");
  }
  if (t.token.empty()) {
    throw ConfigError("token", "no client token for " + t.leader +
                                   ": pass --token, set DLTRAIN_TOKEN or put token in the client config");
  }
  return t;
}

}  // namespace dltrain::client
