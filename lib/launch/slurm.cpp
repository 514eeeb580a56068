#include "launch/slurm.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/host_port.h"
#include "job/job_spec.h"

namespace dltrain::launch {

namespace {

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

const std::string& require(const Environment& env, const std::string& name, const std::string& hint) {
  const std::string* v = find(env, name);
  if (v == nullptr) throw LaunchError(name + " is not set: " + hint);
  return *v;
}

std::optional<long long> parse_integer(const std::string& s) {
  long long v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

long long positive(const Environment& env, const std::string& name, const std::string& hint) {
  const std::string& v = require(env, name, hint);
  // SLURM_CPUS_ON_NODE is a plain count; SLURM_MEM_PER_NODE may carry a unit-less MiB count.
  auto n = parse_integer(v);
  if (!n || *n < 1) throw LaunchError(name + ": expected a positive integer, got \"" + v + "\"");
  return *n;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string scontrol_failure(const std::vector<std::string>& argv, const CommandResult& r) {
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  std::string why = trim(r.err.empty() ? r.out : r.err);
  if (why.empty()) why = "no output";
  return fmt::format("`{}` failed (exit status {}): {}", cmd, r.exit_code, why);
}

constexpr const char* kInAllocation = "run dltrain slurm inside a Slurm allocation (sbatch or salloc)";
constexpr const char* kInStep = "dltrain slurm agent runs as a task of the launcher's srun step";

std::vector<int> gpu_list(const std::string& name, const std::string& v) {
  std::vector<int> out;
  if (v == "NoDevFiles") return out;
  std::stringstream in(v);
  std::string item;
  while (std::getline(in, item, ',')) {
    auto n = parse_integer(trim(item));
    if (!n || *n < 0 || *n > 4095) {
      throw LaunchError(name + ": expected GPU indices separated by commas (\"0,1\"), got \"" + v + "\"");
    }
    out.push_back(static_cast<int>(*n));
  }
  return out;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

CommandRunner default_runner() {
  return [](const std::vector<std::string>& argv) { return run_command(argv, std::chrono::seconds(60)); };
}

SlurmJob read_slurm_job(const Environment& env) {
  SlurmJob j;
  j.job_id = require(env, "SLURM_JOB_ID", kInAllocation);
  j.nodelist = require(env, "SLURM_JOB_NODELIST", kInAllocation);
  const char* count = find(env, "SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES";
  j.num_nodes = static_cast<int>(positive(env, count, kInAllocation));
  if (const auto* d = find(env, "SLURM_SUBMIT_DIR")) j.submit_dir = *d;
  return j;
}

std::vector<std::string> expand_hostlist(const std::string& hostlist, const CommandRunner& run) {
  const std::vector<std::string> argv{"scontrol", "show", "hostnames", hostlist};
  const CommandResult r = run(argv);
  if (r.exit_code != 0) throw LaunchError("cannot expand the node list \"" + hostlist + "\": " + scontrol_failure(argv, r));
  std::vector<std::string> hosts;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line);
    if (!line.empty()) hosts.push_back(line);
  }
  // scontrol exits 0 on a list it cannot parse, saying why on stderr only.
  if (hosts.empty()) {
    const std::string why = trim(r.err);
    throw LaunchError("cannot expand the node list \"" + hostlist + "\": `scontrol show hostnames " + hostlist +
                      "` printed no host names" + (why.empty() ? "" : ": " + why));
  }
  return hosts;
}

std::map<std::string, std::string> scontrol_node_field(const std::string& scontrol_out, const std::string& key) {
  std::map<std::string, std::string> out;
  std::istringstream in(scontrol_out);
  std::string line;
  const std::string want = key + "=";
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w, name, value;
    while (words >> w) {
      if (w.rfind("NodeName=", 0) == 0) name = w.substr(9);
      if (w.rfind(want, 0) == 0) value = w.substr(want.size());
    }
    if (!name.empty()) out[name] = value;
  }
  return out;
}

std::string numeric_address(const std::string& node, const std::string& address) {
  in6_addr probe{};
  if (::inet_pton(AF_INET, address.c_str(), &probe) == 1 || ::inet_pton(AF_INET6, address.c_str(), &probe) == 1) {
    return address;
  }
  // Most clusters leave NodeAddr unset, so Slurm reports the node's name: resolve it here,
  // on the first node, once for every agent (an IPv4 address first, as most clusters use).
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(address.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw LaunchError(fmt::format("node {}: its address \"{}\" (NodeAddr, else NodeHostName) does not resolve: {}", node,
                                  address, rc != 0 ? ::gai_strerror(rc) : "no address"));
  }
  std::string v4, v6;
  for (const addrinfo* p = res; p != nullptr; p = p->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (p->ai_family == AF_INET && v4.empty()) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr, buf, sizeof buf);
      v4 = buf;
    } else if (p->ai_family == AF_INET6 && v6.empty()) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr, buf, sizeof buf);
      v6 = buf;
    }
  }
  ::freeaddrinfo(res);
  if (v4.empty() && v6.empty()) throw LaunchError(fmt::format("node {}: \"{}\" resolves to no IP address", node, address));
  return v4.empty() ? v6 : v4;
}

