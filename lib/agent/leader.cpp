#include "agent/leader.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/secret.h"
#include "control/server.h"
#include "planner/planner.h"
#include "store/store.h"
#include "wire/control.h"

namespace dltrain::agent {

namespace asio = boost::asio;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using control::PeerKind;
using control::Session;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct AgentRec {
  std::string id;
  std::string address;
  int cores = 0;
  int free_cores = 0;
  std::int64_t memory_mb = 0;
  std::string hardware_class;
  std::weak_ptr<Session> session;
  Clock::time_point last_seen;
  bool lost = false;
  bool stopping = false;  // its tasks ended because it shuts down: place nothing there
  std::map<std::string, int> orphans;  // "job/task/generation" still running there after a loss → cores
};

struct TaskRec {
  std::string name;        // "ps-0", "worker-1"
  std::string kind;        // "ps" | "worker"
  int index = 0;           // shard or rank
  std::string agent;
  std::string state = "pending";  // pending | starting | running | exited
  int port = 0;
  std::string address;
  std::string last_error;
  std::string exit;        // ExitStatus::describe()
  bool ok_exit = false;
  int restarts = 0;
  std::string recovery;    // PS shard: how its last restart recovered its state
  int resyncs = 0;         // worker: times it reconnected to restarted PS shards
  int epochs_done = 0;     // worker: epochs it finished (from its epoch_end events)
  json replica;            // worker: what its "stopped" event said of its saved replica
  std::uint32_t replica_generation = 0;  // the generation whose task directory holds it
  bool restored = false;   // PS shard: loaded a checkpoint when it started
};

// The stored form of a task (a restarted leader adopts the tasks its agents re-report).
json task_record(const TaskRec& t) {
  json r{{"name", t.name},     {"kind", t.kind},         {"index", t.index},   {"agent", t.agent},
         {"state", t.state},   {"port", t.port},         {"address", t.address}, {"exit", t.exit},
         {"ok_exit", t.ok_exit}, {"restarts", t.restarts}, {"epochs_done", t.epochs_done},
         {"recovery", t.recovery}, {"resyncs", t.resyncs}, {"last_error", t.last_error}};
  if (!t.replica.is_null()) {
    r["replica"] = t.replica;
    r["replica_generation"] = t.replica_generation;
  }
  return r;
}

TaskRec task_from_record(const json& r) {
  TaskRec t;
  t.name = r.at("name").get<std::string>();
  t.kind = r.at("kind").get<std::string>();
  t.index = r.at("index").get<int>();
  t.agent = r.at("agent").get<std::string>();
  t.state = r.value("state", "exited");
  t.port = r.value("port", 0);
  t.address = r.value("address", "");
  t.exit = r.value("exit", "");
  t.ok_exit = r.value("ok_exit", false);
  t.restarts = r.value("restarts", 0);
  t.epochs_done = r.value("epochs_done", 0);
  t.recovery = r.value("recovery", "");
  t.resyncs = r.value("resyncs", 0);
  t.last_error = r.value("last_error", "");
  if (r.contains("replica")) t.replica = r["replica"];
  t.replica_generation = r.value("replica_generation", 0u);
  return t;
}

struct JobRec {
  std::string id;
  std::uint64_t num = 0;
  JobSpec spec;
  std::string state = "queued";
  std::uint32_t generation = 1;
  // Hex of the job's random secret (common/secret.h): its tasks prove it to each other on
  // the data plane. Sent to agents in start_task and kept in the store while the job
  // lives; never in a reply, an event or a log line.
  std::string secret;
  Clock::time_point submitted;
  double submitted_unix = 0;
  std::optional<Clock::time_point> ended;
  std::vector<TaskRec> tasks;
  double test_accuracy = -1;
  int epochs_done = 0;
  std::map<int, std::uint64_t> pushed, pulled;  // each worker's count in this generation
  std::uint64_t pushed_before = 0, pulled_before = 0;  // earlier generations' and leaders' counts
  std::map<int, double> images_per_sec;
  std::map<int, double> epoch_seconds;  // each worker's latest epoch time
  std::map<int, json> traffic, traffic_after_warmup;  // from each worker's "done" event
  std::map<int, double> profile_ips;                   // exploration runs: per worker
  double fixed_wall = -1;                              // restored jobs: wall time when they ended
  double last_bytes = 0;                               // bytes at the previous epoch observation
  json plan;                                           // the planner's decision, when auto
  std::string profile_of;                              // exploration run of this job
  std::vector<std::string> pending_profiles;           // this job waits for these runs
  double exploration_seconds = 0;
  std::string error;
  std::string failing_state;  // the terminal state to enter once every task exited
  std::vector<std::weak_ptr<Session>> followers;
  // Re-assignment (state recovering): why, since when, how often so far.
  int reassignments = 0;
  std::string recovery_reason;
  std::optional<Clock::time_point> recovering_since;
  bool waiting_logged = false;
  bool workers_started = false;  // some generation of this job trained (its PS state matters)
  // After a re-assignment: the worker whose saved replica (of generation seed_generation)
  // initialises the new shards; the other workers start once it has.
  std::string seed;
  std::uint32_t seed_generation = 0;
  // A job a restarted leader restored while running: until this time (or until every
  // agent its tasks are on has registered again) the leader waits for its agents.
  std::optional<Clock::time_point> adopt_until;
  std::string adopt_lost;  // tasks its agents no longer had when they came back

  bool terminal() const { return state == "succeeded" || state == "failed" || state == "cancelled"; }
  double wall_seconds() const {
    if (fixed_wall >= 0) return fixed_wall;
    return std::chrono::duration<double>((ended ? *ended : Clock::now()) - submitted).count();
  }
  std::uint64_t sum(const std::map<int, std::uint64_t>& m) const {
    std::uint64_t s = 0;
    for (auto& [k, v] : m) s += v;
    return s;
  }
  std::uint64_t bytes_pushed() const { return pushed_before + sum(pushed); }
  std::uint64_t bytes_pulled() const { return pulled_before + sum(pulled); }
};

}  // namespace

struct Leader::Impl : std::enable_shared_from_this<Leader::Impl> {
  asio::io_context& io;
  AgentOptions opt;
  std::unique_ptr<control::ControlServer> server;
  asio::steady_timer hb_timer;
  std::map<std::string, AgentRec> agents;
  std::map<std::uint64_t, std::string> agent_by_session;
  std::map<std::string, JobRec> jobs;
  std::vector<std::string> job_order;
  std::deque<std::string> queue;
  std::uint64_t next_job = 1;
  std::uint64_t next_req = 1;
  std::function<void()>* on_registered = nullptr;
  std::unique_ptr<store::Store> db;

  Impl(asio::io_context& i, const AgentOptions& o) : io(i), opt(o), hb_timer(i) {}

