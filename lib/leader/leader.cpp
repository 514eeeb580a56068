// The leader's job state machine: launching a job's tasks once the queue admits it
// (leader_queue.cpp), finishing and failing it, and the plumbing of its control sessions. The agent and client protocols,
// recovery and planning are in the files listed in leader_impl.h.
#include "leader/leader.h"

#include <algorithm>
#include <filesystem>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/errors.h"
#include "common/secret.h"
#include "planner/ps_memory.h"
#include "store/rocksdb_store.h"

namespace dltrain::leader {

namespace asio = boost::asio;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using control::PeerKind;
using control::Session;
namespace events = wire::events;
using SessionPtr = Leader::Impl::SessionPtr;

void Leader::Impl::save(const JobRec& j) {
  persist("saving a job", [&] { db->put_job(j.num, stored_record(j)); });
}

void Leader::Impl::event(const JobRec& j, const json& ev) {
  persist("appending an event", [&] {
    json e = ev;
    e["time"] = unix_now();
    db->append_event(j.num, e);
  });
}

void Leader::Impl::notify(JobRec& job, json body) {
  body["job"] = job.id;
  const std::string text = wire::make_event(body);
  auto& f = job.followers;
  f.erase(std::remove_if(f.begin(), f.end(), [](auto& w) { return w.expired(); }), f.end());
  for (auto& w : f) {
    if (auto s = w.lock()) s->send(text);
  }
}

void Leader::Impl::publish(JobRec& j, const json& ev) {
  event(j, ev);
  notify(j, ev);
}

void Leader::Impl::send_agent(const std::string& agent_id, wire::ControlType type, const json& body) {
  auto it = agents.find(agent_id);
  if (it == agents.end()) return;
  if (auto s = it->second.session.lock()) order(s, "l" + std::to_string(next_req++), type, body);
}

bool Leader::Impl::order(const SessionPtr& s, const std::string& id, wire::ControlType type, const json& body) {
  if (!serving()) {
    spdlog::warn("not serving any more (term {} may be over): {} to {} held back", ha.term, enum_name(type), s->peer());
    return false;
  }
  s->send(wire::make_request(id, type, body, ha.term));
  return true;
}

json Leader::Impl::leader_json() const {
  json j{{"name", opt.name}, {"ha", ha.term > 0}, {"since_unix", started_unix}};
  if (ha.term > 0) j["term"] = ha.term;
  if (ha.candidates) {
    try {
      j["candidates"] = ha.candidates();
    } catch (const std::exception& e) {
      j["candidates_error"] = e.what();
    }
  }
  return j;
}

std::vector<std::string> Leader::Impl::standbys() const {
  std::vector<std::string> out;
  if (!ha.candidates) return out;
  try {
    for (const auto& c : ha.candidates()) {
      if (c.value("state", std::string()) == "standing by") out.push_back(c.value("candidate", std::string()));
    }
  } catch (const std::exception& e) {
    spdlog::warn("the candidates standing by are unknown: {}", e.what());
  }
  return out;
}

// ---------------------------------------------------------------- helpers
void Leader::Impl::reply(const SessionPtr& s, const std::string& id, const json& body) {
  if (!audit_pending.empty()) audit_reply(s, id, &body, "", "");
  s->send(wire::make_reply(id, body));
}

void Leader::Impl::reply_error(const SessionPtr& s, const std::string& id, const std::string& code,
                        const std::string& msg, const std::string& field) {
  ++counters.errors[{s->kind() == PeerKind::kAgent ? "agent" : "client", code}];
  if (!audit_pending.empty()) audit_reply(s, id, nullptr, code, msg);
  s->send(wire::make_error(id, code, msg, field));
}

json Leader::Impl::status_json(const JobRec& j) const {
  std::optional<QueueStatus> q;
  if (j.state() == JobState::kQueued) q = queue_status(j);
  json out = job_json(j, q);
  if (q) {
    if (auto why = quota_wait(j)) out["quota"] = *why;
  }
  if (auto kept = models.models_json(j.id); !kept.empty()) out["models"] = std::move(kept);
  if (!j.model.error.empty()) out["model_error"] = j.model.error;
  if (!j.model.replicas.empty()) out["model_replicas"] = j.model.replicas;
  if (!j.model.replication.empty()) out["model_replication"] = j.model.replication;
  return out;
}

// leader/states.h says which transitions exist; a refused one is a leader bug, not the
// user's: the lifecycle throws, naming the job here, and the job stays as it was.
void Leader::Impl::set_state(JobRec& j, JobState state) {
  const JobState from = j.state();
  try {
    if (!j.life.move_to(state)) return;
  } catch (const IllegalTransition& e) {
    throw IllegalTransition("job " + j.id + " (" + j.spec.name + "): " + e.what());
  }
  announce_state(j, from);
}

void Leader::Impl::head_for(JobRec& j, JobState target, JobState via) {
  const JobState from = j.state();
  try {
    j.life.head_for(target, via);
  } catch (const IllegalTransition& e) {
    throw IllegalTransition("job " + j.id + " (" + j.spec.name + "): " + e.what());
  }
  if (from != via) announce_state(j, from);
}

void Leader::Impl::announce_state(JobRec& j, JobState from) {
  spdlog::info("job {} ({}): {} -> {}", j.id, j.spec.name, to_string(from), to_string(j.state()));
  const json ev = events::StateChanged{{}, std::string(to_string(j.state()))}.to_json();
  notify(j, ev);
  event(j, ev);
  save(j);
}

void Leader::Impl::set_task_state(const JobRec& j, TaskRec& t, TaskState state) {
  if (t.state == state) return;
  if (!legal_transition(t.state, state)) {
    spdlog::error("job {}: {}: illegal state transition {} -> {} refused", j.id, t.name, to_string(t.state),
                  to_string(state));
    return;
  }
  t.state = state;
}

TaskHold Leader::Impl::hold_of(const JobRec& j, const TaskRec& t) const {
  return TaskHold{j.spec.threads_per_task, t.gpus};
}

void Leader::Impl::launch(JobRec& j, std::vector<Placed> placement, const std::vector<std::string>& added_shards) {
  // A start the shared plan sized: its first change in the plan's history.
  if (opt.shared_plan && j.share_admitted) record_plan_change(j, 0, j.spec.workers, j.share);
  if (j.spec.ps_shards_auto || j.spec.partition_size_auto) {
    // The count and the partitions are the job's from now on: recovery places the same
    // shards again, and its checkpoints are per shard and partition.
    std::vector<Placed> added;
    for (const auto& id : added_shards) added.push_back(Placed{id, {}});
    placement.insert(placement.begin() + j.spec.ps_shards, added.begin(), added.end());
    j.spec.ps_shards += static_cast<int>(added.size());
    j.spec.ps_shards_auto = false;
    events::ShardsSpread ev{{}, j.spec.ps_shards, {}, std::nullopt};
    if (j.spec.partition_size_auto) {
      j.spec.partition_size_auto = false;
      if (j.spec.model != ModelKind::kTorchScript) {
        try {
          j.spec.partition_size = planner::auto_partition_size(j.spec, planner::dataset_classes(j.spec));
        } catch (const ConfigError& e) {
          spdlog::warn("job {}: partition_size = \"auto\" keeps {}: {}", j.id, j.spec.partition_size, e.what());
        }
      }
      ev.partition_size = j.spec.partition_size;
    }
    for (int s = 0; s < j.spec.ps_shards; ++s) ev.agents.push_back(placement[static_cast<std::size_t>(s)].agent);
    spdlog::info("job {}: {} PS shards on {}, partitions of at most {} floats", j.id, j.spec.ps_shards,
                 json(ev.agents).dump(), j.spec.partition_size);
    notify(j, ev.to_json());
    event(j, ev.to_json());
  }
  if (!j.data_shards.empty()) {
    // Where the workers went, and how much of each one's shards its agent had cached.
    const auto held = cached_shard_sets();
    events::DataPlaced ev;
    for (std::size_t i = static_cast<std::size_t>(j.spec.ps_shards); i < placement.size(); ++i) {
      const int rank = static_cast<int>(i) - j.spec.ps_shards;
      const auto& id = placement[i].agent;
      const auto cached = j.cached_for(rank, held);
      const auto total = j.cached_for(rank, {{"", nullptr}}).at("");
      const auto it = cached.find(id);
      ev.agents.push_back(id);
      ev.cached_fraction.push_back(it == cached.end() || total == 0 ? 0.0
                                                                     : static_cast<double>(it->second) / static_cast<double>(total));
    }
    spdlog::info("job {}: workers on {}, data set cached {}", j.id, json(ev.agents).dump(), json(ev.cached_fraction).dump());
    notify(j, ev.to_json());
    event(j, ev.to_json());
  }
  j.tasks.clear();
  std::size_t k = 0;
  auto add = [&](TaskKind kind, int index) {
    TaskRec t;
    t.name = std::string(to_string(kind)) + "-" + std::to_string(index);
    t.kind = kind;
    t.index = index;
    t.agent = placement[k].agent;
    t.gpus = placement[k].gpus;
    // A resumed job's workers start after the epochs its checkpoint had finished.
    if (kind == TaskKind::kWorker) t.epochs_done = j.resume.epoch;
    ++k;
    j.tasks.push_back(t);
  };
  for (int s = 0; s < j.spec.ps_shards; ++s) add(TaskKind::kPs, s);
  for (int r = 0; r < j.spec.workers; ++r) add(TaskKind::kWorker, r);
  for (auto& t : j.tasks) agents.take(t.agent, hold_of(j, t));
  set_state(j, JobState::kStarting);
  for (auto& t : j.tasks) {
    if (t.kind == TaskKind::kPs) start_task(j, t, {});
  }
}

// `body`: what only the caller knows (a worker's ps endpoints; what a re-assigned job's
// tasks need: restore_generation, workers_done, init_replica_generation, resume_epoch);
// the rest is the job's and the task's.
void Leader::Impl::start_task(JobRec& j, TaskRec& t, wire::StartTaskBody body) {
  set_task_state(j, t, TaskState::kStarting);
  body.job = j.id;
  body.job_num = j.num;
  body.task = t.name;
  body.kind = t.kind;
  body.index = t.index;
  body.generation = j.generation;
  body.secret = j.secret;
  body.threads = j.spec.threads_per_task;
  body.spec = j.spec;
  body.gpus = t.gpus;
  if (t.kind == TaskKind::kWorker && j.spec.local_group) body.local_group = local_group_of(j, t);
  spdlog::info("job {}: starting {} on agent {} (generation {})", j.id, t.name, t.agent, j.generation);
  send_agent(t.agent, wire::ControlType::kStartTask, body.to_json());
  save(j);
}

// The workers of `j` on t's agent, by rank: t's local group (group/local_group.h). Its
// lowest rank is member 0, the one that pushes; with rank 0 in it, the one that evaluates.
wire::LocalGroupInfo Leader::Impl::local_group_of(const JobRec& j, const TaskRec& t) const {
  wire::LocalGroupInfo g;
  for (const auto& o : j.tasks) {
    if (o.kind != TaskKind::kWorker || o.agent != t.agent || (o.ok_exit && o.name != t.name)) continue;
    if (o.name == t.name) g.rank = static_cast<int>(g.members.size());
    g.members.push_back(o.name);
  }
  return g;
}

std::vector<std::string> Leader::Impl::ps_endpoints(const JobRec& j) const {
  std::vector<std::string> eps;
  for (auto& t : j.tasks) {
    if (t.kind == TaskKind::kPs) eps.push_back(t.address + ":" + std::to_string(t.port));
  }
  return eps;
}

void Leader::Impl::start_worker(JobRec& j, TaskRec& t) {
  wire::StartTaskBody body;
  body.ps = ps_endpoints(j);
  body.resume_epoch = t.epochs_done;
  if (t.name == j.recovery.seed) body.init_replica_generation = j.recovery.seed_generation;
  start_task(j, t, std::move(body));
}

// Every PS shard listens: start the workers. After a re-assignment, a shard that did
// not restore its own checkpoint is rebuilt from the freshest replica: its worker (the
// seed) starts first and initialises it; the others start once it has (a shard keeps
// the first initial values it gets).
void Leader::Impl::start_workers(JobRec& j) {
  if (j.workers_started && j.recovery.seed.empty()) {
    for (const auto& t : j.tasks) {
      if (t.kind == TaskKind::kPs && !t.restored) {
        return fail_job(j, t.name + " lost its state (" + j.recovery.reason +
                               ") and no worker saved a replica to rebuild it from");
      }
    }
  }
  set_state(j, JobState::kRunning);
  for (auto& t : j.tasks) {
    if (t.kind == TaskKind::kWorker && t.state == TaskState::kPending && (j.recovery.seed.empty() || t.name == j.recovery.seed)) start_worker(j, t);
  }
}

// Asks every task of `j` that still runs to stop (on SIGTERM a PS shard writes its
// checkpoint, a worker its replica) and gives up the ones not started yet.
void Leader::Impl::send_stops(JobRec& j) {
  for (auto& t : j.tasks) {
    if (t.state == TaskState::kStarting || t.state == TaskState::kRunning) {
      send_agent(t.agent, wire::ControlType::kStopTask, {{"job", j.id}, {"task", t.name}, {"generation", j.generation}});
    } else if (t.state == TaskState::kPending) {
      set_task_state(j, t, TaskState::kExited);
      t.exit = "never started";
      agents.release(t.agent, hold_of(j, t));
    }
  }
}

// Stops every task of a job that is ending; it ends once they all have.
void Leader::Impl::stop_tasks(JobRec& j) {
  send_stops(j);
  maybe_finish(j);
}

// Moves a job whose tasks have all exited into its terminal state.
void Leader::Impl::maybe_finish(JobRec& j) {
  if (j.terminal() || !j.life.target()) return;
  for (auto& t : j.tasks) {
    if (t.state != TaskState::kExited) return;
  }
  // A succeeding job's model, a failing or cancelled one's latest checkpoint, is
  // collected before it ends (model_collection.cpp).
  if (!j.model.done && models.collect(j)) return;
  j.ended = Clock::now();
  if (j.life.target() == JobState::kSucceeded) planning.record_final(j);
  set_state(j, *j.life.target());
  // A job the shared plan started: its end is the plan's last change of it.
  if (opt.shared_plan && j.share_admitted) {
    record_plan_change(j, j.spec.workers, 0, "ended: " + std::string(to_string(j.state())));
  }
  notify(j, summary(j).to_json());
  event(j, summary(j).to_json());
  if (!j.explore.profile_of.empty()) {
    auto pit = jobs.find(j.explore.profile_of);
    if (pit != jobs.end()) {
      auto& parent = pit->second;
      auto& pend = parent.explore.pending_profiles;
      pend.erase(std::remove(pend.begin(), pend.end(), j.id), pend.end());
      parent.explore.exploration_seconds += j.wall_seconds();
      if (pend.empty() && parent.state() == JobState::kExploring && !parent.life.target()) decide(parent);
    }
  }
  spdlog::info("job {} {}: test accuracy {:.4f}, {} epochs, {:.1f} s{}", j.id, to_string(j.state()), j.test_accuracy,
               j.epochs_done, j.wall_seconds(), j.error.empty() ? "" : ", error: " + j.error);
  trim_series(jobs);
  // Later, from the event loop: a caller may be iterating over the jobs right now.
  if (!retire_posted) {
    retire_posted = true;
    boost::asio::post(io, [w = weak_from_this()] {
      if (auto self = w.lock()) {
        self->retire_posted = false;
        self->retire_jobs();
      }
    });
  }
  try_schedule();
}

void Leader::Impl::fail_job(JobRec& j, const std::string& why) {
  if (j.life.ending()) return;
  spdlog::warn("job {} failed: {}", j.id, why);
  j.error = why;
  head_for(j, JobState::kFailed, JobState::kFailing);
  stop_tasks(j);
}

// A job that never had tasks (the planner found no configuration, its exploration runs
// are gone) ends at once.
void Leader::Impl::fail_unplaced(JobRec& j, const std::string& why) {
  if (j.terminal()) return;
  j.error = why;
  j.life.head_for(JobState::kFailed);
  maybe_finish(j);
}

// Every worker finished with a test accuracy: the shards are stopped, then it succeeds.
void Leader::Impl::succeed_job(JobRec& j) {
  if (j.life.ending()) return;
  head_for(j, JobState::kSucceeded, JobState::kFinishing);
  stop_tasks(j);
}

// A queued job ends at once, a running one through cancelling (every task is stopped
// first), an exploring one with its exploration runs. A job that is already failing
// stays failing; one that is finishing is cancelled.
void Leader::Impl::cancel_job(JobRec& j) {
  if (j.terminal()) return;
  if (j.state() == JobState::kExploring) {
    // maybe_finish of a run takes it out of j.explore.pending_profiles: walk a copy. The job is
    // marked cancelled first, so that its last run's end does not plan and queue it.
    const auto runs = j.explore.pending_profiles;
    j.life.head_for(JobState::kCancelled);
    for (const auto& pid : runs) {
      auto& pj = jobs.at(pid);
      if (pj.state() == JobState::kQueued) {
        queue.remove(pid);
        pj.life.head_for(JobState::kCancelled);
        maybe_finish(pj);
      } else if (!pj.life.ending()) {
        head_for(pj, JobState::kCancelled, JobState::kCancelling);
        stop_tasks(pj);
      }
    }
    j.explore.pending_profiles.clear();
    maybe_finish(j);
  } else if (j.state() == JobState::kQueued) {
    queue.remove(j.id);
    j.life.head_for(JobState::kCancelled);
    maybe_finish(j);
    try_schedule();
  } else if (!j.life.target() || j.life.target() == JobState::kSucceeded) {
    head_for(j, JobState::kCancelled, JobState::kCancelling);
    stop_tasks(j);
  }
}

void Leader::Impl::retire_jobs() {
  // A read-only store could not forget them: they would come back with the next restart.
  if (db && db->read_only()) return;
  const auto gone = jobs.beyond_retention(static_cast<std::size_t>(opt.job_retention));
  if (gone.empty()) return;
  for (const auto& id : gone) persist("removing a retired job", [&] { db->delete_job(jobs.at(id).num); });
  jobs.erase(gone);
  spdlog::info("job retention ({} finished jobs kept): removed {} older finished job{} ({}{})", opt.job_retention,
               gone.size(), gone.size() == 1 ? "" : "s", gone.front(), gone.size() > 1 ? ", …" : "");
}

// ---------------------------------------------------------------- plumbing
void Leader::Impl::on_message(const SessionPtr& s, const std::string& text) {
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const ProtocolError& e) {
    spdlog::warn("control: bad message from {}: {}", s->peer(), e.what());
    std::string id;
    try {
      const auto j = wire::parse_peer_json(text);
      if (j.is_object() && j.contains("id") && j["id"].is_string()) id = j["id"].get<std::string>();
    } catch (...) {
    }
    const bool version = std::string(e.what()).find("not supported") != std::string::npos;
    ++counters.requests[s->kind() == PeerKind::kAgent ? "agent" : "client"];
    reply_error(s, id, version ? wire::error_code::kUnsupportedVersion : wire::error_code::kBadRequest, e.what());
    return;
  }
  ++counters.requests[s->kind() == PeerKind::kAgent ? "agent" : "client"];
  if (!serving()) {
    // A deposed leader (its term may be over) changes nothing: the peer tries the next
    // candidate. Replies and events from agents are dropped; the new leader hears them.
    if (!env.id.empty() && !env.is(wire::ControlType::kReply)) {
      reply_error(s, env.id, wire::error_code::kUnavailable,
                  "this leader candidate no longer serves (term " + std::to_string(ha.term) +
                      " may be over): ask the serving one");
    }
    return;
  }
  try {
    if (s->kind() == PeerKind::kAgent) {
      on_agent_message(s, env);
    } else {
      on_client_message(s, env);
    }
  } catch (const wire::Refused& e) {
    reply_error(s, env.id, e.code(), e.what(), e.field());
  } catch (const wire::BodyError& e) {
    // A body that does not fit its schema (wire/control_bodies.h): refused before it
    // changed anything.
    spdlog::warn("control: bad {} from {}: {}", env.type, s->peer(), e.what());
    reply_error(s, env.id, wire::error_code::kBadRequest, e.what(), e.field());
  } catch (const std::exception& e) {
    spdlog::error("control: handling {} from {}: {}", env.type, s->peer(), e.what());
    reply_error(s, env.id, wire::error_code::kInternal, e.what());
  }
}