std::map<std::string, std::string> node_addresses(const std::vector<std::string>& nodes, const std::string& hostlist,
                                                  const CommandRunner& run) {
  const std::vector<std::string> argv{"scontrol", "show", "node", "-o", hostlist};
  const CommandResult r = run(argv);
  if (r.exit_code != 0) throw LaunchError("cannot read the nodes' addresses: " + scontrol_failure(argv, r));
  auto addr = scontrol_node_field(r.out, "NodeAddr");
  const auto host = scontrol_node_field(r.out, "NodeHostName");
  std::map<std::string, std::string> out;
  for (const auto& n : nodes) {
    std::string a = addr.count(n) ? addr[n] : "";
    if (a.empty() && host.count(n)) a = host.at(n);
    if (a.empty()) throw LaunchError("scontrol show node -o " + hostlist + " does not list node " + n);
    out[n] = numeric_address(n, a);
  }
  return out;
}

NodeGrant read_node_grant(const Environment& env) {
  NodeGrant g;
  g.node = require(env, "SLURMD_NODENAME", kInStep);
  const std::string& id = require(env, "SLURM_NODEID", kInStep);
  auto n = parse_integer(id);
  if (!n || *n < 0) throw LaunchError("SLURM_NODEID: expected a non-negative integer, got \"" + id + "\"");
  g.node_id = static_cast<int>(*n);
  g.cpus = static_cast<int>(positive(env, "SLURM_CPUS_ON_NODE", kInStep));
  for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"}) {
    if (const auto* v = find(env, name)) {
      g.gpus = gpu_list(name, *v);
      break;
    }
  }
  if (const auto* m = find(env, "SLURM_MEM_PER_NODE")) {
    auto mb = parse_integer(*m);
    if (!mb || *mb < 0) throw LaunchError("SLURM_MEM_PER_NODE: expected MiB as an integer, got \"" + *m + "\"");
    g.memory_mb = *mb;
  }
  return g;
}

