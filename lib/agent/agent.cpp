#include "agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/failure.h"
#include "agent/leader_link.h"
#include "agent/model_fetch.h"
#include "agent/shard_cache.h"
#include "agent/shard_cache_server.h"
#include "data/shard_client.h"
#include "agent/supervisor.h"
#include "agent/task_files.h"
#include "agent/task_launch.h"
#include "agent/task_logs.h"
#include "common/file_transfer.h"
#include "agent/task_metrics.h"
#include "agent/task_table.h"
#include "common/errors.h"
#include "wire/task_event.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "control/client.h"
#include "wire/control.h"
#include "wire/control_bodies.h"
#include "wire/task_events.h"

namespace dltrain::agent {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using json = nlohmann::json;
namespace events = wire::events;

namespace {

std::string self_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

std::int64_t physical_memory_mb() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<std::int64_t>(pages) * size / (1024 * 1024) : 0;
}

}  // namespace

struct Agent::Impl : std::enable_shared_from_this<Agent::Impl> {
  asio::io_context& io;
  config::AgentOptions opt;
  Supervisor supervisor;
  asio::steady_timer log_timer;
  bool shutting_down = false;
  // The link to the leader (leader_link.h); set by start().
  std::shared_ptr<LeaderLink> leader;
  // Its tasks, their restarts, the exits still to report, the ended ones' metrics.
  TaskTable tasks;
  std::function<void()> on_registered;  // Agent::set_on_registered
  std::function<void()> on_all_stopped;
  // Uploaded model files (JobSpec::model_sha256) fetched from the leader, and the workers
  // (key job/task) that wait for theirs before they start.
  ModelFetcher fetcher;
  std::map<std::string, std::uint32_t> fetching;  // key → the generation waiting
  // The shard cache its workers read sharded data sets through (cache_bytes > 0), and the
  // heartbeats since its list of held shards was last sent with one.
  std::unique_ptr<ShardCache> shard_cache;
  std::unique_ptr<ShardCacheServer> shard_server;
  std::vector<std::string> held_sent;
  int beats_since_held = 0;

  Impl(asio::io_context& i, config::AgentOptions o)
      : io(i), opt(std::move(o)), supervisor(i), log_timer(i),
        fetcher(i, (fs::path(opt.state_dir) / "model-files").string(),
                [this](std::string text) { return leader && leader->send_now(std::move(text)); },
                opt.model_retention) {
    if (opt.cores <= 0) opt.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (opt.memory_mb <= 0) opt.memory_mb = physical_memory_mb();
    if (opt.task_bin_dir.empty()) opt.task_bin_dir = self_dir();
  }

  // The shard cache stops first: its server's connections may wait in it.
  ~Impl() {
    if (shard_cache) shard_cache->stop();
  }

  void send(wire::ControlType type, const json& body, bool droppable = false) { leader->send(type, body, droppable); }

  // The link to the leader, with what only the agent knows; its orders' handlers.
  void make_link() {
    LeaderLink::Hooks h;
    h.registration = [this] { return registration(); };
    h.registered = [this](bool first) {
      tasks.exits_delivered();  // their exits were in the outbox, sent before this
      if (first && on_registered) on_registered();
    };
    h.lost = [this](const std::string& why) { fetcher.fail_all(why); };
    h.running_tasks = [this] { return tasks.size(); };
    h.heartbeat_extra = [this] { return cache_figures(); };
    h.other_reply = [this](const wire::Envelope& env) { return fetcher.on_reply(env); };
    h.exit_unanswered = [this](const json& b) {
      tasks.exit_pending(TaskTable::key(b.value("job", std::string()), b.value("task", std::string())),
                         b.value("generation", std::uint32_t{0}));
    };
    leader = std::make_shared<LeaderLink>(io, opt, std::move(h));
    add_order_handlers();
  }