void Leader::Impl::on_close(const SessionPtr& s) {
  models.on_replica_closed(s);
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

Leader::Leader(asio::io_context& io, const config::AgentOptions& opt, LeaderTerm term)
    : impl_(std::make_shared<Impl>(io, opt, std::move(term))) {}

void Leader::set_on_agent_registered(std::function<void()> f) { impl_->on_registered = std::move(f); }

Leader::~Leader() { stop(); }

void Leader::start() {
  control::ControlServerOptions so;
  so.bind_address = impl_->opt.listen_address;
  so.port = impl_->opt.listen_port;
  so.agent_token = impl_->opt.agent_token;
  so.client_token = impl_->opt.client_token;
  std::string users = "admin (admin, the client token)";
  for (const auto& u : impl_->opt.users) {
    so.users.push_back({u.token, {u.name, u.admin}});
    users += ", " + u.name + (u.admin ? " (admin)" : " (user)");
  }
  spdlog::info("users: {}", users);
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
  impl_->started_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (impl_->ha.open_store) {
    // A candidate elected through etcd: the state every candidate shares, in etcd.
    impl_->db = impl_->ha.open_store();
  } else if (!impl_->opt.state_dir.empty()) {
    impl_->db = store::RocksDbStore::open((std::filesystem::path(impl_->opt.state_dir) / "db").string());
    if (impl_->db->read_only()) {
      spdlog::warn("the state database {} is on a read-only file system: the leader serves what it holds, and "
                   "refuses new jobs until it is remounted read-write and the agent restarted",
                   impl_->db->location());
    }
  }
  impl_->planning.use_store(impl_->db.get());
  if (impl_->db) {
    impl_->recovery.restore(*impl_->db, impl_->jobs);
    impl_->retire_jobs();  // a store kept by a leader with a larger job_retention
    if (impl_->ha.term > 0) spdlog::info("leader state in {}: {} jobs", impl_->db->location(), impl_->jobs.size());
  }
  if (!impl_->opt.state_dir.empty()) {
    impl_->audit_log = std::make_unique<AuditLog>((std::filesystem::path(impl_->opt.state_dir) / "audit.log").string());
    try {
      impl_->models.open(impl_->opt.state_dir, impl_->opt.model_retention);
      impl_->models.set_replication_timeout(impl_->opt.ha.replication_timeout);
    } catch (const std::exception& e) {
      spdlog::error("{}: the leader keeps no trained models and takes no model uploads", e.what());
    }
  }
  impl_->server = std::make_unique<control::ControlServer>(impl_->io, so, h);
  impl_->server->start();
  impl_->check_heartbeats();
  spdlog::info("leader listening on {}:{}{}; dashboard at {}://{}:{}/", so.bind_address, impl_->server->port(),
               so.tls_cert_file.empty() ? "" : " (TLS, wss://)", so.tls_cert_file.empty() ? "http" : "https",
               so.bind_address, impl_->server->port());
  if (!impl_->opt.state_dir.empty()) {
    // Where it listens, for whoever starts it with an ephemeral port (listen_port = 0).
    const auto port = impl_->server->port();
    const std::string url =
        (so.tls_cert_file.empty() ? "ws://" : "wss://") + so.bind_address + ":" + std::to_string(port);
    const auto path = (std::filesystem::path(impl_->opt.state_dir) / "leader.json").string();
    try {
      write_private_file(path, json{{"url", url}, {"port", port}}.dump() + "\n");
    } catch (const std::exception& e) {
      spdlog::warn("cannot write {}: {}; carrying on", path, e.what());
    }
  }
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
  for (const auto& [id, a] : impl_->agents) n += a.lost ? 0 : 1;
  return n;
}

void Leader::collect_metrics(control::MetricsBuilder& out) const {
  add_leader_metrics(out, impl_->jobs, impl_->agents, impl_->queue.size(), impl_->counters);
}

}  // namespace dltrain::leader
