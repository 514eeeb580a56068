#include "slurm.h"

#include <signal.h>
#include <string.h>

#include <cctype>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "agent/gpus.h"
#include "commands.h"
#include "common/secret.h"
#include "control/client.h"
#include "job/job_spec.h"
#include "launch/slurm.h"
#include "models.h"

namespace dltrain::client {

namespace fs = std::filesystem;
using json = nlohmann::json;
using launch::Environment;
using launch::LaunchError;
using Clock = std::chrono::steady_clock;

namespace {

/// The cluster did not form (exit code kExitNoLeader).
class FormError : public Error {
 public:
  using Error::Error;
};

/// A stop signal (scancel, the time limit, Ctrl-C) ended the launcher: exit 128 + signal.
class Stopped : public Error {
 public:
  Stopped(int sig, const std::string& what) : Error(what), sig_(sig) {}
  int sig() const { return sig_; }

 private:
  int sig_;
};

/// How long a node's agent may take to stop after SIGTERM before the step's task kills it
/// (its own tasks get task_stop_grace, 10 s, then SIGKILL from the agent).
constexpr std::chrono::seconds kAgentStopBound{60};

/// The job name of the agents' srun step (how stop_agents finds it in squeue).
constexpr const char* kAgentsStepName = "dltrain-agents";

void say(const std::string& line) { std::cerr << "dltrain slurm: " << line << std::endl; }

/// SIGTERM, SIGINT and SIGHUP are blocked and taken with sigtimedwait, so that one loop
/// both watches its children and hears a stop; children start with them unblocked.
sigset_t stop_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGHUP);
  return s;
}