  // Opens the shard cache under the state directory and serves it to the tasks.
  void open_shard_cache() {
    if (opt.cache_bytes <= 0) return;
    ShardCache::Options o;
    o.dir = opt.cache_dir.empty() ? (fs::path(opt.state_dir) / "shard-cache").string() : opt.cache_dir;
    o.capacity_bytes = opt.cache_bytes;
    o.fetch.s3.endpoint = opt.s3_endpoint;
    o.fetch.s3.region = opt.s3_region;
    o.fetch.s3.credentials_file = opt.s3_credentials_file;
    o.fetch.log = [](const std::string& line) { spdlog::warn("shard cache: {}", line); };
    shard_cache = std::make_unique<ShardCache>(std::move(o));
    shard_server = std::make_unique<ShardCacheServer>((fs::path(opt.state_dir) / "shard-cache.sock").string(), *shard_cache);
    const auto st = shard_cache->stats();
    spdlog::info("shard cache: {} shards, {} MiB of {} MiB, at {}", st.shards, st.bytes >> 20, st.capacity_bytes >> 20,
                 shard_server->path());
  }

  // The heartbeat's "shard_cache": the cache's figures, and the shards it holds when that
  // changed (or every 30 heartbeats, for a leader that started meanwhile).
  json cache_figures() {
    if (!shard_cache) return json::object();
    const auto st = shard_cache->stats();
    json c{{"capacity_bytes", st.capacity_bytes}, {"bytes", st.bytes}, {"shards", st.shards},
           {"hits", st.hits}, {"misses", st.misses}, {"fetches", st.fetches},
           {"bytes_fetched", st.bytes_fetched}, {"evictions", st.evictions}, {"failures", st.failures}};
    auto held = shard_cache->held();
    if (held != held_sent || ++beats_since_held >= 30) {
      c["held"] = held;
      held_sent = std::move(held);
      beats_since_held = 0;
    }
    return {{"shard_cache", c}};
  }

  wire::RegisterBody registration() const {
    wire::RegisterBody r;
    r.name = opt.name;
    r.advertise_address = opt.advertise_address;
    r.cores = opt.cores;
    r.memory_mb = opt.memory_mb;
    r.hardware_class = opt.hardware_class;
    r.gpus = opt.gpu_devices;
    if (!opt.metrics_endpoint.empty()) r.metrics_endpoint = opt.metrics_endpoint;
    r.shard_cache_bytes = shard_cache ? opt.cache_bytes : 0;
    r.tasks = tasks.registered();
    return r;
  }

  // The leader's orders, by type.
  void add_order_handlers() {
    using T = wire::ControlType;
    leader->orders()
        .on(T::kStartTask,
            [this](const wire::Envelope& env) {
              if (env.term > 0) spdlog::info("start_task {} from term {}", env.id, env.term);
              try {
                start_task(wire::parse_body<wire::StartTaskBody>(env));
              } catch (const std::exception& e) {
                leader->refuse(env, e);
                // Report the task as failed so the leader does not wait for it (as far as the
                // request names it: it may be the part that was refused).
                const auto ref = wire::TaskRefBody::lenient(env.body);
                return report_not_started(ref.job, ref.task, ref.generation, 126, "could not be started", e.what());
              }
              leader->answer(wire::make_reply(env.id, json::object()));
            })
        .on(T::kStopTask,
            [this](const wire::Envelope& env) {
              if (env.term > 0) spdlog::info("stop_task {} from term {}", env.id, env.term);
              stop_task(wire::parse_body<wire::TaskRefBody>(env));
              leader->answer(wire::make_reply(env.id, json::object()));
            })
        .on(T::kReadLog,
            [this](const wire::Envelope& env) {
              const auto b = wire::parse_body<wire::LogRequestBody>(env);
              const Task* running = tasks.find(TaskTable::key(b.job, b.task));
              leader->answer(
                  wire::make_reply(env.id, read_task_log(opt, b, running ? &running->launch : nullptr).to_json()));
            })
        .on(T::kReadModelFile, [this](const wire::Envelope& env) {
          leader->answer(model_file_reply(opt, env.id, wire::parse_body<wire::ModelFileRequestBody>(env)));
        });
  }

  // A task that never ran ends for the leader as one that exited.
  void report_not_started(const std::string& job, const std::string& task, std::uint32_t generation, int code,
                          const std::string& describe, const std::string& why) {
    wire::TaskExitBody x;
    x.job = job;
    x.task = task;
    x.generation = generation;
    x.exit_code = code;
    x.describe = describe;
    x.last_error = why;
    send(wire::ControlType::kTaskExit, x.to_json());
  }