  // ---------------------------------------------------------------- persistence
  // A store failure is logged and the leader carries on serving from memory: losing a
  // history row must not stop running jobs.
  template <typename F>
  void persist(const char* what, F&& f) {
    if (!db) return;
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::error("store: {} failed: {}", what, e.what());
    }
  }

  // The stored form of a job: what clients see plus what a restarted leader needs. The
  // secret is dropped once the job has ended (nobody needs it any more).
  json record(const JobRec& j) const {
    json r = job_json(j);
    r["spec"] = j.spec;
    r["num"] = j.num;
    r["generation"] = j.generation;
    if (!j.terminal() && !j.secret.empty()) r["secret"] = j.secret;
    if (!j.profile_of.empty()) r["profile_of"] = j.profile_of;
    if (!j.terminal()) {
      json tasks = json::array();
      for (const auto& t : j.tasks) tasks.push_back(task_record(t));
      r["task_records"] = tasks;
      r["failing_state"] = j.failing_state;
      r["workers_started"] = j.workers_started;
      r["recovery_reason"] = j.recovery_reason;
      r["seed"] = j.seed;
      r["seed_generation"] = j.seed_generation;
      // Byte counts: earlier generations' totals, and each worker's cumulative count in
      // this one (what its next events continue from).
      r["bytes_before"] = {{"pushed", j.pushed_before}, {"pulled", j.pulled_before}};
      r["last_bytes"] = j.last_bytes;
      json by_rank = json::object();
      for (auto& [rank, v] : j.pushed) by_rank[std::to_string(rank)] = {v, j.pulled.count(rank) ? j.pulled.at(rank) : 0};
      r["bytes_by_rank"] = by_rank;
    }
    return r;
  }

  void save(const JobRec& j) {
    persist("saving a job", [&] { db->put_job(j.num, record(j)); });
  }

  void event(const JobRec& j, const json& ev) {
    persist("appending an event", [&] {
      json e = ev;
      e["time"] = unix_now();
      db->append_event(j.num, e);
    });
  }

  // Restores jobs and the job counter after a restart. Unfinished jobs carry on: queued
  // ones wait in the queue again; a job with tasks adopts the tasks its agents re-report
  // when they register again (on_register), for up to adoption_window(); what does not
  // come back by then is treated as lost with its agent (after_adoption).
  void restore() {
    if (!db) return;
    for (auto& [num, r] : db->jobs()) {
      JobRec j;
      j.num = num;
      j.id = "job-" + std::to_string(num);
      try {
        j.spec = job_from_json(r.at("spec"));
      } catch (const std::exception& e) {
        spdlog::error("store: job {} has an unreadable specification ({}); skipped", j.id, e.what());
        continue;
      }
      j.state = r.value("state", "failed");
      j.test_accuracy = r["test_accuracy"].is_number() ? r["test_accuracy"].get<double>() : -1.0;
      j.epochs_done = r.value("epochs", 0);
      j.submitted_unix = r.value("submitted_at", 0.0);
      j.fixed_wall = r.value("wall_seconds", 0.0);
      j.error = r.value("error", "");
      j.profile_of = r.value("profile_of", "");
      // Both absent from records written before jobs had secrets.
      j.generation = r.value("generation", 1u);
      j.secret = r.value("secret", "");
      if (r.contains("plan")) j.plan = r["plan"];
      j.pushed_before = r.value("bytes_pushed", std::uint64_t{0});
      j.pulled_before = r.value("bytes_pulled", std::uint64_t{0});
      if (!j.terminal()) {
        try {
          resume_after_restart(j, r);
        } catch (const std::exception& e) {
          j.error = "the leader restarted and could not read this job's stored state (" + std::string(e.what()) + ")";
          j.state = "failed";
          j.tasks.clear();
          save(j);
        }
      }
      next_job = std::max(next_job, num + 1);
      job_order.push_back(j.id);
      jobs.emplace(j.id, std::move(j));
    }
    if (auto n = db->get_meta("next_job")) next_job = std::max<std::uint64_t>(next_job, std::stoull(*n));
    // An exploring job waits for its exploration runs that are still unfinished.
    for (auto& id : job_order) {
      auto& j = jobs.at(id);
      if (j.profile_of.empty() || j.terminal()) continue;
      auto pit = jobs.find(j.profile_of);
      if (pit != jobs.end() && pit->second.state == "exploring") pit->second.pending_profiles.push_back(id);
    }
    for (auto& id : job_order) {
      auto& j = jobs.at(id);
      if (j.state == "exploring" && j.pending_profiles.empty()) {
        j.failing_state = "failed";
        j.error = "the leader restarted while the job was exploring and its exploration runs are gone; submit it again";
        maybe_finish(j);
      }
    }
    spdlog::info("store {}: {} jobs and {} history rows restored", db->path(), jobs.size(), db->history().size());
  }

  // How long a restarted leader waits for the agents of a running job to register again:
  // an agent notices the lost link within a heartbeat timeout and retries with back-off
  // of at most 10 s (agent.h).
  std::chrono::milliseconds adoption_window() const {
    return opt.heartbeat_timeout + std::chrono::milliseconds(15000);
  }

  // The restored form of an unfinished job (called by restore()).
  void resume_after_restart(JobRec& j, const json& r) {
    j.fixed_wall = -1;
    j.submitted = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, unix_now() - j.submitted_unix)));
    j.failing_state = r.value("failing_state", "");
    j.workers_started = r.value("workers_started", false);
    j.recovery_reason = r.value("recovery_reason", "");
    j.seed = r.value("seed", "");
    j.seed_generation = r.value("seed_generation", 0u);
    j.reassignments = r.value("reassignments", 0);
    if (r.contains("bytes_before")) {
      j.pushed_before = r["bytes_before"].value("pushed", std::uint64_t{0});
      j.pulled_before = r["bytes_before"].value("pulled", std::uint64_t{0});
      j.last_bytes = r.value("last_bytes", 0.0);
      const json by_rank = r.value("bytes_by_rank", json::object());
      for (auto& [rank, v] : by_rank.items()) {
        j.pushed[std::stoi(rank)] = v.at(0).get<std::uint64_t>();
        j.pulled[std::stoi(rank)] = v.at(1).get<std::uint64_t>();
      }
    }
    if (r.contains("task_records")) {
      for (const auto& tr : r["task_records"]) j.tasks.push_back(task_from_record(tr));
    }
    // Tasks hold cores again only when their agent re-reports them; one the leader had
    // not started yet never will be in this form.
    for (auto& t : j.tasks) {
      if (t.state == "pending") {
        t.state = "exited";
        t.exit = "never started";
      }
    }
    if (j.state == "queued" || j.state == "planning") {
      j.state = "queued";
      queue.push_back(j.id);
      spdlog::info("job {} ({}) is queued again", j.id, j.spec.name);
    } else if (j.state != "exploring") {
      j.adopt_until = Clock::now() + adoption_window();
      spdlog::info("job {} ({}) was {} (generation {}): waiting up to {} ms for its agents to re-report its tasks",
                   j.id, j.spec.name, j.state, j.generation, adoption_window().count());
      event(j, {{"event", "leader_restarted"}, {"state", j.state}, {"generation", j.generation}});
    }
  }

  // ---------------------------------------------------------------- planning
  std::string hardware_class() const {
    for (auto& [id, a] : agents) {
      if (!a.lost) return a.hardware_class;
    }
    return "cpu";
  }

  planner::Plan plan_for(const JobSpec& spec, double exploration_seconds) const {
    planner::PlanRequest req;
    req.model = spec.model;
    req.dataset = spec.dataset;
    req.hardware_class = hardware_class();
    req.ps_shards = spec.ps_shards;
    req.epochs = spec.epochs;
    req.train_examples = static_cast<std::int64_t>(train_examples(spec));
    req.target_accuracy = spec.target_accuracy;
    req.deadline_seconds = spec.deadline_seconds;
    req.exploration_seconds = exploration_seconds;
    req.switch_threshold = opt.switch_threshold;
    req.margin_sigmas = opt.margin_sigmas;
    const auto price = opt.prices.find(req.hardware_class);
    req.price_per_task_hour = spec.price_per_task_hour > 0 ? spec.price_per_task_hour
                              : price != opt.prices.end() ? price->second
                                                          : 1.0;
    int task_slots = 0;
    for (auto& [id, a] : agents) {
      if (agent_live(id)) task_slots += a.cores / spec.threads_per_task;
    }
    int wmax = task_slots - spec.ps_shards;
    if (spec.max_workers > 0) wmax = std::min(wmax, spec.max_workers);
    if (spec.workers_auto) {
      for (int w = 1; w <= wmax; ++w) req.worker_options.push_back(w);
    } else if (spec.workers <= wmax) {
      req.worker_options.push_back(spec.workers);
    }
    if (spec.batch_auto) {
      req.batch_options = spec.batch_sizes;
    } else {
      req.batch_options.push_back(spec.batch_size);
    }
    std::vector<store::Observation> history;
    if (db) {
      for (auto& o : db->history(spec.model, spec.dataset)) {
        if (o.compression == compress::to_string(spec.compression.method)) history.push_back(std::move(o));
      }
      if (auto prev = db->get_meta("plan/" + spec.model + "/" + spec.dataset)) {
        try {
          auto pj = json::parse(*prev);
          req.previous = planner::Config{pj.at("workers").get<int>(), pj.at("batch_size").get<int>()};
        } catch (const std::exception&) {
        }
      }
    }
    return planner::make_plan(req, history);
  }

  // Applies a feasible plan to an auto job and queues it; fails it otherwise.
  void decide(JobRec& j) {
    const auto p = plan_for(j.spec, j.exploration_seconds);
    j.plan = planner::to_json(p);
    if (!p.feasible) {
      j.failing_state = "failed";
      j.error = "planner: " + p.explanation;
      maybe_finish(j);
      return;
    }
    j.spec.workers = p.choice.workers;
    j.spec.batch_size = p.choice.batch_size;
    persist("saving the plan", [&] {
      db->put_meta("plan/" + j.spec.model + "/" + j.spec.dataset,
                   json{{"workers", p.choice.workers}, {"batch_size", p.choice.batch_size}}.dump());
    });
    spdlog::info("job {}: planner chose {} workers x batch {}: {}", j.id, p.choice.workers, p.choice.batch_size,
                 p.explanation);
    notify(j, {{"event", "plan"}, {"plan", j.plan}});
    set_state(j, "queued");
    queue.push_back(j.id);
  }

  // Starts one exploration run per configuration the planner asked to profile.
  void explore(JobRec& parent, const std::vector<planner::Config>& configs) {
    set_state(parent, "exploring");
    for (const auto& c : configs) {
      JobRec p;
      p.num = next_job++;
      p.id = "job-" + std::to_string(p.num);
      p.spec = parent.spec;
      p.spec.name = "profile " + std::to_string(c.workers) + "x" + std::to_string(c.batch_size) + " for " + parent.id;
      p.spec.workers = c.workers;
      p.spec.batch_size = c.batch_size;
      p.spec.workers_auto = p.spec.batch_auto = false;
      p.spec.epochs = 1;
      p.spec.max_steps = opt.explore_steps;
      p.spec.profile = true;
      p.spec.optimizer.warmup_epochs = 0;
      p.spec.compression.warmup_epochs = 0;
      p.submitted = Clock::now();
      p.submitted_unix = unix_now();
      p.secret = new_job_secret_hex();
      p.profile_of = parent.id;
      parent.pending_profiles.push_back(p.id);
      const std::string id = p.id;
      jobs.emplace(id, std::move(p));
      job_order.push_back(id);
      queue.push_back(id);
      save(jobs.at(id));
      spdlog::info("job {}: exploring {} workers x batch {} as {}", parent.id, c.workers, c.batch_size, id);
    }
    persist("saving the job counter", [&] { db->put_meta("next_job", std::to_string(next_job)); });
  }

  // Training images per epoch (all workers together); the IDX datasets have 60,000.
  static double train_examples(const JobSpec& spec) {
    return spec.train_samples > 0 ? static_cast<double>(spec.train_samples) : 60000.0;
  }

  // The fields every history row of job `j` shares.
  store::Observation observation(const JobRec& j) const {
    store::Observation o;
    o.model = j.spec.model;
    o.dataset = j.spec.dataset;
    o.hardware_class = hardware_class();
    o.job = j.id;
    o.workers = j.spec.workers;
    o.ps_shards = j.spec.ps_shards;
    o.batch_size = j.spec.batch_size;
    o.timestamp = unix_now();
    o.compression = compress::to_string(j.spec.compression.method);
    return o;
  }

  void record_epoch(JobRec& j, const json& ev) {
    if (!db || j.spec.profile) return;
    store::Observation o = observation(j);
    o.epoch = ev.value("epoch", 0);
    // The job's epoch time is its slowest worker's latest epoch; its throughput is the
    // training set over that (the quantity the planner predicts).
    for (auto& [r, v] : j.epoch_seconds) o.epoch_seconds = std::max(o.epoch_seconds, v);
    o.images_per_sec = o.epoch_seconds > 0 ? train_examples(j.spec) / o.epoch_seconds : 0.0;
    const double bytes = static_cast<double>(j.bytes_pushed() + j.bytes_pulled());
    o.bytes_per_epoch = bytes - j.last_bytes;
    j.last_bytes = bytes;
    persist("recording an observation", [&] { db->add_observation(o); });
  }

  void record_final(JobRec& j) {
    if (!db) return;
    store::Observation o = observation(j);
    if (j.spec.profile) {
      for (auto& [r, v] : j.profile_ips) o.images_per_sec += v;
      if (o.images_per_sec <= 0) return;
      o.epoch_seconds = train_examples(j.spec) / o.images_per_sec;
      o.epoch = 0;
      o.source = "profile";
    } else {
      o.final_accuracy = j.test_accuracy;
      o.epoch = j.epochs_done;
      o.epoch_seconds = j.epochs_done > 0 ? j.wall_seconds() / j.epochs_done : 0;
      for (auto& [r, v] : j.images_per_sec) o.images_per_sec += v;
      o.bytes_per_epoch = j.epochs_done > 0 ? static_cast<double>(j.bytes_pushed() + j.bytes_pulled()) / j.epochs_done : 0;
    }
    persist("recording an observation", [&] { db->add_observation(o); });
  }

  // ---------------------------------------------------------------- helpers
  static void reply(const std::shared_ptr<Session>& s, const std::string& id, const json& body) {
    s->send(wire::make_reply(id, body));
  }
  static void reply_error(const std::shared_ptr<Session>& s, const std::string& id, const std::string& code,
                          const std::string& msg, const std::string& field = "") {
    s->send(wire::make_error(id, code, msg, field));
  }

  void send_agent(const std::string& agent_id, const std::string& type, const json& body) {
    auto it = agents.find(agent_id);
    if (it == agents.end()) return;
    if (auto s = it->second.session.lock()) s->send(wire::make_request("l" + std::to_string(next_req++), type, body));
  }

  void notify(JobRec& job, json body) {
    body["job"] = job.id;
    const std::string text = wire::make_event(body);
    auto& f = job.followers;
    f.erase(std::remove_if(f.begin(), f.end(), [](auto& w) { return w.expired(); }), f.end());
    for (auto& w : f) {
      if (auto s = w.lock()) s->send(text);
    }
  }

  json summary(const JobRec& j) const {
    double ips = 0;
    for (auto& [r, v] : j.images_per_sec) ips += v;
    json s{{"event", "summary"},
           {"job", j.id},
           {"name", j.spec.name},
           {"state", j.state},
           {"test_accuracy", j.test_accuracy >= 0 ? json(j.test_accuracy) : json(nullptr)},
           {"epochs", j.epochs_done},
           {"wall_seconds", j.wall_seconds()},
           {"bytes_pushed", j.bytes_pushed()},
           {"bytes_pulled", j.bytes_pulled()},
           {"images_per_sec", ips}};
    s["compression"] = compress::to_string(j.spec.compression.method);
    // Achieved compression: bytes a dense exchange would have cost ÷ bytes sent,
    // counted at the workers' sockets with headers, over the run and after warm-up.
    auto ratios = [&](const std::map<int, json>& m, const std::string& suffix) {
      double up = 0, down = 0, dup = 0, ddown = 0;
      for (auto& [r, t] : m) {
        up += t.value("up", 0.0);
        down += t.value("down", 0.0);
        dup += t.value("dense_up", 0.0);
        ddown += t.value("dense_down", 0.0);
      }
      auto q = [](double a, double b) { return b > 0 ? json(a / b) : json(nullptr); };
      s["compression_ratio" + suffix] = q(dup + ddown, up + down);
      s["compression_ratio_up" + suffix] = q(dup, up);
      s["compression_ratio_down" + suffix] = q(ddown, down);
    };
    if (!j.traffic.empty()) {
      ratios(j.traffic, "");
      ratios(j.traffic_after_warmup, "_after_warmup");
    }
    if (!j.error.empty()) s["error"] = j.error;
    return s;
  }

  json job_json(const JobRec& j) const {
    json tasks = json::array();
    for (const auto& t : j.tasks) {
      json tj{{"task", t.name}, {"agent", t.agent}, {"state", t.state}};
      if (t.port) tj["endpoint"] = t.address + ":" + std::to_string(t.port);
      if (!t.exit.empty()) tj["exit"] = t.exit;
      if (!t.last_error.empty()) tj["error"] = t.last_error;
      if (t.restarts > 0) tj["restarts"] = t.restarts;
      if (!t.recovery.empty()) tj["recovery"] = t.recovery;
      if (t.resyncs > 0) tj["resyncs"] = t.resyncs;
      tasks.push_back(tj);
    }
    json out = summary(j);
    out.erase("event");
    out["model"] = j.spec.model;
    out["dataset"] = j.spec.dataset;
    out["workers"] = j.spec.workers;
    out["ps_shards"] = j.spec.ps_shards;
    out["batch_size"] = j.spec.batch_size;
    out["epochs_total"] = j.spec.epochs;
    out["compression_settings"] = {{"method", compress::to_string(j.spec.compression.method)},
                                   {"ratio", j.spec.compression.ratio},
                                   {"downlink_ratio", j.spec.compression.downlink_ratio},
                                   {"warmup_epochs", j.spec.compression.warmup_epochs}};
    out["submitted_at"] = j.submitted_unix;
    out["generation"] = j.generation;
    out["reassignments"] = j.reassignments;
    if (!j.recovery_reason.empty()) out["recovery_reason"] = j.recovery_reason;
    out["tasks"] = tasks;
    if (!j.plan.is_null()) out["plan"] = j.plan;
    if (!j.profile_of.empty()) out["profile_of"] = j.profile_of;
    if (!j.pending_profiles.empty()) out["exploring_with"] = j.pending_profiles;
    if (j.state == "queued") {
      const auto pos = std::find(queue.begin(), queue.end(), j.id) - queue.begin();
      out["queue_position"] = pos + 1;
      out["cores_needed"] = (j.spec.workers + j.spec.ps_shards) * j.spec.threads_per_task;
      out["cores_free"] = free_cores();
      out["fits_cluster"] = fits_cluster(j);
    }
    return out;
  }

  int free_cores() const {
    int n = 0;
    for (auto& [id, a] : agents) {
      if (agent_live(id)) n += a.free_cores;
    }
    return n;
  }

  void set_state(JobRec& j, const std::string& state) {
    if (j.state == state) return;
    spdlog::info("job {} ({}): {} -> {}", j.id, j.spec.name, j.state, state);
    j.state = state;
    notify(j, {{"event", "state"}, {"state", state}});
    event(j, {{"event", "state"}, {"state", state}});
    save(j);
  }

  // ---------------------------------------------------------------- scheduling
  // Greedy placement of every task of `j` on the agent with the most free cores.
  std::optional<std::vector<std::string>> place(const JobRec& j) const {
    std::map<std::string, int> free;
    for (auto& [id, a] : agents) {
      if (agent_live(id)) free[id] = a.free_cores;
    }
    std::vector<std::string> out;
    const int need = j.spec.threads_per_task;
    for (int t = 0; t < j.spec.ps_shards + j.spec.workers; ++t) {
      std::string best;
      int best_free = -1;
      for (auto& [id, f] : free) {
        if (f >= need && f > best_free) {
          best = id;
          best_free = f;
        }
      }
      if (best.empty()) return std::nullopt;
      free[best] -= need;
      out.push_back(best);
    }
    return out;
  }

  // Could `j` be placed if every live agent were idle?
  bool fits_cluster(const JobRec& j) const {
    int slots = 0;
    for (auto& [id, a] : agents) {
      if (agent_live(id)) slots += a.cores / j.spec.threads_per_task;
    }
    return slots >= j.spec.ps_shards + j.spec.workers;
  }

  // FIFO: the first job that fits the free cores starts; a job that fits the cluster
  // but not its free cores blocks everyone behind it (no overtaking). A job that cannot
  // fit even an idle cluster waits without blocking others (agents may still join).
  void try_schedule() {
    // A job being re-assigned goes first: the cores its stopped tasks freed are its own.
    for (auto& [id, j] : jobs) {
      if (j.state == "recovering") return;
    }
    for (auto it = queue.begin(); it != queue.end();) {
      auto& j = jobs.at(*it);
      if (!fits_cluster(j)) {
        ++it;
        continue;
      }
      auto placement = place(j);
      if (!placement) return;
      it = queue.erase(it);
      launch(j, *placement);
    }
  }

  void launch(JobRec& j, const std::vector<std::string>& placement) {
    j.tasks.clear();
    std::size_t k = 0;
    auto add = [&](const std::string& kind, int index) {
      TaskRec t;
      t.name = kind + "-" + std::to_string(index);
      t.kind = kind;
      t.index = index;
      t.agent = placement[k++];
      j.tasks.push_back(t);
    };
    for (int s = 0; s < j.spec.ps_shards; ++s) add("ps", s);
    for (int r = 0; r < j.spec.workers; ++r) add("worker", r);
    for (auto& t : j.tasks) agents.at(t.agent).free_cores -= j.spec.threads_per_task;
    set_state(j, "starting");
    for (auto& t : j.tasks) {
      if (t.kind == "ps") start_task(j, t, json::array());
    }
  }

  // `extra`: fields a re-assigned job's tasks need (restore_generation, workers_done,
  // init_replica_generation, resume_epoch; see Agent::Impl::start_task).
  void start_task(JobRec& j, TaskRec& t, const json& ps_endpoints, const json& extra = json::object()) {
    t.state = "starting";
    json body{{"job", j.id},
              {"job_num", j.num},
              {"task", t.name},
              {"kind", t.kind},
              {"index", t.index},
              {"generation", j.generation},
              {"secret", j.secret},
              {"threads", j.spec.threads_per_task},
              {"spec", j.spec}};
    if (t.kind == "worker") body["ps"] = ps_endpoints;
    for (auto& [k, v] : extra.items()) body[k] = v;
    spdlog::info("job {}: starting {} on agent {} (generation {})", j.id, t.name, t.agent, j.generation);
    send_agent(t.agent, "start_task", body);
    save(j);
  }

  json ps_endpoints(const JobRec& j) const {
    json eps = json::array();
    for (auto& t : j.tasks) {
      if (t.kind == "ps") eps.push_back(t.address + ":" + std::to_string(t.port));
    }
    return eps;
  }

  void start_worker(JobRec& j, TaskRec& t) {
    json extra = json::object();
    if (t.epochs_done > 0) extra["resume_epoch"] = t.epochs_done;
    if (t.name == j.seed) extra["init_replica_generation"] = j.seed_generation;
    start_task(j, t, ps_endpoints(j), extra);
  }

  // Every PS shard listens: start the workers. After a re-assignment, a shard that did
  // not restore its own checkpoint is rebuilt from the freshest replica: its worker (the
  // seed) starts first and initialises it; the others start once it has (a shard keeps
  // the first initial values it gets).
  void start_workers(JobRec& j) {
    if (j.workers_started && j.seed.empty()) {
      for (const auto& t : j.tasks) {
        if (t.kind == "ps" && !t.restored) {
          return fail_job(j, t.name + " lost its state (" + j.recovery_reason +
                                 ") and no worker saved a replica to rebuild it from");
        }
      }
    }
    set_state(j, "running");
    for (auto& t : j.tasks) {
      if (t.kind == "worker" && t.state == "pending" && (j.seed.empty() || t.name == j.seed)) start_worker(j, t);
    }
  }

  static std::string orphan_key(const std::string& job, const std::string& task, std::uint32_t generation) {
    return job + "/" + task + "/" + std::to_string(generation);
  }

  // Does agent `id` still run an orphan of `job`'s `task` (of another generation)? The
  // agent cannot start the task again until it has ended.
  bool holds_orphan(const std::string& id, const std::string& job, const std::string& task) const {
    auto it = agents.find(id);
    if (it == agents.end()) return false;
    const std::string prefix = job + "/" + task + "/";
    auto o = it->second.orphans.lower_bound(prefix);
    return o != it->second.orphans.end() && o->first.rfind(prefix, 0) == 0;
  }

  bool agent_live(const std::string& id) const {
    auto it = agents.find(id);
    return it != agents.end() && !it->second.lost && !it->second.stopping && !it->second.session.expired();
  }

  void release_cores(const std::string& agent, int n) {
    auto it = agents.find(agent);
    if (it != agents.end()) it->second.free_cores += n;
  }

  // ---------------------------------------------------------------- re-assignment
  // Tasks of `j` were lost (already marked exited): re-assign the job, within
  // task_max_restarts re-assignments, or fail it.
  void tasks_lost(JobRec& j, const std::string& why) {
    if (j.terminal()) return;
    if (!j.failing_state.empty()) return maybe_finish(j);
    if (j.state == "recovering") return try_resume(j);
    if (j.state != "running" && j.state != "starting") return fail_job(j, why);
    if (j.reassignments >= opt.task_max_restarts) {
      return fail_job(j, why + "; the job was already re-assigned " + std::to_string(j.reassignments) +
                             " times (task_max_restarts)");
    }
    j.recovery_reason = why;
    j.recovering_since = Clock::now();
    j.waiting_logged = false;
    spdlog::warn("job {}: {}; stopping its other tasks to re-assign it as generation {}", j.id, why,
                 j.generation + 1);
    set_state(j, "recovering");
    json e{{"event", "recovering"}, {"reason", why}, {"generation", j.generation}};
    event(j, e);
    notify(j, e);
    send_stops(j);
    try_resume(j);
  }

  // Asks every task of `j` that still runs to stop (on SIGTERM a PS shard writes its
  // checkpoint, a worker its replica) and gives up the ones not started yet.
  void send_stops(JobRec& j) {
    for (auto& t : j.tasks) {
      if (t.state == "starting" || t.state == "running") {
        send_agent(t.agent, "stop_task", {{"job", j.id}, {"task", t.name}, {"generation", j.generation}});
      } else if (t.state == "pending") {
        t.state = "exited";
        t.exit = "never started";
        release_cores(t.agent, j.spec.threads_per_task);
      }
    }
  }

  // A recovering job starts again once every old task has stopped and every task that
  // must run again has a place; it waits up to opt.reassign_timeout for one.
  void try_resume(JobRec& j) {
    if (j.state != "recovering" || !j.recovering_since) return;
    const auto now = Clock::now();
    const auto stop_bound = opt.task_stop_grace + 2 * opt.heartbeat_timeout;
    for (auto& t : j.tasks) {
      if (t.state == "exited") continue;
      const bool live = agent_live(t.agent);
      if (live && now - *j.recovering_since < stop_bound) return;  // its exit is on the way
      t.state = "exited";
      t.exit = live ? "did not report that it stopped" : "lost with its agent";
      release_cores(t.agent, j.spec.threads_per_task);
    }
    // Tasks stay on their agent where it is alive; the others go to the live agent with
    // the most free cores. Workers that finished are not run again.
    const int need = j.spec.threads_per_task;
    std::map<std::string, int> free;
    for (auto& [id, a] : agents) {
      if (agent_live(id)) free[id] = a.free_cores;
    }
    std::vector<std::string> placement(j.tasks.size());
    for (std::size_t i = 0; i < j.tasks.size(); ++i) {
      auto& t = j.tasks[i];
      if (t.kind == "worker" && t.ok_exit) continue;
      auto f = free.find(t.agent);
      if (f != free.end() && f->second >= need && !holds_orphan(t.agent, j.id, t.name)) {
        placement[i] = t.agent;
        f->second -= need;
      }
    }
    std::vector<std::string> unplaced;
    for (std::size_t i = 0; i < j.tasks.size(); ++i) {
      auto& t = j.tasks[i];
      if ((t.kind == "worker" && t.ok_exit) || !placement[i].empty()) continue;
      std::string best;
      int best_free = -1;
      for (auto& [id, f] : free) {
        if (f >= need && f > best_free && !holds_orphan(id, j.id, t.name)) {
          best = id;
          best_free = f;
        }
      }
      if (best.empty()) {
        unplaced.push_back(t.name);
      } else {
        placement[i] = best;
        free[best] -= need;
      }
    }
    if (!unplaced.empty()) {
      std::string names;
      for (auto& n : unplaced) names += (names.empty() ? "" : ", ") + n;
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - *j.recovering_since);
      if (waited >= opt.reassign_timeout) {
        return fail_job(j, j.recovery_reason + "; no agent had free cores for " + names + " within " +
                               fmt::format("{:g}", opt.reassign_timeout.count() / 1000.0) +
                               " s (reassign_timeout)");
      }
      if (!j.waiting_logged) {
        j.waiting_logged = true;
        spdlog::warn("job {}: no agent has {} free cores for {}; waiting up to {} ms for one", j.id, need, names,
                     opt.reassign_timeout.count());
        json e{{"event", "waiting_for_agent"}, {"tasks", unplaced}, {"timeout_ms", opt.reassign_timeout.count()}};
        event(j, e);
        notify(j, e);
      }
      return;
    }
    resume(j, placement);
  }

  // Starts generation g+1 of a recovering job on `placement` (an agent per task; empty
  // for finished workers).
  void resume(JobRec& j, const std::vector<std::string>& placement) {
    const std::uint32_t old_gen = j.generation;
    // The freshest replica: the stopped worker (staying on its agent, where its file is)
    // whose parameters last came from the PS.
    std::string seed;
    std::uint32_t seed_generation = 0;
    double freshest = -1;
    for (std::size_t i = 0; i < j.tasks.size(); ++i) {
      const auto& t = j.tasks[i];
      if (t.kind != "worker" || placement[i] != t.agent || !t.replica.is_object() || !t.replica.contains("path")) {
        continue;
      }
      const double at = t.replica.value("pulled_at", 0.0);
      if (at > freshest) {
        freshest = at;
        seed = t.name;
        seed_generation = t.replica_generation;
      }
    }
    json moved = json::array(), done_ranks = json::array();
    std::vector<TaskRec> next;
    for (std::size_t i = 0; i < j.tasks.size(); ++i) {
      const auto& old = j.tasks[i];
      if (old.kind == "worker" && old.ok_exit) {
        next.push_back(old);
        done_ranks.push_back(old.index);
        continue;
      }
      TaskRec t;
      t.name = old.name;
      t.kind = old.kind;
      t.index = old.index;
      t.agent = placement[i];
      t.epochs_done = old.epochs_done;
      if (t.agent == old.agent) {
        // Still there: should this generation be re-assigned before the worker saves a
        // newer one, the replica it saved earlier can still rebuild a lost shard.
        t.replica = old.replica;
        t.replica_generation = old.replica_generation;
      }
      // A shard restores the checkpoint it wrote when it was stopped, where it stays.
      if (old.kind == "ps" && old.ok_exit && old.agent == t.agent) t.recovery = "checkpoint";
      if (t.agent != old.agent) moved.push_back({{"task", t.name}, {"from", old.agent}, {"to", t.agent}});
      agents.at(t.agent).free_cores -= j.spec.threads_per_task;
      next.push_back(std::move(t));
    }
    j.pushed_before += j.sum(j.pushed);
    j.pulled_before += j.sum(j.pulled);
    j.pushed.clear();
    j.pulled.clear();
    j.tasks = std::move(next);
    j.generation = old_gen + 1;
    ++j.reassignments;
    j.seed = seed;
    j.seed_generation = seed_generation;
    j.recovering_since.reset();
    spdlog::warn("job {}: re-assigned as generation {} ({}); {}", j.id, j.generation,
                 moved.empty() ? std::string("no task moved") : "moved " + moved.dump(),
                 seed.empty() ? std::string("no worker replica") : "rebuilding lost shard state from " + seed + "'s replica");
    json e{{"event", "reassigned"}, {"generation", j.generation}, {"moved", moved}, {"reason", j.recovery_reason}};
    if (!seed.empty()) e["replica_from"] = seed;
    event(j, e);
    notify(j, e);
    set_state(j, "starting");
    for (auto& t : j.tasks) {
      if (t.kind != "ps") continue;
      json extra{{"workers_done", done_ranks}};
      if (t.recovery == "checkpoint") extra["restore_generation"] = old_gen;
      t.recovery.clear();
      start_task(j, t, json::array(), extra);
    }
  }

  // A restored job's agents have registered again, or the adoption window has passed.
  void after_adoption(JobRec& j) {
    j.adopt_until.reset();
    if (j.terminal()) return;
    std::string missing = j.adopt_lost;
    j.adopt_lost.clear();
    for (auto& t : j.tasks) {
      if ((t.state == "starting" || t.state == "running") && !agent_live(t.agent)) {
        t.state = "exited";
        t.exit = "its agent did not come back after the leader restarted";
        missing += (missing.empty() ? "" : ", ") + t.name + " on " + t.agent;
      }
    }
    spdlog::info("job {}: adopted after the leader restart{}", j.id, missing.empty() ? "" : "; lost: " + missing);
    if (!j.failing_state.empty()) return stop_tasks(j);
    if (j.state == "recovering") {
      j.recovering_since = Clock::now();
      send_stops(j);
      return try_resume(j);
    }
    std::string unstarted;
    for (const auto& t : j.tasks) {
      if (t.kind == "worker" && t.state == "exited" && t.exit == "never started") unstarted += " " + t.name;
    }
    if (j.state == "starting" || !unstarted.empty()) {
      // The leader died between the shards' and the workers' start (or, after a
      // re-assignment, before every worker was started): begin again.
      return tasks_lost(j, "the leader restarted while the job was starting" +
                               (missing.empty() ? std::string() : " (lost: " + missing + ")"));
    }
    if (!missing.empty()) tasks_lost(j, "the leader restarted and " + missing + " did not come back");
  }

  // Stops every task of a job that is ending; it ends once they all have.
  void stop_tasks(JobRec& j) {
    send_stops(j);
    maybe_finish(j);
  }

  // Moves a job whose tasks have all exited into its terminal state.
  void maybe_finish(JobRec& j) {
    if (j.terminal() || j.failing_state.empty()) return;
    for (auto& t : j.tasks) {
      if (t.state != "exited") return;
    }
    j.ended = Clock::now();
    if (j.failing_state == "succeeded") record_final(j);
    set_state(j, j.failing_state);
    notify(j, summary(j));
    event(j, summary(j));
    if (!j.profile_of.empty()) {
      auto pit = jobs.find(j.profile_of);
      if (pit != jobs.end()) {
        auto& parent = pit->second;
        auto& pend = parent.pending_profiles;
        pend.erase(std::remove(pend.begin(), pend.end(), j.id), pend.end());
        parent.exploration_seconds += j.wall_seconds();
        if (pend.empty() && parent.state == "exploring") decide(parent);
      }
    }
    spdlog::info("job {} {}: test accuracy {:.4f}, {} epochs, {:.1f} s{}", j.id, j.state, j.test_accuracy,
                 j.epochs_done, j.wall_seconds(), j.error.empty() ? "" : ", error: " + j.error);
    try_schedule();
  }

  void fail_job(JobRec& j, const std::string& why) {
    if (j.terminal() || !j.failing_state.empty()) return;
    spdlog::warn("job {} failed: {}", j.id, why);
    j.error = why;
    j.failing_state = "failed";
    set_state(j, "failing");
    stop_tasks(j);
  }

  TaskRec* find_task(JobRec& j, const std::string& name) {
    for (auto& t : j.tasks) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  // ---------------------------------------------------------------- agent messages
  void on_agent_message(const std::shared_ptr<Session>& s, const wire::Envelope& env) {
    if (env.type == "reply") {
      if (!env.ok) spdlog::warn("agent {} reported an error: {}", s->peer(), env.error.dump());
      return;
    }
    if (env.type == "register") return on_register(s, env);
    auto sid = agent_by_session.find(s->id());
    if (sid == agent_by_session.end()) {
      return reply_error(s, env.id, wire::error_code::kBadRequest, "register first");
    }
    auto& agent = agents.at(sid->second);
    agent.last_seen = Clock::now();
    if (env.type == "heartbeat") return reply(s, env.id, json::object());
    if (env.type == "task_event" || env.type == "task_exit") {
      const auto job_id = env.body.value("job", "");
      // An orphan's exit (any job, known or not) gives its cores back.
      const std::string okey = orphan_key(job_id, env.body.value("task", ""), env.body.value("generation", 0u));
      if (env.type == "task_exit" && agent.orphans.count(okey)) {
        agent.free_cores += agent.orphans[okey];
        agent.orphans.erase(okey);
        spdlog::info("agent {}: orphaned task {} ended", agent.id, okey);
        reply(s, env.id, json::object());
        return try_schedule();
      }
      auto jit = jobs.find(job_id);
      if (jit == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "unknown job " + job_id, "job");
      auto& j = jit->second;
      if (env.body.value("generation", 0u) != j.generation) {
        return reply_error(s, env.id, wire::error_code::kConflict, "stale generation", "generation");
      }
      TaskRec* t = find_task(j, env.body.value("task", ""));
      if (t == nullptr || t->agent != agent.id) {
        return reply_error(s, env.id, wire::error_code::kNotFound, "unknown task", "task");
      }
      reply(s, env.id, json::object());
      if (env.type == "task_event") return on_task_event(j, *t, env.body.value("event", json::object()));
      return on_task_exit(j, *t, env.body);
    }
    reply_error(s, env.id, wire::error_code::kBadRequest, "unknown message type \"" + env.type + "\"", "type");
  }

  void on_register(const std::shared_ptr<Session>& s, const wire::Envelope& env) {
    const auto& b = env.body;
    const std::string name = b.value("name", "");
    if (name.empty()) return reply_error(s, env.id, wire::error_code::kBadRequest, "register needs a name", "name");
    const int cores = b.value("cores", 0);
    if (cores < 1) return reply_error(s, env.id, wire::error_code::kBadRequest, "cores must be >= 1", "cores");
    auto it = agents.find(name);
    if (it != agents.end() && !it->second.lost && !it->second.session.expired()) {
      return reply_error(s, env.id, wire::error_code::kConflict, "an agent named \"" + name + "\" is already registered",
                         "name");
    }
    AgentRec a;
    a.id = name;
    a.address = b.value("advertise_address", "127.0.0.1");
    a.cores = cores;
    a.free_cores = cores;
    a.memory_mb = b.value("memory_mb", std::int64_t{0});
    a.hardware_class = b.value("hardware_class", "cpu");
    a.session = s;
    a.last_seen = Clock::now();
    // Reconcile with the tasks the agent says it still runs (after a reconnect, or after
    // the leader restarted): a task the leader still counts on carries on; any other is an
    // orphan — stopped, its cores held until its exit is reported. A task listed as
    // "exited" ended while the link was down; its exit report follows. Tasks the leader
    // counted on that the agent does not list were lost with the link.
    std::set<std::string> reported;
    if (b.contains("tasks") && b["tasks"].is_array()) {
      for (const auto& rt : b["tasks"]) {
        const std::string jid = rt.value("job", ""), tname = rt.value("task", "");
        reported.insert(jid + "/" + tname);
        auto jit = jobs.find(jid);
        TaskRec* t = jit == jobs.end() ? nullptr : find_task(jit->second, tname);
        const bool live = t != nullptr && t->agent == name && t->state != "exited" &&
                          rt.value("generation", 0u) == jit->second.generation;
        const int threads = jit == jobs.end() ? 1 : jit->second.spec.threads_per_task;
        a.free_cores -= threads;
        if (!live && rt.value("exited", false)) {
          a.orphans[orphan_key(jid, tname, rt.value("generation", 0u))] = threads;  // its exit report frees the cores
        } else if (!live) {
          a.orphans[orphan_key(jid, tname, rt.value("generation", 0u))] = threads;
          s->send(wire::make_request("l" + std::to_string(next_req++), "stop_task",
                                     {{"job", jid}, {"task", tname}, {"generation", rt.value("generation", 0u)}}));
          spdlog::warn("agent {} still runs {}/{}, which the leader no longer counts on: stopping it", name, jid, tname);
        }
      }
    }
    // Tasks the leader placed there but has not started yet hold their cores too.
    for (auto& jid : job_order) {
      auto& j = jobs.at(jid);
      if (j.terminal()) continue;
      for (auto& t : j.tasks) {
        if (t.agent == name && t.state == "pending") a.free_cores -= j.spec.threads_per_task;
      }
    }
    // Tasks the leader counts on that the agent no longer has: only when a new session
    // replaced one that was never declared lost (a lost agent's tasks were already
    // accounted for by agent_lost), or for a restored job the leader is adopting.
    std::vector<std::pair<std::string, std::string>> gone;  // job, why
    for (auto& jid : job_order) {
      auto& j = jobs.at(jid);
      if (j.terminal()) continue;
      const bool adopting = j.adopt_until.has_value();
      for (auto& t : j.tasks) {
        if (t.agent == name && (t.state == "starting" || t.state == "running") && !reported.count(jid + "/" + t.name) &&
            ((it != agents.end() && !it->second.lost) || adopting)) {
          t.state = "exited";
          t.exit = "ended while its agent was disconnected";
          gone.emplace_back(jid, t.name + " on agent " + name + " " + t.exit);
        }
      }
    }
    agents[name] = a;
    agent_by_session[s->id()] = name;
    spdlog::info("agent {} registered from {} ({} cores, {} MiB, advertises {})", name, s->peer(), cores, a.memory_mb,
                 a.address);
    reply(s, env.id, {{"agent_id", name}, {"heartbeat_interval_ms", opt.heartbeat_interval.count()}});
    if (on_registered && *on_registered) (*on_registered)();
    for (auto& [jid, why] : gone) {
      auto& j = jobs.at(jid);
      if (j.adopt_until) {
        j.adopt_lost += (j.adopt_lost.empty() ? "" : "; ") + why;
      } else {
        tasks_lost(j, why);
      }
    }
    // A restored job whose agents are all back is adopted now.
    for (auto& jid : job_order) {
      auto& j = jobs.at(jid);
      if (!j.adopt_until || j.terminal()) continue;
      const bool all_back = std::all_of(j.tasks.begin(), j.tasks.end(), [&](const TaskRec& t) {
        return t.state == "exited" || agent_live(t.agent);
      });
      if (all_back) after_adoption(j);
    }
    for (auto& [id, j] : jobs) try_resume(j);
    try_schedule();
  }

  void on_task_event(JobRec& j, TaskRec& t, const json& ev) {
    const std::string kind = ev.value("event", "");
    if (kind == "listening" && t.kind == "ps") {
      const int port = ev.value("port", 0);
      const std::string address = ev.value("address", agents.at(t.agent).address);
      if (t.restarts > 0) {
        // A restarted shard: it must be where the workers expect it (moving it would
        // need a new generation and new workers, which nothing does yet).
        const auto& ck = ev.contains("checkpoint") ? ev["checkpoint"] : json(nullptr);
        if (ck.is_object() && ck.value("restored", false)) {
          t.recovery = "restored from its checkpoint (" + std::to_string(ck.value("partitions", 0)) +
                       " partitions, " + std::to_string(ck.value("pushes", std::uint64_t{0})) + " pushes)";
        } else if (ck.is_object()) {
          t.recovery = "checkpoint refused (" + ck.value("error", std::string("?")) +
                       "); rebuilt from the workers' replicas";
        } else {
          t.recovery = "no checkpoint yet; rebuilt from the workers' replicas";
        }
        spdlog::warn("job {}: {} on {} listens again on {}:{}, {}", j.id, t.name, t.agent, address, port,
                     t.recovery);
        json e{{"event", "ps_recovered"}, {"task", t.name}, {"endpoint", address + ":" + std::to_string(port)},
               {"recovery", t.recovery}};
        event(j, e);
        notify(j, e);
        if (!(ck.is_object() && ck.value("restored", false)) && j.state == "running") {
          // The shard forgot which workers finished; one that has already exited cannot
          // tell it again, so worker 0 would wait for it until its finish timeout.
          for (const auto& w : j.tasks) {
            if (w.kind == "worker" && w.state == "exited" && w.ok_exit) {
              t.state = "running";
              t.port = port;
              t.address = address;
              return fail_job(j, t.name + " on agent " + t.agent + " restarted without its state (" + t.recovery +
                                     ") after " + w.name + " had finished; the other workers cannot learn that");
            }
          }
        }
        if (t.port > 0 && (port != t.port || address != t.address) && j.state == "running") {
          t.state = "running";
          return fail_job(j, t.name + " on agent " + t.agent + " restarted on " + address + ":" +
                                 std::to_string(port) + " instead of " + t.address + ":" + std::to_string(t.port) +
                                 "; its workers cannot follow it there");
        }
      }
      t.state = "running";
      t.port = port;
      t.address = address;
      const auto& ck0 = ev.contains("checkpoint") ? ev["checkpoint"] : json(nullptr);
      t.restored = ck0.is_object() && ck0.value("restored", false);
      save(j);
      if (j.state == "starting" &&
          std::all_of(j.tasks.begin(), j.tasks.end(), [](auto& x) { return x.kind != "ps" || x.port > 0; })) {
        start_workers(j);
      }
      return;
    }
    if (kind == "started") {
      t.state = "running";
      // A worker has taken the shards' parameters: from now on their state is training.
      if (t.kind == "worker" && !j.workers_started) {
        j.workers_started = true;
        save(j);
      }
      if (t.kind == "worker" && t.name == j.seed && j.state == "running") {
        // The seed has initialised the rebuilt shards from its replica: the others follow.
        spdlog::info("job {}: {} initialised the shards from its replica; starting the other workers", j.id, t.name);
        j.seed.clear();
        for (auto& w : j.tasks) {
          if (w.kind == "worker" && w.state == "pending") start_worker(j, w);
        }
      }
    }
    if (kind == "stopped" && t.kind == "worker") {
      t.replica = ev.contains("replica") ? ev["replica"] : json(nullptr);
      t.replica_generation = j.generation;
      t.epochs_done = std::max(t.epochs_done, ev.value("epochs_done", 0));
    }
    if (kind == "restarting") {
      t.restarts = ev.value("attempt", t.restarts + 1);
      if (t.kind == "ps") {
        spdlog::warn("job {}: {} on {} {}; restart {} of {}, from its latest checkpoint", j.id, t.name, t.agent,
                     ev.value("reason", "died"), t.restarts, ev.value("max_restarts", 0));
      } else {
        spdlog::warn("job {}: {} on {} {}; restart {} of {}, resuming after epoch {}", j.id, t.name, t.agent,
                     ev.value("reason", "died"), t.restarts, ev.value("max_restarts", 0), ev.value("resume_epoch", 0));
      }
      event(j, ev);
    }
    if (kind == "error") t.last_error = ev.value("message", "");
    if (kind == "ps_resync") {
      t.resyncs = ev.value("resyncs", t.resyncs + 1);
      spdlog::info("job {}: {} reconnected to PS shard {} and resynced ({})", j.id, t.name, ev.value("shard", -1),
                   ev.value("reason", ""));
      json e = ev;
      e["task"] = t.name;
      event(j, e);
    }
    if (t.kind == "worker") {
      if (ev.contains("bytes_pushed")) j.pushed[t.index] = ev.value("bytes_pushed", std::uint64_t{0});
      if (ev.contains("bytes_pulled")) j.pulled[t.index] = ev.value("bytes_pulled", std::uint64_t{0});
      if (kind == "profile") j.profile_ips[t.index] = ev.value("images_per_sec", 0.0);
      if (kind == "done") {
        if (ev.contains("traffic")) j.traffic[t.index] = ev["traffic"];
        if (ev.contains("traffic_after_warmup")) j.traffic_after_warmup[t.index] = ev["traffic_after_warmup"];
      }
      if (kind == "epoch_end") {
        t.epochs_done = std::max(t.epochs_done, ev.value("epoch", 0));
        j.images_per_sec[t.index] = ev.value("images_per_sec", 0.0);
        j.epoch_seconds[t.index] = ev.value("epoch_seconds", 0.0);
        if (t.index == 0) {
          j.epochs_done = ev.value("epoch", 0);
          if (ev.contains("test_accuracy")) j.test_accuracy = ev.value("test_accuracy", -1.0);
          record_epoch(j, ev);
          json e = ev;
          e["task"] = t.name;
          event(j, e);
        }
        save(j);  // where a re-assigned worker resumes, also after a leader restart
      }
    }
    if (kind == "progress" || kind == "epoch_end" || kind == "started" || kind == "done" || kind == "error" ||
        kind == "skipped_step" || kind == "restarting" || kind == "ps_resync" || kind == "stopped" ||
        kind == "replica_loaded") {
      json fwd = ev;
      fwd["task"] = t.name;
      notify(j, fwd);
    }
  }

  void on_task_exit(JobRec& j, TaskRec& t, const json& b) {
    if (t.state == "exited") return;  // orphans are handled in on_agent_message
    t.state = "exited";
    t.exit = b.value("describe", "exited");
    t.ok_exit = b.value("exit_code", -1) == 0 && b.value("signal", 0) == 0;
    if (t.last_error.empty()) t.last_error = b.value("last_error", "");
    release_cores(t.agent, j.spec.threads_per_task);
    spdlog::info("job {}: {} on {} {}", j.id, t.name, t.agent, t.exit);
    save(j);
    if (!j.failing_state.empty()) return maybe_finish(j);
    if (b.value("agent_stopping", false)) {
      // Its agent is shutting down (systemctl stop/restart, an upgrade): as if it were
      // lost, except that the leader knows at once. Nothing is placed there any more; a
      // restarted agent registers afresh.
      if (auto a = agents.find(t.agent); a != agents.end()) a->second.stopping = true;
      if (j.state == "recovering") return try_resume(j);
      if (!(t.kind == "worker" && t.ok_exit)) {
        return tasks_lost(j, t.name + " stopped with its agent " + t.agent + ", which is shutting down");
      }
    }
    if (j.state == "recovering") {
      // Stopped for the re-assignment. A worker that had just finished (exit 0 after its
      // "done") stays finished; its rank is passed to the new shards.
      return try_resume(j);
    }
    if (t.kind == "worker" && t.ok_exit) {
      const bool all_done = std::all_of(j.tasks.begin(), j.tasks.end(),
                                        [](auto& x) { return x.kind != "worker" || (x.state == "exited" && x.ok_exit); });
      if (all_done) {
        if (j.test_accuracy < 0 && !j.spec.profile) {
          return fail_job(j, "workers finished without reporting a test accuracy");
        }
        j.failing_state = "succeeded";
        set_state(j, "finishing");
        stop_tasks(j);
      }
      return;
    }
    std::string why = t.name + " on agent " + t.agent + " " + t.exit;
    if (!t.last_error.empty()) why += ": " + t.last_error;
    fail_job(j, why);
  }

  void agent_lost(const std::string& id, const std::string& why) {
    auto it = agents.find(id);
    if (it == agents.end() || it->second.lost) return;
    auto& a = it->second;
    a.lost = true;
    spdlog::warn("agent {} lost: {}", id, why);
    for (auto& jid : job_order) {
      auto& j = jobs.at(jid);
      if (j.terminal()) continue;
      bool hit = false;
      for (auto& t : j.tasks) {
        if (t.agent == id && t.state != "exited") {
          t.state = "exited";
          t.exit = "lost with its agent";
          a.free_cores += j.spec.threads_per_task;
          hit = true;
        }
      }
      if (hit) tasks_lost(j, "agent " + id + " was lost (" + why + ")");
    }
  }

  // ---------------------------------------------------------------- client messages
  // The validated job of a submit or plan request, or nullopt after replying the error.
  std::optional<JobSpec> parse_submitted(const std::shared_ptr<Session>& s, const wire::Envelope& env) {
    const auto& b = env.body;
    if (!b.contains("job_toml") || !b["job_toml"].is_string()) {
      reply_error(s, env.id, wire::error_code::kBadRequest, env.type + " needs \"job_toml\" (string)", "job_toml");
      return std::nullopt;
    }
    try {
      return parse_job_toml(b["job_toml"].get<std::string>(), b.value("base_dir", "."), true);
    } catch (const ConfigError& e) {
      reply_error(s, env.id, wire::error_code::kInvalidJob, e.what(), e.field());
      return std::nullopt;
    }
  }

  void on_client_message(const std::shared_ptr<Session>& s, const wire::Envelope& env) {
    const auto& b = env.body;
    if (env.type == "submit") {
      const auto parsed = parse_submitted(s, env);
      if (!parsed) return;
      const JobSpec& spec = *parsed;
      JobRec j;
      j.spec = spec;
      const bool automatic = spec.workers_auto || spec.batch_auto;
      std::optional<planner::Plan> p;
      if (automatic) {
        p = plan_for(spec, 0);
        if (!p->feasible && p->explore.empty()) {
          return reply_error(s, env.id, wire::error_code::kInfeasible, "planner: " + p->explanation);
        }
      }
      j.num = next_job++;
      j.id = "job-" + std::to_string(j.num);
      j.submitted = Clock::now();
      j.submitted_unix = unix_now();
      j.secret = new_job_secret_hex();
      if (b.value("follow", false)) j.followers.push_back(s);
      const std::string id = j.id;
      jobs.emplace(id, std::move(j));
      job_order.push_back(id);
      persist("saving the job counter", [&] { db->put_meta("next_job", std::to_string(next_job)); });
      auto& job = jobs.at(id);
      spdlog::info("job {} ({}) submitted: {} workers, {} PS shards, batch {}, {} epochs", id, spec.name,
                   spec.workers_auto ? "auto" : std::to_string(spec.workers), spec.ps_shards,
                   spec.batch_auto ? "auto" : std::to_string(spec.batch_size), spec.epochs);
      if (automatic && !p->explore.empty()) {
        job.plan = planner::to_json(*p);
        reply(s, env.id, {{"job", id}, {"state", "exploring"}});
        explore(job, p->explore);
      } else if (automatic) {
        reply(s, env.id, {{"job", id}, {"state", "queued"}, {"plan", planner::to_json(*p)}});
        job.state = "planning";
        decide(job);
      } else {
        queue.push_back(id);
        save(job);
        reply(s, env.id, {{"job", id}, {"state", "queued"}});
      }
      try_schedule();
      return;
    }
    if (env.type == "plan") {
      const auto parsed = parse_submitted(s, env);
      if (parsed) reply(s, env.id, planner::to_json(plan_for(*parsed, 0)));
      return;
    }
    if (env.type == "history") {
      json rows = json::array();
      if (db) {
        for (const auto& o : db->history(b.value("model", ""), b.value("dataset", ""))) rows.push_back(o);
      }
      return reply(s, env.id, {{"observations", rows}, {"persistent", db != nullptr}});
    }
    if (env.type == "list" || (env.type == "status" && !b.contains("job"))) {
      json arr = json::array();
      for (auto& id : job_order) arr.push_back(job_json(jobs.at(id)));
      return reply(s, env.id, {{"jobs", arr}});
    }
    if (env.type == "agents") {
      json arr = json::array();
      for (auto& [id, a] : agents) {
        arr.push_back({{"agent", id},
                       {"address", a.address},
                       {"cores", a.cores},
                       {"free_cores", a.free_cores},
                       {"memory_mb", a.memory_mb},
                       {"hardware_class", a.hardware_class},
                       {"state", a.lost ? "lost" : a.stopping ? "stopping" : "ready"},
                       {"seconds_since_heartbeat",
                        std::chrono::duration<double>(Clock::now() - a.last_seen).count()}});
      }
      return reply(s, env.id, {{"agents", arr}});
    }
    if (env.type == "status" || env.type == "cancel" || env.type == "follow") {
      if (!b.contains("job") || !b["job"].is_string()) {
        return reply_error(s, env.id, wire::error_code::kBadRequest, env.type + " needs \"job\" (string)", "job");
      }
      const auto jid = b["job"].get<std::string>();
      auto it = jobs.find(jid);
      if (it == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + jid + "\"", "job");
      auto& j = it->second;
      if (env.type == "status") return reply(s, env.id, job_json(j));
      if (env.type == "follow") {
        reply(s, env.id, job_json(j));
        if (j.terminal()) {
          s->send(wire::make_event(summary(j)));
        } else {
          j.followers.push_back(s);
        }
        return;
      }
      // cancel
      if (j.terminal()) {
        return reply_error(s, env.id, wire::error_code::kConflict, "job " + jid + " already " + j.state, "job");
      }
      if (j.state == "exploring") {
        for (const auto& pid : j.pending_profiles) {
          auto& pj = jobs.at(pid);
          if (pj.state == "queued") {
            queue.erase(std::find(queue.begin(), queue.end(), pid));
            pj.failing_state = "cancelled";
            maybe_finish(pj);
          } else if (!pj.terminal() && pj.failing_state.empty()) {
            pj.failing_state = "cancelled";
            set_state(pj, "cancelling");
            stop_tasks(pj);
          }
        }
        j.pending_profiles.clear();
        j.failing_state = "cancelled";
        maybe_finish(j);
      } else if (j.state == "queued") {
        queue.erase(std::find(queue.begin(), queue.end(), jid));
        j.failing_state = "cancelled";
        maybe_finish(j);
        try_schedule();
      } else if (j.failing_state.empty() || j.failing_state == "succeeded") {
        j.failing_state = "cancelled";
        set_state(j, "cancelling");
        stop_tasks(j);
      }
      return reply(s, env.id, {{"job", jid}, {"state", j.state}});
    }
    reply_error(s, env.id, wire::error_code::kBadRequest, "unknown message type \"" + env.type + "\"", "type");
  }

  // ---------------------------------------------------------------- plumbing
  void on_message(const std::shared_ptr<Session>& s, const std::string& text) {
    wire::Envelope env;
    try {
      env = wire::parse_envelope(text);
    } catch (const ProtocolError& e) {
      spdlog::warn("control: bad message from {}: {}", s->peer(), e.what());
      std::string id;
      try {
        auto j = json::parse(text);
        if (j.is_object() && j.contains("id") && j["id"].is_string()) id = j["id"].get<std::string>();
      } catch (...) {
      }
      const bool version = std::string(e.what()).find("not supported") != std::string::npos;
      s->send(wire::make_error(id, version ? wire::error_code::kUnsupportedVersion : wire::error_code::kBadRequest,
                               e.what()));
      return;
    }
    try {
      if (s->kind() == PeerKind::kAgent) {
        on_agent_message(s, env);
      } else {
        on_client_message(s, env);
      }
    } catch (const std::exception& e) {
      spdlog::error("control: handling {} from {}: {}", env.type, s->peer(), e.what());
      s->send(wire::make_error(env.id, wire::error_code::kInternal, e.what()));
    }
  }

  void on_close(const std::shared_ptr<Session>& s) {
    auto it = agent_by_session.find(s->id());
    if (it == agent_by_session.end()) return;
    const std::string id = it->second;
    agent_by_session.erase(it);
    // Not lost yet: an agent whose link broke reconnects with back-off and re-reports its
    // tasks. The heartbeat checker declares it lost once it has been silent for
    // heartbeat_timeout (check_heartbeats), which is the tolerance operators configure.
    auto a = agents.find(id);
    if (a == agents.end() || a->second.lost) return;
    const auto current = a->second.session.lock();
    if (current == nullptr || current->id() == s->id()) {
      spdlog::warn("agent {}: control connection closed; lost unless it registers again within {} ms", id,
                   opt.heartbeat_timeout.count());
    }
  }

  void check_heartbeats() {
    hb_timer.expires_after(opt.heartbeat_interval);
    hb_timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
      auto self = w.lock();
      if (!self || ec) return;
      const auto now = Clock::now();
      for (auto& [id, a] : self->agents) {
        if (!a.lost && now - a.last_seen > self->opt.heartbeat_timeout) {
          if (auto s = a.session.lock()) s->close();
          self->agent_lost(id, "no heartbeat for " + std::to_string(self->opt.heartbeat_timeout.count()) + " ms");
        }
      }
      for (auto& jid : self->job_order) {
        auto& j = self->jobs.at(jid);
        if (j.adopt_until && now >= *j.adopt_until) self->after_adoption(j);
        self->try_resume(j);
      }
      self->check_heartbeats();
    });
  }
};

