#include "standalone.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader.h"
#include "config/options.h"
#include "agent/supervisor.h"
#include "common/errors.h"
#include "common/secret.h"
#include "control/client.h"
#include "control/metrics_server.h"

namespace dltrain::daemon {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

void write_private(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  write_private_file(path.string(), text);
}

std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string standalone_gpus_value(const std::string& gpus) {
  if (gpus == "none" || gpus == "auto") return "\"" + gpus + "\"";
  // A comma-separated list of indices: the TOML array the agent's gpus key takes.
  std::string out = "[";
  std::string item;
  std::stringstream in(gpus);
  int count = 0;
  while (std::getline(in, item, ',')) {
    const bool digits = !item.empty() && item.size() <= 2 &&
                        std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoi(item) > 63) {
      throw ConfigError("--gpus", "expected none, auto or GPU indices 0-63 separated by commas (0,1), got \"" + gpus +
                                      "\"");
    }
    out += (count++ ? ", " : "") + item;
  }
  if (count == 0) throw ConfigError("--gpus", "expected none, auto or GPU indices such as 0,1, got \"\"");
  return out + "]";
}

int run_standalone(const StandaloneOptions& so, const std::string& agent_exe) {
  if (so.agents < 1 || so.agents > 64) throw ConfigError("--agents", "expected 1..64, got " + std::to_string(so.agents));
  if (so.cores_per_agent < 1) throw ConfigError("--cores-per-agent", "expected >= 1");
  (void)standalone_gpus_value(so.gpus);  // a bad --gpus stops it before anything starts
  if (so.progress_interval_s != 0 && (so.progress_interval_s < 0.1 || so.progress_interval_s > 86400)) {
    throw ConfigError("--progress-interval", "expected seconds in [0.1, 86400], got " +
                                                 std::to_string(so.progress_interval_s));
  }
  if (so.ps_checkpoint_interval_s != 0 && (so.ps_checkpoint_interval_s < 0.1 || so.ps_checkpoint_interval_s > 86400)) {
    throw ConfigError("--ps-checkpoint-interval", "expected seconds in [0.1, 86400], got " +
                                                      std::to_string(so.ps_checkpoint_interval_s));
  }
  fs::path state = so.state_dir;
  const bool temporary = state.empty();
  if (temporary) {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp") + "/dltrain-standalone-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw IoError("cannot create a temporary state directory: " + std::string(std::strerror(errno)));
    state = tmpl;
  } else {
    std::error_code ec;
    fs::create_directories(state, ec);
    if (ec) throw ConfigError("--state-dir", "cannot create \"" + state.string() + "\": " + ec.message());
    state = fs::absolute(state);
  }

  asio::io_context io;
  config::AgentOptions lopt;
  lopt.name = "leader";
  lopt.leader = true;
  lopt.listen_address = "127.0.0.1";
  lopt.listen_port = so.port;
  lopt.agent_token = new_job_secret_hex();
  lopt.client_token = new_job_secret_hex();
  lopt.state_dir = (state / "leader").string();
  lopt.shared_plan = so.shared_plan;
  leader::Leader leader(io, lopt);
  leader.start();
  const std::string url = "ws://127.0.0.1:" + std::to_string(leader.port());
  // The leader's metrics on an ephemeral loopback port; each agent serves its own.
  control::MetricsServer metrics(io, control::MetricsServerOptions{"127.0.0.1", 0, ""},
                                 {[&leader](control::MetricsBuilder& b) { leader.collect_metrics(b); }});
  metrics.start();
  const std::string metrics_endpoint = "127.0.0.1:" + std::to_string(metrics.port());

  write_private(state / "agent.token", lopt.agent_token + "\n");
  agent::Supervisor sup(io);
  bool stopping = false;
  int exit_code = 0;
  const std::string client_json =
      nlohmann::json{{"leader", url},
                     {"client_token", lopt.client_token},
                     {"state_dir", state.string()},
                     {"metrics_endpoint", metrics_endpoint}}
          .dump(2) +
      "\n";
  const fs::path default_file = control::default_standalone_client_file();
  bool ready = false;

  asio::steady_timer ready_timer(io, std::chrono::seconds(60));
  asio::signal_set signals(io, SIGINT, SIGTERM);

  auto cleanup_and_stop = [&] {
    std::error_code ec;
    // Remove the default client file only if it still points at this cluster.
    std::ifstream in(default_file);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == client_json) fs::remove(default_file, ec);
    fs::remove(state / "client.json", ec);
    metrics.stop();
    leader.stop();
    io.stop();
  };

  auto stop_all = [&](int code) {
    if (stopping) return;
    stopping = true;
    exit_code = code;
    ready_timer.cancel();
    signals.cancel();
    spdlog::info("stopping the standalone cluster ({} agents)", sup.running());
    sup.stop_all(std::chrono::seconds(15));
    if (sup.running() == 0) return cleanup_and_stop();
  };

  for (int i = 0; i < so.agents; ++i) {
    const fs::path dir = state / ("agent-" + std::to_string(i));
    fs::create_directories(dir);
    std::ostringstream cfg;
    cfg << "# Generated by dltrain-agent --standalone\n"
        << "name = " << toml_quote("local-" + std::to_string(i)) << "\n"
        << "leader_url = " << toml_quote(url) << "\n"
        << "agent_token_file = " << toml_quote((state / "agent.token").string()) << "\n"
        << "advertise_address = \"127.0.0.1\"\n"
        << "task_bind_address = \"127.0.0.1\"\n"
        << "metrics_address = \"127.0.0.1\"\n"
        << "metrics_port = 0\n"
        << "cores = " << so.cores_per_agent << "\n"
        // Local agents share one machine: only the first may claim its GPUs.
        << "gpus = " << (i == 0 && so.gpus != "none" ? standalone_gpus_value(so.gpus) : std::string("\"none\"")) << "\n"
        << (i == 0 && !so.nvml_library.empty() ? "nvml_library = " + toml_quote(so.nvml_library) + "\n" : "")
        << "state_dir = " << toml_quote(dir.string()) << "\n"
        << "log_level = " << toml_quote(so.log_level) << "\n";
    if (so.progress_interval_s > 0) {
      cfg << "progress_interval = " << toml_quote(std::to_string(std::llround(so.progress_interval_s * 1000)) + "ms")
          << "\n";
    }
    if (so.ps_checkpoint_interval_s > 0) {
      cfg << "ps_checkpoint_interval = "
          << toml_quote(std::to_string(std::llround(so.ps_checkpoint_interval_s * 1000)) + "ms") << "\n";
    }
    write_private(dir / "agent.toml", cfg.str());
    agent::ProcessSpec ps;
    ps.argv = {agent_exe, "--config", (dir / "agent.toml").string()};
    ps.log_path = (dir / "agent.log").string();
    sup.spawn(
        ps, [](const std::string&) {},
        [&, i](const agent::ExitStatus& st) {
          const auto log = state / ("agent-" + std::to_string(i)) / "agent.log";
          if (!stopping) spdlog::error("agent local-{} {}; see {}", i, st.describe(), log.string());
          if (!stopping && !ready) {
            // It will not register: say why (its last log lines) and stop now, not after
            // the 60 s the others are given. A configuration error (exit code 2) is
            // reported as one.
            std::ifstream in(log);
            std::deque<std::string> tail;
            for (std::string line; std::getline(in, line);) {
              tail.push_back(line);
              if (tail.size() > 3) tail.pop_front();
            }
            for (const auto& line : tail) spdlog::error("agent local-{}: {}", i, line);
            stop_all(st.exit_code == 2 ? 2 : 1);
            return;
          }
          if (stopping && sup.running() == 0) cleanup_and_stop();
        });
  }

  leader.set_on_agent_registered([&] {
    if (ready || leader.live_agents() < static_cast<std::size_t>(so.agents)) return;
    ready = true;
    ready_timer.cancel();
    write_private(state / "client.json", client_json);
    write_private(default_file, client_json);
    std::cout << "dltrain standalone cluster ready: leader " << url << ", " << so.agents << " agent"
              << (so.agents == 1 ? "" : "s") << " with " << so.cores_per_agent << " core"
              << (so.cores_per_agent == 1 ? "" : "s") << " each, state in " << state.string() << "\n"
              << "client settings written to " << default_file.string() << "; stop with Ctrl-C\n"
              << "dashboard: " << (url.rfind("wss://", 0) == 0 ? "https://" : "http://")
              << url.substr(url.find("://") + 3) << "/ (sign in with the client_token of "
              << (state / "client.json").string() << ")" << std::endl;
  });
  ready_timer.async_wait([&](boost::system::error_code ec) {
    if (ec || ready) return;
    spdlog::error("only {} of {} agents registered within 60 s; see the agent logs in {}", leader.live_agents(),
                  so.agents, state.string());
    stop_all(1);
  });
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    stop_all(0);
  });

  io.run();
  if (temporary) {
    std::error_code ec;
    fs::remove_all(state, ec);
  }
  return exit_code;
}

}  // namespace dltrain::daemon