  // A worker of a job whose model file was uploaded (JobSpec::model_sha256) or that
  // starts from a trained model (init_sha256) starts once its agent has those files; the
  // others at once.
  void start_task(const wire::StartTaskBody& b) {
    const std::string key = TaskTable::key(b.job, b.task);
    if (tasks.contains(key) || fetching.count(key)) throw Error("task " + key + " is already running here");
    std::vector<std::pair<std::string, std::string>> needed;  // sha256, name in the task directory
    if (b.kind == wire::TaskKind::kWorker) {
      if (!b.spec.model_sha256.empty()) needed.emplace_back(b.spec.model_sha256, kUploadedModelFile);
      if (!b.spec.init_sha256.empty()) needed.emplace_back(b.spec.init_sha256, kInitStateDictFile);
    }
    if (needed.empty()) return launch_task(b, {});
    fetching[key] = b.generation;
    for (const auto& n : needed) fetcher.pin(n.first);
    fetch_for(b, std::move(needed), 0, {});
  }

  // Fetches needed[i], then the rest, then starts the task (unless it was stopped or
  // started again meanwhile); a fetch that fails ends the task as not started. Every
  // needed file stays pinned in the cache until then.
  void fetch_for(const wire::StartTaskBody& b, std::vector<std::pair<std::string, std::string>> needed, std::size_t i,
                 std::map<std::string, std::string> got) {
    const auto sha = needed[i].first;
    fetcher.fetch(sha, [w = weak_from_this(), b, needed, i, got](const std::string& path,
                                                                 const std::string& error) mutable {
      auto self = w.lock();
      if (!self) return;
      const std::string key = TaskTable::key(b.job, b.task);
      const auto it = self->fetching.find(key);
      // Stopped meanwhile, or started again as a newer generation (which fetches for itself).
      const bool current = it != self->fetching.end() && it->second == b.generation;
      const auto release = [&] {
        for (const auto& n : needed) self->fetcher.unpin(n.first);
        if (current) self->fetching.erase(key);
      };
      if (!current) return release();
      const std::string& name = needed[i].second;
      try {
        if (!error.empty()) throw Error("cannot fetch the job's " + name + " from the leader: " + error);
        got[name] = path;
        if (i + 1 < needed.size()) return self->fetch_for(b, std::move(needed), i + 1, std::move(got));
        self->launch_task(b, got);
        release();
      } catch (const std::exception& e) {
        release();
        spdlog::error("start_task {} failed: {}", key, e.what());
        self->report_not_started(b.job, b.task, b.generation, 126, "could not be started", e.what());
      }
    });
  }

  // `files`: name in the task directory → the fetched copy.
  void launch_task(const wire::StartTaskBody& b, const std::map<std::string, std::string>& files) {
    const std::string key = TaskTable::key(b.job, b.task);
    Task t;
    t.launch = prepare_task(opt, b);
    if (shard_server) t.launch.process.env.emplace_back(data::kShardCacheEnv, shard_server->path());
    for (const auto& [name, path] : files) {
      // The worker reads a fetched file from its own directory (a hard link to the
      // cached copy; a copy where the two are on different file systems).
      const fs::path dst = fs::path(t.launch.process.work_dir) / name;
      std::error_code ec;
      fs::remove(dst, ec);
      fs::create_hard_link(path, dst, ec);
      if (ec) fs::copy_file(path, dst, fs::copy_options::overwrite_existing, ec);
      if (ec) throw IoError("cannot put " + name + " into " + dst.string() + ": " + ec.message());
    }
    t.job = t.launch.job;
    t.name = t.launch.name;
    t.generation = t.launch.generation;
    t.kind = t.launch.kind;
    if (t.kind == wire::TaskKind::kWorker) t.epochs_done = t.launch.worker->resume_epoch;
    t.metrics.job = t.job;
    t.metrics.task = t.name;
    t.metrics.role = t.kind;
    t.metrics.threads = t.launch.threads;
    t.metrics.start_unix = unix_seconds_now();
    t.oom_kills_at_start = cgroup_oom_kills();
    try {
      t.pid = spawn(key, t.launch.process);
    } catch (...) {
      std::error_code ec;
      fs::remove(t.launch.secret_path, ec);
      throw;
    }
    spdlog::info("started {} of {} (pid {}, {} threads), log {}", t.name, t.job, t.pid, t.launch.threads,
                 t.launch.process.log_path);
    tasks.add(std::move(t));
  }

