// dltrain-agent: the per-machine daemon (leader or agent), or a whole local cluster with
// --standalone.
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>

#include <boost/asio.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/agent.h"
#include "leader/leader.h"
#include "agent/notify.h"
#include "config/options.h"
#include "agent/gpus.h"
#include "candidate.h"
#include "standalone.h"
#include "control/metrics_server.h"
#include "common/errors.h"
#include "common/host_port.h"
#include "common/log.h"
#include "dltrain/config.h"

namespace {

std::string self_exe(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

int run_daemon(const dltrain::config::AgentOptions& opt, const std::string& config_path) {
  namespace asio = boost::asio;
  asio::io_context io;
  dltrain::agent::SystemdNotifier notifier(io);
  std::optional<dltrain::leader::Leader> leader;
  std::optional<dltrain::daemon::Candidacy> candidacy;  // leader = true with [ha]: docs/ha.md
  std::optional<dltrain::agent::Agent> agent;
  const bool ha = opt.leader && opt.ha.enabled();
  auto agent_opt = opt;
  if (!opt.leader || opt.host_tasks) {
    // The GPUs it offers, found before anything starts: a listed GPU that is missing is a
    // configuration error (exit 2, systemd never told READY); "auto" on a machine without
    // a driver offers none; "none" does not load NVML at all.
    if (opt.gpus && opt.gpus->empty()) {
      spdlog::info("no GPUs (gpus = \"none\")");
    } else {
      const auto found = dltrain::agent::discover_gpus(opt.nvml_library);
      agent_opt.gpu_devices = dltrain::agent::select_gpus(found, opt.gpus);
      spdlog::info("{}", dltrain::agent::describe_gpus(found, agent_opt.gpu_devices));
    }
  }
  if (ha) {
    // A candidate: it leads only while elected; its own agent follows whichever
    // candidate serves (leader_url lists them all).
    candidacy.emplace(io, opt, notifier);
    candidacy->start();
    notifier.ready("leader candidate " + opt.name + ": campaigning through etcd " + opt.ha.etcd.front() +
                   (opt.ha.etcd.size() > 1 ? " (+" + std::to_string(opt.ha.etcd.size() - 1) + ")" : ""));
  } else if (opt.leader) {
    leader.emplace(io, opt);
    leader->start();
    const std::string host =
        opt.listen_address == "0.0.0.0" || opt.listen_address == "::" ? "127.0.0.1" : opt.listen_address;
    // The agent inside the leader's process reaches it on its own address; over TLS it
    // trusts exactly the leader's certificate.
    const bool tls = !opt.tls_cert_file.empty();
    agent_opt.leader_url = (tls ? "wss://" : "ws://") + dltrain::format_host_port(host, leader->port());
    if (tls) agent_opt.tls_pinned_cert_file = opt.tls_cert_file;
  }
  if (opt.leader && !ha) {
    // READY once the control endpoint listens.
    notifier.ready("leader listening on " + opt.listen_address + ":" + std::to_string(leader->port()) +
                   (opt.tls_cert_file.empty() ? "" : " (TLS)"));
  }
  // The metrics endpoint serves the leader's families and this agent's; it listens before
  // the agent registers, which reports where it is.
  std::optional<dltrain::control::MetricsServer> metrics;
  if (!opt.metrics_address.empty()) {
    metrics.emplace(io, dltrain::control::MetricsServerOptions{opt.metrics_address, opt.metrics_port, opt.metrics_token},
                    std::vector<dltrain::control::MetricsCollector>{
                        [&leader, &candidacy](dltrain::control::MetricsBuilder& b) {
                          if (leader) leader->collect_metrics(b);
                          if (candidacy) {
                            candidacy->collect_metrics(b);
                            if (auto* l = candidacy->leader()) l->collect_metrics(b);
                          }
                        },
                        [&agent](dltrain::control::MetricsBuilder& b) {
                          if (agent) agent->collect_metrics(b);
                        }});
    metrics->start();
    const bool any = opt.metrics_address == "0.0.0.0" || opt.metrics_address == "::";
    agent_opt.metrics_endpoint = dltrain::format_host_port(any ? opt.advertise_address : opt.metrics_address, metrics->port());
    spdlog::info("metrics on http://{}/metrics{}", agent_opt.metrics_endpoint,
                 opt.metrics_token.empty() ? "" : " (bearer token required)");
  }
  if (!opt.leader || opt.host_tasks) {
    agent.emplace(io, agent_opt);
    if (!opt.leader) {
      // READY once registered with the leader.
      agent->set_on_registered([&notifier, &agent_opt] {
        notifier.ready("registered with the leader" +
                       (agent_opt.leader_urls.size() > 1 ? std::string(" (one of the candidates in leader_url)")
                                                         : " at " + agent_opt.leader_url) +
                       " as " + agent_opt.name + " (" +
                       std::to_string(agent_opt.cores) + " cores)");
      });
    }
    agent->start();
  }
  if (const auto usec = notifier.start_watchdog()) {
    spdlog::info("systemd watchdog: {} ms, pinged every {} ms", usec / 1000, usec / 2000);
  }
  // SIGHUP: reload what can change at run time.
  asio::signal_set hup(io, SIGHUP);
  std::function<void()> wait_hup = [&] {
    hup.async_wait([&](boost::system::error_code ec, int) {
      if (ec) return;
      try {
        const auto fresh = dltrain::config::load_agent_options(config_path);
        spdlog::set_level(spdlog::level::from_str(fresh.log_level));
        spdlog::info("SIGHUP: reloaded {}: log_level = {}; other settings, tokens included, take effect at the next "
                     "restart", config_path, fresh.log_level);
        notifier.status("configuration reloaded (log_level " + fresh.log_level + ")");
      } catch (const std::exception& e) {
        spdlog::error("SIGHUP: {} not reloaded, the running configuration stays: {}", config_path, e.what());
      }
      wait_hup();
    });
  };
  wait_hup();
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: stopping tasks and exiting", sig);
    notifier.stopping("stopping: ending tasks");
    hup.cancel();
    auto finish = [&] {
      if (metrics) metrics->stop();
      if (leader) leader->stop();
      if (candidacy) candidacy->stop();  // resigns: a standby serves at once
      io.stop();
    };
    if (agent) {
      agent->shutdown(finish);
    } else {
      finish();
    }
  });
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dltrain-agent " DLTRAIN_VERSION
               ": the dltrain daemon. Runs PS shard and worker tasks for the leader; with leader = true in its\n"
               "configuration it is the leader, and with an [ha] table too a leader candidate elected through etcd\n"
               "(docs/ha.md). With --standalone it starts a leader and N agents on this machine."};
  std::string config = "/etc/dltrain/agent.toml";
  std::string log_level;
  bool standalone = false;
  dltrain::daemon::StandaloneOptions so;
  app.add_option("-c,--config", config, "agent configuration file (TOML)")->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides the configuration)");
  // Per-machine values that a shared configuration (a Kubernetes ConfigMap, one file on a
  // shared file system) cannot hold: the orchestrator passes them, e.g. from the downward API.
  std::string name_override, advertise_override;
  app.add_option("--name", name_override, "this agent's name (overrides the configuration's name)");
  app.add_option("--advertise-address", advertise_override,
                 "the address other machines reach this one at (overrides the configuration's advertise_address)");
  app.add_flag("--standalone", standalone, "run a leader plus --agents local agents on loopback");
  app.add_option("--agents", so.agents, "standalone: number of agents")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--cores-per-agent", so.cores_per_agent, "standalone: cores each agent offers")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--gpus", so.gpus,
                 "standalone: the GPUs the first agent offers: none (default), auto, or indices such as 0,1 "
                 "(the others offer none: docs/gpu.md)")
      ->capture_default_str();
  app.add_option("--nvml-library", so.nvml_library, "standalone: the first agent's NVML library (name or path)");
  app.add_option("--state-dir", so.state_dir, "standalone: keep state here instead of a temporary directory");
  app.add_option("--port", so.port, "standalone: leader port on 127.0.0.1 (default: ephemeral)");
  app.add_option("--ps-checkpoint-interval", so.ps_checkpoint_interval_s,
                 "standalone: seconds between PS shard checkpoints (default: the agents' 10 s)")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--progress-interval", so.progress_interval_s,
                 "standalone: seconds between a worker's progress events (default: the agents' 5 s)")
      ->check(CLI::Range(0.1, 86400.0));
  bool check_config = false;
  app.add_flag("--shared-plan", so.shared_plan,
               "standalone: the leader resizes elastic jobs to share the cluster (docs/operations.md, \"The shared plan\")");
  app.add_flag("--check-config", check_config,
               "read the configuration (and its token files), say what is wrong with it or that it is valid, and "
               "exit (0 valid, 2 not)");
  bool list_gpus = false;
  app.add_flag("--list-gpus", list_gpus,
               "print the GPUs this agent would offer (NVML, honouring the configuration's gpus and nvml_library "
               "when the file exists) as JSON, and exit");
  app.set_version_flag("--version", DLTRAIN_VERSION);
  CLI11_PARSE(app, argc, argv);
  try {
    if (list_gpus) {
      // Only the GPU keys matter here: a missing file, or one this user cannot read all of
      // (its token files), falls back to the defaults with a note.
      std::optional<std::vector<int>> wanted;
      std::string library = "libnvidia-ml.so.1", note;
      if (std::filesystem::exists(config)) {
        try {
          const auto o = dltrain::config::load_agent_options(config);
          wanted = o.gpus;
          library = o.nvml_library;
        } catch (const dltrain::ConfigError& e) {
          if (e.field() == "gpus" || e.field().rfind("gpus[", 0) == 0 || e.field() == "nvml_library") throw;
          note = config + " not read (" + e.what() + "): the defaults gpus = \"auto\" and nvml_library = \"" +
                 library + "\" are shown";
        }
      }
      const auto found = dltrain::agent::discover_gpus(library);
      nlohmann::json out = {{"library", library}, {"driver_version", found.driver_version},
                            {"problem", found.problem}, {"found", nlohmann::json::array()},
                            {"offered", nlohmann::json::array()}};
      if (!note.empty()) out["note"] = note;
      for (const auto& g : found.gpus) out["found"].push_back(g.to_json());
      int rc = 0;
      try {
        const auto offered = dltrain::agent::select_gpus(found, wanted);
        for (const auto& g : offered) out["offered"].push_back(g.to_json());
        std::cerr << dltrain::agent::describe_gpus(found, offered) << "\n";
      } catch (const dltrain::ConfigError& e) {
        out["error"] = e.what();  // the agent would not start with this configuration
        std::cerr << "dltrain-agent: configuration error: " << e.what() << "\n";
        rc = 2;
      }
      if (!note.empty()) std::cerr << note << "\n";
      std::cout << out.dump(1) << "\n";
      return rc;
    }
    if (standalone) {
      so.log_level = log_level.empty() ? "info" : log_level;
      dltrain::init_logging("standalone", so.log_level);
      return dltrain::daemon::run_standalone(so, self_exe(argv[0]));
    }
    auto opt = dltrain::config::load_agent_options(config);
    if (!log_level.empty()) opt.log_level = log_level;
    if (!name_override.empty()) opt.name = name_override;
    if (!advertise_override.empty()) opt.advertise_address = advertise_override;
    if (check_config) {
      // What the daemon would refuse only once it starts: addresses it binds, GPUs it offers.
      const auto ip = [](const std::string& field, const std::string& v) {
        boost::system::error_code ec;
        boost::asio::ip::make_address(v, ec);
        if (ec) throw dltrain::ConfigError(field, "not an IP address: \"" + v + "\"");
      };
      if (opt.leader) ip("listen_address", opt.listen_address);
      ip("task_bind_address", opt.task_bind_address);
      if (!opt.metrics_address.empty()) ip("metrics_address", opt.metrics_address);
      if (opt.gpus) dltrain::agent::select_gpus(dltrain::agent::discover_gpus(opt.nvml_library), opt.gpus);
      std::string urls;
      for (const auto& u : opt.leader_urls) urls += (urls.empty() ? "" : ", ") + u;
      std::cout << "dltrain-agent: " << config << " is valid: "
                << (opt.leader && opt.ha.enabled()
                        ? "leader candidate " + opt.name + " (control port " + std::to_string(opt.listen_port) +
                              ", etcd " + opt.ha.etcd.front() + (opt.ha.etcd.size() > 1 ? ", ..." : "") +
                              "; etcd itself is reached only at start)"
                    : opt.leader ? "the leader, control port " + std::to_string(opt.listen_port)
                                 : "agent " + opt.name + " of the leader at " + urls)
                << ", state in " << opt.state_dir << "\n";
      return 0;
    }
    dltrain::init_logging(opt.leader ? "leader" : opt.name, opt.log_level);
    return run_daemon(opt, config);
  } catch (const dltrain::ConfigError& e) {
    std::cerr << "dltrain-agent: configuration error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dltrain-agent: " << e.what() << "\n";
    return 1;
  }
}