std::vector<int> nvml_indices_of_grant(const std::vector<int>& granted, int visible) {
  if (granted.empty()) return {};
  if (visible == static_cast<int>(granted.size())) {
    std::vector<int> all(granted.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return all;
  }
  const int top = *std::max_element(granted.begin(), granted.end());
  if (visible > top) return granted;
  throw LaunchError(fmt::format("Slurm granted GPUs {} but NVML sees {} on this node: neither a device-constrained "
                                "step (as many GPUs as granted) nor the whole node (GPU {} among them); check "
                                "gres.conf and `nvidia-smi` inside a step",
                                fmt::join(granted, ","), plural(visible, "GPU", "GPUs"), top));
}

std::uint16_t port_for_job(const std::string& job_id) {
  const auto n = parse_integer(job_id);
  if (!n || *n < 0) return 7070;
  return static_cast<std::uint16_t>(20000 + *n % 40000);
}

std::string LaunchPlan::leader_url() const {
  auto it = addresses.find(leader_node);
  const std::string host = it == addresses.end() ? leader_node : it->second;
  return "ws://" + format_host_port(host, static_cast<std::uint16_t>(port));
}

Environment LaunchPlan::to_environment() const {
  std::string addrs;
  for (const auto& [node, a] : addresses) addrs += (addrs.empty() ? "" : ",") + node + "=" + a;
  return {
      {"DLTRAIN_SLURM_JOB", job_id},
      {"DLTRAIN_SLURM_LEADER_NODE", leader_node},
      {"DLTRAIN_SLURM_PORT", std::to_string(port)},
      {"DLTRAIN_SLURM_ADDRESSES", addrs},
      {"DLTRAIN_SLURM_AGENT_TOKEN", agent_token},
      {"DLTRAIN_SLURM_CLIENT_TOKEN", client_token},
      {"DLTRAIN_SLURM_STATE_ROOT", state_root},
      {"DLTRAIN_SLURM_LEADER_STATE_DIR", leader_state_dir},
      {"DLTRAIN_SLURM_DRAIN_POLL", std::to_string(drain_poll.count())},
      {"DLTRAIN_SLURM_AGENT_LOG_LEVEL", agent_log_level},
  };
}

LaunchPlan LaunchPlan::from_environment(const Environment& env) {
  LaunchPlan p;
  p.job_id = require(env, "DLTRAIN_SLURM_JOB", kInStep);
  p.leader_node = require(env, "DLTRAIN_SLURM_LEADER_NODE", kInStep);
  const std::string& port = require(env, "DLTRAIN_SLURM_PORT", kInStep);
  auto n = parse_integer(port);
  if (!n || *n < 1 || *n > 65535) throw LaunchError("DLTRAIN_SLURM_PORT: expected a port in [1, 65535], got \"" + port + "\"");
  p.port = static_cast<std::uint16_t>(*n);
  std::stringstream in(require(env, "DLTRAIN_SLURM_ADDRESSES", kInStep));
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      throw LaunchError("DLTRAIN_SLURM_ADDRESSES: expected NODE=ADDRESS items separated by commas, got \"" + item + "\"");
    }
    p.addresses[item.substr(0, eq)] = item.substr(eq + 1);
  }
  p.agent_token = require(env, "DLTRAIN_SLURM_AGENT_TOKEN", kInStep);
  p.client_token = require(env, "DLTRAIN_SLURM_CLIENT_TOKEN", kInStep);
  p.state_root = require(env, "DLTRAIN_SLURM_STATE_ROOT", kInStep);
  if (const auto* d = find(env, "DLTRAIN_SLURM_LEADER_STATE_DIR")) p.leader_state_dir = *d;
  if (const auto* d = find(env, "DLTRAIN_SLURM_DRAIN_POLL")) {
    auto s = parse_integer(*d);
    if (!s || *s < 0) throw LaunchError("DLTRAIN_SLURM_DRAIN_POLL: expected seconds as an integer, got \"" + *d + "\"");
    p.drain_poll = std::chrono::seconds(*s);
  }
  if (const auto* l = find(env, "DLTRAIN_SLURM_AGENT_LOG_LEVEL")) p.agent_log_level = *l;
  return p;
}

std::string agent_config_toml(const LaunchPlan& plan, const NodeGrant& g, const std::string& state_dir) {
  auto it = plan.addresses.find(g.node);
  if (it == plan.addresses.end()) {
    throw LaunchError("node " + g.node + " is not among the launcher's nodes (DLTRAIN_SLURM_ADDRESSES)");
  }
  const bool leader = g.node == plan.leader_node;
  std::ostringstream t;
  t << "# Written by dltrain slurm agent for Slurm job " << plan.job_id << " on node " << g.node << ".\n";
  t << "name = " << toml_string(g.node) << "\n";
  t << "leader = " << (leader ? "true" : "false") << "\n";
  if (leader) {
    t << "listen_address = " << toml_string(it->second) << "\n";
    t << "listen_port = " << plan.port << "\n";
    t << "host_tasks = true\n";
    t << "client_token_file = " << toml_string(state_dir + "/client.token") << "\n";
  } else {
    t << "leader_url = " << toml_string(plan.leader_url()) << "\n";
  }
  t << "advertise_address = " << toml_string(it->second) << "\n";
  t << "task_bind_address = " << toml_string(it->second) << "\n";
  t << "cores = " << g.cpus << "\n";
  if (g.memory_mb > 0) t << "memory_mb = " << g.memory_mb << "\n";
  if (g.gpus.empty()) {
    t << "gpus = \"none\"\n";
  } else {
    t << "gpus = [";
    for (std::size_t i = 0; i < g.gpus.size(); ++i) t << (i ? ", " : "") << g.gpus[i];
    t << "]\n";
  }
  const std::string leader_dir = leader && !plan.leader_state_dir.empty() ? plan.leader_state_dir : state_dir;
  t << "state_dir = " << toml_string(leader_dir) << "\n";
  t << "agent_token_file = " << toml_string(state_dir + "/agent.token") << "\n";
  // Within Slurm's KillWait (30 s by default) between its SIGTERM and its SIGKILL.
  t << "task_stop_grace = \"10s\"\n";
  t << "metrics_address = \"127.0.0.1\"\n";
  t << "metrics_port = 0\n";
  t << "log_level = " << toml_string(plan.agent_log_level) << "\n";
  return t.str();
}