  pid_t spawn(const std::string& key, const ProcessSpec& ps) {
    std::weak_ptr<Impl> w = weak_from_this();
    return supervisor.spawn(
        ps,
        [w, key](const std::string& line) {
          if (auto self = w.lock()) self->on_task_line(key, line);
        },
        [w, key](const ExitStatus& st) {
          if (auto self = w.lock()) self->on_task_exit(key, st);
        });
  }

  void stop_task(const wire::TaskRefBody& b) {
    const std::string key = TaskTable::key(b.job, b.task);
    if (fetching.erase(key)) {
      // Waiting for its model file: it never ran; it ends now, as stopped.
      return report_not_started(b.job, b.task, b.generation, 143, "stopped before it started", "");
    }
    Task* t = tasks.find(key);
    if (!t) return;  // already gone; its exit was (or will be) reported
    if (b.leave.value_or(false) && !t->restart_timer) {
      // An elastic job's worker leaves after its step and exits 0 (dltrain scale); should
      // it die instead, it is not started again: it was leaving.
      spdlog::info("asking {} (pid {}) to leave its job", key, t->pid);
      t->stop_requested = true;
      return supervisor.signal(t->pid, SIGUSR1);
    }
    t->stop_requested = true;
    if (t->restart_timer) {
      // Waiting to restart: there is no process; report the task ended now, as stopped
      // (143, as a process ended by SIGTERM), not as finished: it had died.
      t->restart_timer->cancel();
      return on_task_exit(key, ExitStatus{143, 0});
    }
    spdlog::info("stopping {} (pid {})", key, t->pid);
    supervisor.stop(t->pid, opt.task_stop_grace);
  }

  // A task that dies is started again when the table says so (TaskTable::plan_restart:
  // bounded, with back-off), from its launch: a worker resumes after its last finished
  // epoch, a PS shard on its port from its latest checkpoint.
  bool maybe_restart(const std::string& key, Task& t, const ExitStatus& st) {
    const auto plan = tasks.plan_restart(t, st, shutting_down, opt.task_max_restarts);
    if (!plan) return false;
    const auto delay = plan->delay;
    events::Restarting ev;
    ev.kind = std::string(wire::to_string(t.kind));
    ev.attempt = t.restarts;
    ev.max_restarts = opt.task_max_restarts;
    ev.reason = st.describe();
    ev.last_error = t.last_error;
    if (t.kind == wire::TaskKind::kWorker) {
      spdlog::warn("{} {}: restart {} of {} in {} ms, resuming after epoch {}", key, st.describe(), t.restarts,
                   opt.task_max_restarts, delay.count(), t.epochs_done);
      ev.resume_epoch = t.epochs_done;
    } else {
      spdlog::warn("{} {}: restart {} of {} in {} ms, on port {} from its latest checkpoint", key, st.describe(),
                   t.restarts, opt.task_max_restarts, delay.count(), t.port);
      ev.port = t.port;
    }
    send(wire::ControlType::kTaskEvent, wire::TaskEventBody{{}, t.job, t.name, t.generation, ev.to_json()}.to_json());
    t.last_error.clear();
    t.last_cause.clear();
    t.pid = -1;
    t.restart_timer = std::make_shared<asio::steady_timer>(io, delay);
    std::weak_ptr<Impl> w = weak_from_this();
    t.restart_timer->async_wait([w, key](boost::system::error_code ec) {
      auto self = w.lock();
      if (!self || ec) return;
      Task* found = self->tasks.find(key);
      if (!found) return;
      auto& task = *found;
      task.restart_timer.reset();
      // A shard that died before it listened gets a fresh port, which it announces as at
      // its first start.
      const ProcessSpec ps = task.launch.restart(task.epochs_done, task.port);
      try {
        task.oom_kills_at_start = cgroup_oom_kills();
        task.pid = self->spawn(key, ps);
        task.metrics.restarts = task.restarts;
        task.metrics.restarted(unix_seconds_now());
        spdlog::info("restarted {} (pid {})", key, task.pid);
      } catch (const std::exception& e) {
        spdlog::error("restarting {} failed: {}", key, e.what());
        task.last_error = e.what();
        self->on_task_exit(key, ExitStatus{126, 0});
      }
    });
    return true;
  }

