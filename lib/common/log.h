// Logging set-up shared by every dltrain executable (spdlog).
#pragma once

#include <string>

namespace dltrain {

/// Configures the default spdlog logger: messages go to stderr with a timestamp and
/// `name` as the logger name. `level` is one of trace, debug, info, warn, error, off.
/// Throws ConfigError("log_level", ...) for an unknown level. Not thread-safe: call once
/// at start-up before other threads log.
void init_logging(const std::string& name, const std::string& level = "info");

}  // namespace dltrain