void block_stop_signals() {
  const sigset_t s = stop_signals();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

/// A stop signal that arrived within `wait`, or 0.
int next_stop_signal(std::chrono::milliseconds wait) {
  const sigset_t s = stop_signals();
  timespec ts{static_cast<time_t>(wait.count() / 1000), static_cast<long>((wait.count() % 1000) * 1000000)};
  const int sig = sigtimedwait(&s, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

std::string job_dir(const SlurmOptions& opt, const launch::SlurmJob& job) {
  if (!opt.dir.empty()) return fs::absolute(opt.dir).string();
  const fs::path base = job.submit_dir.empty() ? fs::current_path() : fs::path(job.submit_dir);
  return (base / ("dltrain-" + job.job_id)).string();
}

/// The launcher's decisions for the allocation in `env`.
struct Launch {
  launch::SlurmJob job;
  std::vector<std::string> nodes;
  launch::LaunchPlan plan;
};

Launch decide(const SlurmOptions& opt, const Environment& env) {
  Launch l;
  l.job = launch::read_slurm_job(env);
  const auto run = launch::default_runner();
  l.nodes = launch::expand_hostlist(l.job.nodelist, run);
  if (static_cast<int>(l.nodes.size()) != l.job.num_nodes) {
    throw LaunchError(fmt::format("SLURM_JOB_NODELIST \"{}\" names {} nodes but the allocation has {}", l.job.nodelist,
                                  l.nodes.size(), l.job.num_nodes));
  }
  l.plan.job_id = l.job.job_id;
  l.plan.leader_node = l.nodes.front();
  l.plan.port = opt.port != 0 ? opt.port : launch::port_for_job(l.job.job_id);
  l.plan.addresses = launch::node_addresses(l.nodes, l.job.nodelist, run);
  auto tmp = env.find("TMPDIR");
  l.plan.state_root = !opt.state_root.empty() ? opt.state_root
                      : tmp != env.end() && !tmp->second.empty() ? tmp->second
                                                                   : "/tmp";
  l.plan.leader_state_dir = opt.leader_state_dir.empty() ? "" : fs::absolute(opt.leader_state_dir).string();
  l.plan.drain_poll = opt.drain_poll;
  l.plan.agent_log_level = opt.agent_log_level;
  return l;
}

/// The agents' srun step: one task per node on every node of the allocation, all its CPUs
/// (--whole), the step ended when an agent fails (--kill-on-bad-exit) but not when Slurm
/// takes a node away (--no-kill: that is a lost agent, which the leader recovers from).
pid_t start_agents(const SlurmOptions& opt, const Launch& l, const std::string& self_exe) {
  Environment env = launch::current_environment();
  for (auto& [k, v] : l.plan.to_environment()) env[k] = v;
  const std::string n = std::to_string(l.nodes.size());
  const std::vector<std::string> argv{opt.srun, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--whole",
                                      "--kill-on-bad-exit=1", "--no-kill", "--label", std::string("--job-name=") + kAgentsStepName,
                                      self_exe, "slurm", "agent"};
  return launch::start_process(argv, env);
}

/// Waits until every node's agent is registered; returns what each offers. Throws
/// FormError when the step ends first or the bound passes, and stops on a stop signal.
std::vector<launch::AgentOffer> wait_for_agents(const SlurmOptions& opt, const Launch& l, pid_t srun,
                                                std::optional<int>& srun_exit) {
  const auto start = Clock::now();
  const auto deadline = start + opt.form_timeout;
  auto next_note = start + std::chrono::seconds(5);
  const std::string url = l.plan.leader_url();
  say(fmt::format("starting {} agents on {} (leader {} on {})", l.nodes.size(), l.job.nodelist, url, l.plan.leader_node));
  std::string why = "not answering yet";
  for (;;) {
    if ((srun_exit = launch::exit_status(srun, false))) {
      throw FormError(fmt::format("the agents' step ended (exit status {}) before the cluster formed: {}; the agents' "
                                  "output is above",
                                  *srun_exit, why));
    }
    try {
      control::BlockingControlClient c(url, l.plan.client_token, std::chrono::seconds(5));
      const auto r = c.request("agents", json::object(), std::chrono::seconds(5));
      std::set<std::string> missing(l.nodes.begin(), l.nodes.end());
      std::vector<launch::AgentOffer> offers;
      for (const auto& a : r.at("agents")) {
        const std::string name = a.value("agent", "");
        if (missing.erase(name) == 0) continue;
        offers.push_back({name, a.value("cores", 0), static_cast<int>(a.value("gpus", json::array()).size())});
      }
      if (missing.empty()) {
        say(fmt::format("cluster formed in {:.1f} s", std::chrono::duration<double>(Clock::now() - start).count()));
        return offers;
      }
      std::string m;
      for (const auto& x : missing) m += (m.empty() ? "" : ", ") + x;
      why = fmt::format("{} of {} agents registered, waiting for {}", offers.size(), l.nodes.size(), m);
    } catch (const std::exception& e) {
      why = fmt::format("the leader at {} does not answer yet ({})", url, e.what());
    }
    if (Clock::now() >= deadline) {
      throw FormError(fmt::format("the cluster did not form within {} s (--form-timeout): {}", opt.form_timeout.count(), why));
    }
    if (Clock::now() >= next_note) {
      say("waiting: " + why);
      next_note = Clock::now() + std::chrono::seconds(5);
    }
    if (int sig = next_stop_signal(std::chrono::milliseconds(500))) {
      throw Stopped(sig, fmt::format("stopped by signal {} ({}) while the cluster formed", sig, strsignal(sig)));
    }
  }
}

std::string write_client_settings(const std::string& dir, const Launch& l) {
  fs::create_directories(dir);
  const std::string token = dir + "/client.token";
  write_private_file(token, l.plan.client_token + "\n");
  const std::string path = dir + "/client.toml";
  std::ostringstream text;
  text << "# The client settings of dltrain's cluster in Slurm job " << l.job.job_id
       << " (written by dltrain slurm); removed when it ends.\n"
       << toml::table{{"leader", l.plan.leader_url()}, {"token_file", token}} << "\n";
  write_private_file(path, text.str());
  return path;
}

/// The allocation ends with the cluster: its settings and token go with it.
void remove_client_settings(const std::string& dir) {
  std::error_code ec;
  fs::remove(dir + "/client.token", ec);
  fs::remove(dir + "/client.toml", ec);
  fs::remove(dir, ec);  // only when nothing else is in it
}

/// With --leader-state-dir the leader restores the jobs an earlier allocation left
/// unfinished; no agent of theirs will come back, and re-running them would take this
/// allocation's cores from the job it was started for. Cancels them, saying so.
void cancel_restored_jobs(control::BlockingControlClient& c) {
  const auto r = c.request("list", {{"limit", 1000}}, std::chrono::seconds(30));
  for (const auto& j : r.value("jobs", json::array())) {
    const std::string state = j.value("state", "");
    if (state == "succeeded" || state == "failed" || state == "cancelled") continue;
    const std::string id = j.value("job", "");
    say(fmt::format("cancelling {} ({}), left unfinished by an earlier allocation in the leader's state", id, state));
    c.request("cancel", {{"job", id}}, std::chrono::seconds(30));
  }
}

void print_cluster(const std::vector<launch::AgentOffer>& offers, const Launch& l) {
  int cores = 0, gpus = 0;
  std::string each;
  for (const auto& a : offers) {
    cores += a.cores;
    gpus += a.gpus;
    each += fmt::format("{}{} {} {}{}", each.empty() ? "" : ", ", a.name, a.cores, a.cores == 1 ? "core" : "cores",
                        a.gpus ? fmt::format(" {} {}", a.gpus, a.gpus == 1 ? "GPU" : "GPUs") : "");
  }
  say(fmt::format("{} agents, {} cores, {} GPUs ({}); the leader is {} on {}", offers.size(), cores, gpus, each,
                  l.plan.leader_url(), l.plan.leader_node));
}

std::string trim_copy(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

/// The step id ("JOB.STEP") of the agents' step (job name dltrain-agents) in `job_id`, from
/// squeue; "" when squeue does not list it (yet, or any more).
std::string agents_step(const std::string& job_id) {
  try {
    const auto r = launch::run_command({"squeue", "--noheader", "--steps", "--jobs=" + job_id, "--format=%i %j"},
                                       std::chrono::seconds(20));
    std::istringstream in(r.out);
    std::string id, name;
    while (in >> id >> name) {
      if (name == kAgentsStepName) return id;
    }
  } catch (const std::exception& e) {
    say(std::string("cannot list the allocation's steps: ") + e.what());
  }
  return "";
}

/// Ends the agents' step the way each agent stops cleanly: SIGTERM to every task of the step
/// (`scancel --signal=TERM JOB.STEP`, which leaves the step to end by itself as its tasks do:
/// the agents stop their PS shards and workers and remove their state). SIGTERM to srun
/// itself would make srun terminate the step at once. After opt.stop_timeout srun is
/// killed, and Slurm kills what is left of the step. With `slurm_stops` (the launcher got
/// SIGTERM from scancel or the time limit, which Slurm sends every step's tasks too) it
/// only waits.
void stop_agents(const SlurmOptions& opt, const launch::SlurmJob& job, pid_t srun, std::optional<int>& srun_exit,
                 bool slurm_stops) {
  if (srun_exit) return;
  say(slurm_stops ? "Slurm is stopping the job: waiting for the agents to stop" : "stopping the agents");
  // When Slurm ends the job it has signalled every task of the step already.
  const std::string step = slurm_stops ? "" : agents_step(job.job_id);
  bool signalled = slurm_stops;
  if (!step.empty()) {
    try {
      // A non-zero exit can mean that some of the step's nodes are gone (killed, or their
      // task ended after a drain) while the others got the signal: wait for the step either way.
      const auto r = launch::run_command({"scancel", "--signal=TERM", step}, std::chrono::seconds(20));
      signalled = true;
      if (r.exit_code != 0) say("scancel --signal=TERM " + step + ": " + trim_copy(r.err));
    } catch (const std::exception& e) {
      say(std::string("scancel: ") + e.what());
    }
  }
  if (!signalled) ::kill(srun, SIGTERM);  // srun terminates the step itself
  const auto deadline = Clock::now() + opt.stop_timeout;
  while (Clock::now() < deadline) {
    if ((srun_exit = launch::exit_status(srun, false))) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  say(fmt::format("the agents' step did not end within {} s of SIGTERM (--stop-timeout); killing srun",
                  opt.stop_timeout.count()));
  ::kill(srun, SIGKILL);
  srun_exit = launch::exit_status(srun, true);
}

enum class Mode { kRun, kServe };

int launch_cluster(const SlurmOptions& opt, const std::string& self_exe, Mode mode) {
  block_stop_signals();
  Launch l;
  JobSpec spec;
  json request;
  try {
    if (mode == Mode::kRun) {
      request = job_request(opt.job_file, true);
      spec = parse_job_toml(request.at("job_toml").get<std::string>(), request.at("base_dir").get<std::string>());
    }
    l = decide(opt, launch::current_environment());
    l.plan.agent_token = new_job_secret_hex();
    l.plan.client_token = new_job_secret_hex();
  } catch (const std::exception& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    return kExitBadInput;
  }
  std::optional<int> srun_exit;
  pid_t srun = -1;
  int rc = kExitOk;
  std::string verdict;  // run: the job's end, said last
  std::string settings_dir;
  // SIGTERM comes from Slurm (scancel, the time limit), which signals every step itself.
  bool slurm_stops = false;
  try {
    srun = start_agents(opt, l, self_exe);
    const auto offers = wait_for_agents(opt, l, srun, srun_exit);
    print_cluster(offers, l);
    if (!l.plan.leader_state_dir.empty()) {
      control::BlockingControlClient c(l.plan.leader_url(), l.plan.client_token, std::chrono::seconds(30));
      cancel_restored_jobs(c);
    }
    settings_dir = job_dir(opt, l.job);
    const std::string settings = write_client_settings(settings_dir, l);
    say("client settings: export DLTRAIN_CLIENT_CONFIG=" + settings);
    if (mode == Mode::kRun) {
      launch::check_job_fits(spec, offers, opt.job_file);
      control::BlockingControlClient c(l.plan.leader_url(), l.plan.client_token, std::chrono::seconds(30));
      CommandOptions copt;
      copt.leader = l.plan.leader_url();
      copt.follow = true;
      const std::string id = submit_and_print(c, request, copt, false);
      // No agent joins an allocation: a job the leader says can never fit would wait for ever.
      const auto st = c.request("status", {{"job", id}}, std::chrono::seconds(30));
      if (st.value("state", "") == "queued" && !st.value("fits_cluster", true)) {
        c.request("cancel", {{"job", id}}, std::chrono::seconds(30));
        throw LaunchError(fmt::format("{}: {} can never start in this allocation (it needs {} cores, the agents offer {}); "
                                      "cancelled it",
                                      opt.job_file, id, st.value("cores_needed", 0), st.value("cores_total", 0)));
      }
      wire::events::Summary sum;
      int stop_sig = 0;
      rc = follow_job(c, id, false, &sum, [&] { return (stop_sig = next_stop_signal(std::chrono::milliseconds(0))) != 0; });
      if (rc == kFollowStopped) {
        say(fmt::format("signal {} ({}): stopping the cluster", stop_sig, strsignal(stop_sig)));
        slurm_stops = stop_sig == SIGTERM;
        verdict = fmt::format("{} did not finish: stopped by signal {} ({})", id, stop_sig, strsignal(stop_sig));
        rc = 128 + stop_sig;
      } else if (rc == kExitOk) {
        verdict = id + " succeeded";
        // The leader's state (and its model store) goes with the allocation: the trained
        // model stays in the job's directory beside the client settings.
        try {
          ModelGetOptions mo;
          mo.dir = (fs::path(settings_dir) / (id + "-model")).string();
          copt.job_id = id;
          model_get(c, copt, mo, false);
          verdict += "; its trained model is in " + mo.dir;
        } catch (const std::exception& e) {
          std::cerr << "dltrain slurm: the trained model of " << id << " could not be downloaded: " << e.what()
                    << std::endl;
        }
      } else {
        verdict = id + " " + sum.state + (sum.error ? ": " + *sum.error : "");
      }
    } else {
      say(fmt::format("serving until the allocation ends (scancel {} stops it)", l.job.job_id));
      for (;;) {
        if ((srun_exit = launch::exit_status(srun, false))) {
          say(fmt::format("the agents' step ended (exit status {})", *srun_exit));
          if (*srun_exit != 0) rc = kExitNoLeader;  // an agent failed and took the step with it
          break;
        }
        if (int sig = next_stop_signal(std::chrono::milliseconds(1000))) {
          say(fmt::format("signal {} ({}): stopping the cluster", sig, strsignal(sig)));
          slurm_stops = sig == SIGTERM;
          rc = 128 + sig;
          break;
        }
      }
    }
  } catch (const LaunchError& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    rc = kExitBadInput;
  } catch (const FormError& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    rc = kExitNoLeader;
  } catch (const Stopped& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    slurm_stops = e.sig() == SIGTERM;
    rc = 128 + e.sig();
  } catch (const control::RemoteError& e) {
    std::cerr << "dltrain slurm: the leader rejected the job: " << e.what() << " [" << e.code() << "]" << std::endl;
    rc = e.code() == "unavailable" ? kExitNoLeader : kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    rc = kExitNoLeader;
  }
  if (srun > 0) stop_agents(opt, l.job, srun, srun_exit, slurm_stops);
  if (!settings_dir.empty()) remove_client_settings(settings_dir);
  // The job's verdict is the batch output's last line, after whatever the agents printed
  // as they stopped.
  if (!verdict.empty()) say(verdict);
  return rc;
}

}  // namespace

int slurm_run(const SlurmOptions& opt, const std::string& self_exe) { return launch_cluster(opt, self_exe, Mode::kRun); }

int slurm_serve(const SlurmOptions& opt, const std::string& self_exe) {
  return launch_cluster(opt, self_exe, Mode::kServe);
}

int slurm_show(const SlurmOptions& opt, bool as_json) {
  try {
    const Environment env = launch::current_environment();
    const Launch l = decide(opt, env);
    json out{{"job", l.job.job_id}, {"nodes", l.nodes}, {"leader_node", l.plan.leader_node},
             {"leader_url", l.plan.leader_url()}, {"addresses", l.plan.addresses},
             {"state_root", l.plan.state_root}, {"client_settings", job_dir(opt, l.job)}};
    std::optional<launch::NodeGrant> g;
    if (env.count("SLURMD_NODENAME") && env.count("SLURM_NODEID") && env.count("SLURM_CPUS_ON_NODE")) {
      g = launch::read_node_grant(env);
      out["this_node"] = {{"node", g->node}, {"cpus", g->cpus}, {"gpus", g->gpus}, {"memory_mb", g->memory_mb}};
    }
    if (as_json) {
      std::cout << out.dump() << std::endl;
      return kExitOk;
    }
    std::cout << "Slurm job " << l.job.job_id << ": " << l.nodes.size() << " nodes\n";
    for (const auto& n : l.nodes) {
      std::cout << "  " << n << " " << l.plan.addresses.at(n) << (n == l.plan.leader_node ? "  leader" : "") << "\n";
    }
    std::cout << "leader: " << l.plan.leader_url() << "\nclient settings: " << job_dir(opt, l.job)
              << "/client.toml\nagents' state: " << l.plan.state_root << "/dltrain-slurm-" << l.job.job_id << "/NODE\n";
    if (g) {
      std::cout << "this node (" << g->node << "): " << g->cpus << " CPUs, "
                << (g->gpus.empty() ? std::string("no GPUs") : fmt::format("GPUs {}", fmt::join(g->gpus, ",")))
                << (g->memory_mb ? fmt::format(", {} MiB", g->memory_mb) : "") << "\n";
    }
    return kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "dltrain slurm: " << e.what() << std::endl;
    return kExitBadInput;
  }
}

int slurm_agent(const std::string& self_exe) {
  block_stop_signals();
  launch::LaunchPlan plan;
  launch::NodeGrant g;
  fs::path dir;
  try {
    const Environment env = launch::current_environment();
    plan = launch::LaunchPlan::from_environment(env);
    g = launch::read_node_grant(env);
    if (!g.gpus.empty()) {
      // Slurm's numbers to NVML's (a device-constrained step sees only its GPUs, from 0).
      const auto found = agent::discover_gpus();
      g.gpus = launch::nvml_indices_of_grant(g.gpus, static_cast<int>(found.gpus.size()));
    }
    dir = fs::path(plan.state_root) / ("dltrain-slurm-" + plan.job_id) / g.node;
    fs::create_directories(dir);
    fs::permissions(dir.parent_path(), fs::perms::owner_all);
    fs::permissions(dir, fs::perms::owner_all);
    write_private_file((dir / "agent.token").string(), plan.agent_token + "\n");
    if (g.node == plan.leader_node) write_private_file((dir / "client.token").string(), plan.client_token + "\n");
    const std::string config = (dir / "agent.toml").string();
    write_private_file(config, launch::agent_config_toml(plan, g, dir.string()));
    if (!plan.leader_state_dir.empty() && g.node == plan.leader_node) fs::create_directories(plan.leader_state_dir);
  } catch (const std::exception& e) {
    std::cerr << "dltrain slurm agent: " << e.what() << std::endl;
    return kExitBadInput;
  }
  const auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::remove(dir.parent_path(), ec);  // only once it is empty: the last agent of this node's jobs
  };
  const std::string who = "dltrain slurm agent on " + g.node + ": ";
  pid_t agent = -1;
  try {
    const std::string exe = (fs::path(self_exe).parent_path() / "dltrain-agent").string();
    // The plan's variables (the tokens among them) stay out of the agent's environment and
    // so out of its tasks': the agent reads its tokens from their 0600 files.
    Environment agent_env = launch::current_environment();
    std::erase_if(agent_env, [](const auto& kv) { return kv.first.rfind("DLTRAIN_SLURM_", 0) == 0; });
    agent = launch::start_process({exe, "--config", (dir / "agent.toml").string()}, agent_env);
  } catch (const std::exception& e) {
    std::cerr << who << e.what() << std::endl;
    cleanup();
    return kExitNoLeader;
  }
  bool stop_asked = false;
  std::optional<Clock::time_point> kill_at;  // SIGKILL when the agent outlives its stop this long
  const auto ask_stop = [&] {
    ::kill(agent, SIGTERM);
    stop_asked = true;
    if (!kill_at) kill_at = Clock::now() + kAgentStopBound;
  };
  auto next_poll = Clock::now() + plan.drain_poll;
  std::optional<int> code;
  while (!(code = launch::exit_status(agent, false))) {
    if (int sig = next_stop_signal(std::chrono::milliseconds(500))) {
      if (!stop_asked) std::cerr << who << "signal " << sig << ": stopping the agent" << std::endl;
      ask_stop();
    }
    if (kill_at && Clock::now() >= *kill_at) {
      std::cerr << who << "the agent did not stop within " << kAgentStopBound.count() << " s of SIGTERM; killing it"
                << std::endl;
      ::kill(agent, SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(24);  // once
    }
    if (plan.drain_poll.count() > 0 && !stop_asked && Clock::now() >= next_poll) {
      next_poll = Clock::now() + plan.drain_poll;
      try {
        const auto r = launch::run_command({"scontrol", "show", "node", "-o", g.node}, std::chrono::seconds(10));
        const auto state = launch::scontrol_node_field(r.out, "State");
        auto it = state.find(g.node);
        if (r.exit_code == 0 && it != state.end() && it->second.find("DRAIN") != std::string::npos) {
          std::cerr << who << "Slurm drains this node (State=" << it->second
                    << "): stopping the agent; the leader re-assigns its tasks" << std::endl;
          ask_stop();
        }
      } catch (const std::exception& e) {
        std::cerr << who << "cannot read the node's state: " << e.what() << std::endl;
      }
    }
  }
  cleanup();
  if (stop_asked) return kExitOk;
  if (*code != 0) std::cerr << who << "the agent ended with exit status " << *code << std::endl;
  return *code;
}

}  // namespace dltrain::client