  void on_task_line(const std::string& key, const std::string& line) {
    Task* found = tasks.find(key);
    if (!found) return;
    auto& t = *found;
    json ev = events::event_of_line(line);
    std::optional<events::TaskEvent> parsed;
    try {
      parsed = events::parse_task_event(ev, t.kind);
    } catch (const json::exception& e) {
      // A task's malformed event must not end the agent: the leader gets it as it came
      // and refuses it there.
      spdlog::warn("{}: malformed {} event ({}): {}", key, events::kind_of(ev), e.what(), line.substr(0, 200));
    }
    if (parsed) {
      // A shard listens on this agent's address, which only the agent knows.
      if (std::holds_alternative<events::Listening>(*parsed)) ev["address"] = opt.advertise_address;
      t.on_event(*parsed);
    }
    // By its kind, malformed or not: a shard's counters are for this agent's metrics
    // endpoint only (the leader has no use for them, and they would cost it a message per
    // shard every progress interval); progress reports may be dropped from a full outbox.
    const std::string kind = events::kind_of(ev);
    if (kind == events::PsStats::kKind) return;
    send(wire::ControlType::kTaskEvent, wire::TaskEventBody{{}, t.job, t.name, t.generation, ev}.to_json(),
         kind == events::Progress::kKind);
  }

  void on_task_exit(const std::string& key, const ExitStatus& st) {
    Task* found = tasks.find(key);
    if (!found) return;
    if (maybe_restart(key, *found, st)) return;
    Task t = *tasks.end(key, unix_seconds_now());
    spdlog::info("{} (pid {}) {}", key, t.pid, st.describe());
    std::error_code ec;
    fs::remove(t.launch.secret_path, ec);  // no longer needed; the task log stays
    std::string last_error = t.last_error;
    const bool failed = st.exit_code != 0 || st.signal != 0;
    // The tail of its log says what it was doing; with nothing said on stdout, its last
    // line is usually why it failed.
    std::vector<std::string> tail;
    if (failed) tail = last_lines(t.launch.process.log_path, 20, 1000);
    if (last_error.empty() && !tail.empty()) last_error = tail.back();
    if (!leader->connected()) tasks.exit_pending(key, t.generation);
    wire::TaskExitBody x;
    x.job = t.job;
    x.task = t.name;
    x.generation = t.generation;
    x.exit_code = st.exit_code;
    x.signal = st.signal;
    x.describe = shutting_down ? st.describe() + " (its agent is shutting down)" : st.describe();
    x.agent_stopping = shutting_down;
    x.last_error = last_error;
    if (failed && !t.stop_requested && !shutting_down) {
      const auto oom_now = cgroup_oom_kills();
      const bool oom = oom_now && t.oom_kills_at_start && *oom_now > *t.oom_kills_at_start;
      x.cause = events::classify_exit(st.exit_code, st.signal, t.last_cause, oom);
      x.last_lines = std::move(tail);
    }
    send(wire::ControlType::kTaskExit, x.to_json());
    if (shutting_down && tasks.empty() && on_all_stopped) {
      auto f = std::move(on_all_stopped);
      on_all_stopped = nullptr;
      f();
    }
  }

