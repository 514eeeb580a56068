// Fuzzes the agent configuration (config/options.h): parse_agent_options, what every
// dltrain-agent runs on its TOML file at start and on SIGHUP.
//
// Input: the file's text; relative token files resolve against an empty directory.
// Checks, beyond "no crash" and "only ConfigError escapes": a configuration that parses
// has every setting inside its documented range and its cross-checks hold (a token,
// TLS files in pairs, a heartbeat timeout above the interval), and parsing the same text
// twice gives the same options.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "config/options.h"
#include "common/errors.h"
#include "fuzz_check.h"

using namespace dltrain;

namespace {

// An empty directory of this process for relative paths (token files).
const std::string& base_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/dltrain-fuzz-agent-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    return std::string(d != nullptr ? d : "/nonexistent");
  }();
  return dir;
}

bool same(const config::AgentOptions& a, const config::AgentOptions& b) {
  return a.name == b.name && a.leader == b.leader && a.leader_url == b.leader_url && a.listen_port == b.listen_port &&
         a.cores == b.cores && a.memory_mb == b.memory_mb && a.state_dir == b.state_dir &&
         a.agent_token == b.agent_token && a.client_token == b.client_token &&
         a.heartbeat_interval == b.heartbeat_interval && a.heartbeat_timeout == b.heartbeat_timeout &&
         a.queue_timeout == b.queue_timeout && a.prices == b.prices && a.margin_sigmas == b.margin_sigmas;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  config::AgentOptions o;
  try {
    o = config::parse_agent_options(text, base_dir());
  } catch (const ConfigError&) {
    return 0;
  }
  FUZZ_CHECK(!o.name.empty() && !o.agent_token.empty(), "no name or no agent token");
  FUZZ_CHECK(!o.leader || !o.client_token.empty(), "a leader without a client token");
  FUZZ_CHECK(o.tls_cert_file.empty() == o.tls_key_file.empty(), "a TLS certificate without its key, or the reverse");
  FUZZ_CHECK(o.heartbeat_interval.count() >= 1 && o.heartbeat_timeout > o.heartbeat_interval,
             "heartbeat timeout not above the interval");
  for (auto d : {o.task_stop_grace, o.reassign_timeout, o.ps_checkpoint_interval, o.progress_interval}) {
    FUZZ_CHECK(d.count() >= 1, "a duration that is not positive");
  }
  FUZZ_CHECK(o.ps_checkpoint_interval.count() >= 100 && o.progress_interval.count() >= 100, "an interval below 100 ms");
  FUZZ_CHECK(o.queue_timeout.count() >= 0, "a negative queue timeout");
  FUZZ_CHECK(o.cores >= 0 && o.cores <= 4096 && o.memory_mb >= 0, "cores or memory out of range");
  FUZZ_CHECK(o.explore_steps >= 10 && o.explore_steps <= 100000 && o.task_max_restarts >= 0 &&
                 o.task_max_restarts <= 100,
             "explore_steps or task_max_restarts out of range");
  FUZZ_CHECK(o.margin_sigmas >= 0 && o.margin_sigmas <= 5 && o.switch_threshold >= 0 && o.switch_threshold < 1,
             "planner settings out of range");
  for (const auto& [cls, price] : o.prices) FUZZ_CHECK(std::isfinite(price) && price > 0, "a price that is not positive");
  FUZZ_CHECK(same(o, config::parse_agent_options(text, base_dir())), "the same text parsed twice differs");
  return 0;
}