Leader::Leader(asio::io_context& io, const AgentOptions& opt) : impl_(std::make_shared<Impl>(io, opt)) {
  impl_->on_registered = &on_agent_registered;
}

Leader::~Leader() { stop(); }

void Leader::start() {
  control::ControlServerOptions so;
  so.bind_address = impl_->opt.listen_address;
  so.port = impl_->opt.listen_port;
  so.agent_token = impl_->opt.agent_token;
  so.client_token = impl_->opt.client_token;
  so.tls_cert_file = impl_->opt.tls_cert_file;
  so.tls_key_file = impl_->opt.tls_key_file;
  std::weak_ptr<Impl> w = impl_;
  control::ControlHandler h;
  h.on_message = [w](const std::shared_ptr<Session>& s, const std::string& text) {
    if (auto self = w.lock()) self->on_message(s, text);
  };
  h.on_close = [w](const std::shared_ptr<Session>& s) {
    if (auto self = w.lock()) self->on_close(s);
  };
  if (!impl_->opt.state_dir.empty()) {
    impl_->db = store::Store::open((std::filesystem::path(impl_->opt.state_dir) / "db").string());
    impl_->restore();
  }
  impl_->server = std::make_unique<control::ControlServer>(impl_->io, so, h);
  impl_->server->start();
  impl_->check_heartbeats();
  spdlog::info("leader listening on {}:{}{}", so.bind_address, impl_->server->port(),
               so.tls_cert_file.empty() ? "" : " (TLS, wss://)");
}

void Leader::stop() {
  if (!impl_) return;
  impl_->hb_timer.cancel();
  if (impl_->server) impl_->server->stop();
  if (impl_->db) {
    try {
      impl_->db->flush();
    } catch (const std::exception& e) {
      spdlog::error("store: flush on shutdown failed: {}", e.what());
    }
  }
}

std::uint16_t Leader::port() const { return impl_->server ? impl_->server->port() : 0; }

std::size_t Leader::live_agents() const {
  std::size_t n = 0;
  for (auto& [id, a] : impl_->agents) n += a.lost ? 0 : 1;
  return n;
}

}  // namespace dltrain::agent