  // Bounds every running task's log (task_log_max_bytes), every few seconds, whether
  // the leader is there or not.
  void rotate_logs() {
    log_timer.expires_after(std::chrono::seconds(5));
    log_timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
      auto self = w.lock();
      if (!self || ec) return;
      for (const auto& [key, t] : self->tasks) {
        try {
          if (rotate_log_if_larger(t.launch.process.log_path, self->opt.task_log_max_bytes)) {
            spdlog::info("{}: log rotated to {}.1", key, t.launch.process.log_path);
          }
        } catch (const std::exception& e) {
          spdlog::warn("{}: {}", key, e.what());
        }
      }
      self->rotate_logs();
    });
  }

  void collect(control::MetricsBuilder& out) {
    AgentFigures a;
    a.agent = opt.name;
    a.cores = opt.cores;
    a.memory_mb = opt.memory_mb;
    a.gpus = opt.gpu_devices;
    a.leader_connected = leader && leader->connected();
    a.leader_term = leader ? leader->newest_term() : 0;
    a.stale_refused = leader ? leader->refused() : 0;
    tasks.add_metrics(out, a, opt.name, unix_seconds_now());
    if (shard_cache) {
      const auto st = shard_cache->stats();
      const control::MetricLabels l{{"agent", opt.name}};
      out.gauge("dltrain_shard_cache_capacity_bytes", "The shard cache's bound (cache_bytes)", l, static_cast<double>(st.capacity_bytes));
      out.gauge("dltrain_shard_cache_bytes", "Bytes of the shards the cache holds", l, static_cast<double>(st.bytes));
      out.gauge("dltrain_shard_cache_shards", "Shards the cache holds", l, static_cast<double>(st.shards));
      out.counter("dltrain_shard_cache_hits_total", "Shards workers asked for that were cached", l, static_cast<double>(st.hits));
      out.counter("dltrain_shard_cache_misses_total", "Shards workers asked for that had to be fetched first", l, static_cast<double>(st.misses));
      out.counter("dltrain_shard_cache_fetched_bytes_total", "Bytes of shards fetched from their source", l, static_cast<double>(st.bytes_fetched));
      out.counter("dltrain_shard_cache_evictions_total", "Shards evicted to make room", l, static_cast<double>(st.evictions));
      out.counter("dltrain_shard_cache_failures_total", "Shard fetches that failed for good", l, static_cast<double>(st.failures));
    }
  }
};

Agent::Agent(asio::io_context& io, config::AgentOptions opt) : impl_(std::make_shared<Impl>(io, std::move(opt))) {}

void Agent::set_on_registered(std::function<void()> f) { impl_->on_registered = std::move(f); }

Agent::~Agent() = default;

void Agent::collect_metrics(control::MetricsBuilder& out) const { impl_->collect(out); }

void Agent::start() {
  // leader_url set by a program (the daemon's own agent, a standalone cluster, a test)
  // stands for the list when the list does not hold it.
  auto& urls = impl_->opt.leader_urls;
  if (std::find(urls.begin(), urls.end(), impl_->opt.leader_url) == urls.end()) urls = {impl_->opt.leader_url};
  impl_->make_link();
  std::error_code ec;
  fs::create_directories(impl_->opt.state_dir, ec);
  if (ec) throw ConfigError("state_dir", "cannot create \"" + impl_->opt.state_dir + "\": " + ec.message());
  impl_->rotate_logs();
  impl_->open_shard_cache();
  impl_->leader->start();
}

void Agent::shutdown(std::function<void()> done) {
  auto& im = *impl_;
  im.shutting_down = true;
  if (im.leader) im.leader->stop_reconnecting();
  im.log_timer.cancel();
  auto finish = [w = std::weak_ptr<Impl>(impl_), done = std::move(done)] {
    auto self = w.lock();
    if (self) {
      if (self->leader) self->leader->stop_heartbeats();
      // Give the task_exit messages a moment to leave before closing.
      auto t = std::make_shared<asio::steady_timer>(self->io, std::chrono::milliseconds(200));
      t->async_wait([w, t, done](boost::system::error_code) {
        if (auto s = w.lock(); s && s->leader) s->leader->close();
        done();
      });
    } else {
      done();
    }
  };
  if (im.tasks.empty()) return finish();
  im.on_all_stopped = finish;
  for (auto& [key, t] : im.tasks) im.supervisor.stop(t.pid, im.opt.task_stop_grace);
}

}  // namespace dltrain::agent
