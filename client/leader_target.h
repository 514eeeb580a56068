// Finding the leader the client talks to, and its token: from the flags, then the
// environment, then a client configuration file, then a local standalone cluster's file.
#pragma once

#include <string>

namespace dltrain::client {

/// The leader to send requests to, with where each setting came from (for messages).
struct Target {
  std::string leader;  ///< ws://HOST:PORT or wss://HOST:PORT (not checked here)
  std::string token;   ///< the client bearer token
  std::string source;  ///< where `leader` came from: "flags", "environment" or a file's path
  std::string ca_file;  ///< wss:// leaders: CA certificates to verify it with ("" = the system's)
  std::string ca_source = "--ca-file";  ///< where ca_file came from, for messages
};

/// Fills each of leader, token and CA file from the first place that sets it:
/// 1. the flags (`flag_leader`, `flag_token`, `flag_ca`; "" = not given);
/// 2. DLTRAIN_LEADER, DLTRAIN_TOKEN, DLTRAIN_CA_FILE;
/// 3. the client configurations, in order $DLTRAIN_CLIENT_CONFIG,
///    $XDG_CONFIG_HOME/dltrain/client.toml (XDG_CONFIG_HOME defaults to $HOME/.config,
///    HOME to /root), /etc/dltrain/client.toml: keys `leader`, `token` or `token_file`
///    (a file whose first line is the token, read only when no earlier place set the
///    token), and `ca_file` (relative to the configuration file);
/// 4. the standalone cluster's file (control::default_standalone_client_file()).
/// Throws ConfigError naming the file: for a client configuration that is not valid
/// TOML; for a `token_file` that cannot be read, is not a regular file or is empty
/// (field "token_file"; the message names the configuration, the path and the reason,
/// e.g. "No such file or directory"); for a standalone file that is not valid JSON; and
/// when no place sets the leader (field "leader") or the token (field "token").
Target find_leader(const std::string& flag_leader, const std::string& flag_token, const std::string& flag_ca);

}  // namespace dltrain::client
