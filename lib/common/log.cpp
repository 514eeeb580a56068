#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/errors.h"

namespace dltrain {

void init_logging(const std::string& name, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    throw ConfigError("log_level", "expected one of trace, debug, info, warn, error, off; got \"" +
                                       level + "\"");
  }
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace dltrain