void check_job_fits(const JobSpec& spec, const std::vector<AgentOffer>& agents, const std::string& job_file) {
  int cores = 0, max_cores = 0, gpus = 0, max_gpus = 0;
  std::string offers;
  for (const auto& a : agents) {
    cores += a.cores;
    gpus += a.gpus;
    max_cores = std::max(max_cores, a.cores);
    max_gpus = std::max(max_gpus, a.gpus);
    offers += (offers.empty() ? "" : ", ") + a.name + " " + std::to_string(a.cores) +
              (a.gpus > 0 ? " + " + plural(a.gpus, "GPU", "GPUs") : "");
  }
  const std::string granted = fmt::format("the allocation's {} offer{} {} in all ({})",
                                          plural(static_cast<int>(agents.size()), "agent", "agents"),
                                          agents.size() == 1 ? "s" : "", plural(cores, "core", "cores"), offers);
  const int workers = spec.workers_auto ? 1 : spec.workers;
  const int need = (workers + spec.ps_shards) * spec.threads_per_task;
  const std::string what = fmt::format("({}{} + {}) × {}", spec.workers_auto ? "at least " : "",
                                       plural(workers, "worker", "workers"), plural(spec.ps_shards, "PS shard", "PS shards"),
                                       plural(spec.threads_per_task, "thread", "threads"));
  if (need > cores) {
    throw LaunchError(fmt::format("{}: the job needs {} ({}), but {}: ask Slurm for more (sbatch -N, --cpus-per-task or "
                                  "--exclusive) or lower workers, ps_shards or threads_per_task",
                                  job_file, plural(need, "core", "cores"), what, granted));
  }
  if (spec.threads_per_task > max_cores) {
    throw LaunchError(fmt::format("{}: each task needs threads_per_task = {} cores on one node, but no node has more than {} "
                                  "({}): ask Slurm for more cores per node (--cpus-per-task, --exclusive) or lower "
                                  "threads_per_task",
                                  job_file, spec.threads_per_task, max_cores, offers));
  }
  // The leader places whole tasks: a node of c cores holds floor(c / threads_per_task) of
  // them (leader/placement.cpp), so the total of cores is not enough.
  int slots = 0;
  std::string per_node;
  for (const auto& a : agents) {
    const int n = a.cores / spec.threads_per_task;
    slots += n;
    per_node += fmt::format("{}{} {}", per_node.empty() ? "" : ", ", a.name, n);
  }
  const int tasks = workers + spec.ps_shards;
  if (tasks > slots) {
    throw LaunchError(fmt::format("{}: the job's {} tasks ({}{} + {}) take threads_per_task = {} cores each on one node, "
                                  "but the nodes hold only {} such tasks ({}): ask Slurm for more cores per node "
                                  "(--cpus-per-task, --exclusive) or more nodes, or lower workers, ps_shards or "
                                  "threads_per_task",
                                  job_file, tasks, spec.workers_auto ? "at least " : "",
                                  plural(workers, "worker", "workers"), plural(spec.ps_shards, "PS shard", "PS shards"),
                                  spec.threads_per_task, slots, per_node));
  }
  if (spec.device == Device::kCuda) {
    const int per = std::max(1, spec.gpus_per_worker);
    const int need_gpus = workers * per;
    if (need_gpus > gpus) {
      throw LaunchError(fmt::format("{}: the job needs {} ({} × {} per worker), but the allocation's agents offer {} "
                                    "({}): ask Slurm for GPUs (sbatch --gres=gpu:N or --gpus-per-node) or lower workers",
                                    job_file, plural(need_gpus, "GPU", "GPUs"), plural(workers, "worker", "workers"), per,
                                    plural(gpus, "GPU", "GPUs"), offers));
    }
    if (per > max_gpus) {
      throw LaunchError(fmt::format("{}: each worker needs gpus_per_worker = {} GPUs on one node, but no node has more "
                                    "than {} ({})",
                                    job_file, per, max_gpus, offers));
    }
    int gpu_slots = 0;
    for (const auto& a : agents) gpu_slots += a.gpus / per;
    if (workers > gpu_slots) {
      throw LaunchError(fmt::format("{}: the job's {} take gpus_per_worker = {} GPUs each on one node, but the nodes hold "
                                    "only {} such workers ({}): ask Slurm for more GPUs per node or lower workers or "
                                    "gpus_per_worker",
                                    job_file, plural(workers, "worker", "workers"), per, gpu_slots, offers));
    }
  }
}

}  // namespace dltrain::launch
