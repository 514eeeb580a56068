// The agent protocol of the leader (docs/protocol.md): registration and reconciliation
// of the tasks an agent re-reports, heartbeats, and the events and exits of tasks.
#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/errors.h"
#include "common/overloaded.h"
#include "wire/task_event.h"

namespace dltrain::leader {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using SessionPtr = Leader::Impl::SessionPtr;
namespace events = wire::events;

// ---------------------------------------------------------------- agent messages
void Leader::Impl::add_agent_handlers() {
  using T = wire::ControlType;
  agent_api.on(T::kRegister, [this](const SessionPtr& s, const wire::Envelope& env) { on_register(s, env); })
      .on(T::kHeartbeat,
          [this](const SessionPtr& s, const wire::Envelope& env) {
            // The shard cache's figures, and the shards it holds when they changed.
            if (const auto c = env.body.find("shard_cache"); c != env.body.end() && c->is_object()) {
              const auto id = agent_by_session.find(s->id());
              if (id != agent_by_session.end() && agents.find(id->second) != agents.end()) {
                auto& a = agents.at(id->second);
                a.shard_cache = *c;
                if (const auto held = c->find("held"); held != c->end() && held->is_array()) {
                  a.cached_shards.clear();
                  for (const auto& h : *held) {
                    if (h.is_string()) a.cached_shards.insert(h.get<std::string>());
                  }
                  a.shard_cache.erase("held");
                  spdlog::debug("agent {}: its shard cache holds {} shards", a.id, a.cached_shards.size());
                }
              }
            }
            reply(s, env.id, json::object());
          })
      .on(T::kModelDownload, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, models.on_model_download(wire::parse_body<wire::ModelDownloadBody>(env)));
      })
      .on(T::kLinkReport,
          [this](const SessionPtr& s, const wire::Envelope& env) {
            const auto link = wire::parse_body<wire::LinkReportBody>(env);
            auto& a = agents.at(agent_by_session.at(s->id()));
            a.link_bytes_per_sec = link.bytes_per_sec;
            spdlog::info("agent {}: link measured at {:.0f} Mbit/s (round trip {:.2f} ms)", a.id,
                         link.bytes_per_sec * 8 / 1e6, link.rtt_seconds.value_or(0) * 1e3);
            reply(s, env.id, json::object());
          })
      .on(T::kTaskEvent,
          [this](const SessionPtr& s, const wire::Envelope& env) {
            const auto [j, t] = addressed_task(s, env);
            if (j == nullptr) return;
            const auto ev = wire::parse_body<wire::TaskEventBody>(env);
            reply(s, env.id, json::object());
            after_reply("task_event", [&] { on_task_event(*j, *t, ev.event); });
          })
      .on(T::kTaskExit, [this](const SessionPtr& s, const wire::Envelope& env) {
        const auto [j, t] = addressed_task(s, env);
        if (j == nullptr) return;
        const auto exit = wire::parse_body<wire::TaskExitBody>(env);
        reply(s, env.id, json::object());
        after_reply("task_exit", [&] { on_task_exit(*j, *t, exit); });
      });
}

void Leader::Impl::on_agent_message(const SessionPtr& s, const wire::Envelope& env) {
  if (env.is(wire::ControlType::kReply)) {
    if (log_relay.on_reply(env)) return;
    bool taken = false;
    after_reply("a model file's reply", [&] { taken = models.on_reply(env); });
    if (taken) return;
    if (!env.ok) spdlog::warn("agent {} reported an error: {}", s->peer(), env.error.dump());
    return;
  }
  // A standby leader candidate copies the models and uploads (docs/ha.md "Artifacts"):
  // it does not register; once it sent replicate it may read them.
  if (env.is(wire::ControlType::kReplicate)) {
    return models.on_replicate(s, env.id, wire::parse_body<wire::ReplicateBody>(env),
                               [this](const SessionPtr& to, const std::string& id, const json& body) { reply(to, id, body); });
  }
  if ((env.is(wire::ControlType::kModelRead) || env.is(wire::ControlType::kModelDownload)) && models.is_replica(s)) {
    return env.is(wire::ControlType::kModelRead)
               ? reply(s, env.id, models.on_model_read(wire::parse_body<wire::ModelFileRequestBody>(env)))
               : reply(s, env.id, models.on_model_download(wire::parse_body<wire::ModelDownloadBody>(env)));
  }
  if (!env.is(wire::ControlType::kRegister)) {
    auto sid = agent_by_session.find(s->id());
    if (sid == agent_by_session.end()) {
      return reply_error(s, env.id, wire::error_code::kBadRequest, "register first");
    }
    agents.at(sid->second).last_seen = Clock::now();
  }
  if (agent_api.dispatch(s, env)) return;
  reply_error(s, env.id, wire::error_code::kBadRequest, "unknown message type \"" + env.type + "\"", "type");
}

Leader::Impl::Addressed Leader::Impl::addressed_task(const SessionPtr& s, const wire::Envelope& env) {
  auto& agent = agents.at(agent_by_session.at(s->id()));
  const auto ref = wire::parse_body<wire::TaskRefBody>(env);
  const auto& job_id = ref.job;
  // An orphan's exit (any job, known or not) gives its cores back.
  const std::string okey = orphan_key(job_id, ref.task, ref.generation);
  if (env.is(wire::ControlType::kTaskExit) && agent.orphans.count(okey)) {
    const TaskHold hold = agent.orphans[okey];
    agent.orphans.erase(okey);
    agents.release(agent.id, hold);
    spdlog::info("agent {}: orphaned task {} ended", agent.id, okey);
    reply(s, env.id, json::object());
    try_schedule();
    return {};
  }
  auto jit = jobs.find(job_id);
  if (jit == jobs.end()) {
    reply_error(s, env.id, wire::error_code::kNotFound, "unknown job " + job_id, "job");
    return {};
  }
  auto& j = jit->second;
  if (ref.generation != j.generation) {
    reply_error(s, env.id, wire::error_code::kConflict, "stale generation", "generation");
    return {};
  }
  TaskRec* t = j.find_task(ref.task);
  if (t == nullptr || t->agent != agent.id) {
    reply_error(s, env.id, wire::error_code::kNotFound, "unknown task", "task");
    return {};
  }
  // Sent again after a lost connection (the agent resends what was not answered): taken
  // once, by this leader or the one before it (the number is in the job's record).
  if (ref.seq > 0) {
    if (ref.sender == t->delivered_sender && ref.seq <= t->delivered_seq) {
      spdlog::debug("job {}: {} {} #{} from {} again: already taken", j.id, t->name, env.type, ref.seq, agent.id);
      reply(s, env.id, json::object());
      return {};
    }
    t->delivered_sender = ref.sender;
    t->delivered_seq = ref.seq;
  }
  return {&j, t};
}

// Every heartbeat_interval: agents silent for heartbeat_timeout are lost, the recovery
// and queue timers run, requests to agents that did not answer expire.
void Leader::Impl::check_heartbeats() {
  hb_timer.expires_after(opt.heartbeat_interval);
  hb_timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self || ec) return;
    // A leader whose term may be over judges nothing: its agents talk to the next leader
    // now, and what it would conclude (an agent lost, a job to re-assign) is not its to say.
    if (!self->serving()) return self->check_heartbeats();
    const auto now = Clock::now();
    // A refused transition (IllegalTransition, a leader bug) ends this round's checks,
    // logged; the timer goes on, and the job stays as it was.
    try {
      self->log_relay.expire(now);
      self->models.expire(now);
      for (auto& [id, a] : self->agents) {
        if (!a.lost && now - a.last_seen > self->opt.heartbeat_timeout) {
          if (auto s = a.session.lock()) s->close();
          self->recovery.agent_lost(id, "no heartbeat for " + std::to_string(self->opt.heartbeat_timeout.count()) + " ms",
                                    self->jobs.in_order());
        }
      }
      for (JobRec* j : self->jobs.in_order()) {
        try {
          self->recovery.tick(*j, now);
        } catch (const IllegalTransition& e) {
          spdlog::error("recovery of job {}: {}", j->id, e.what());
        }
      }
      self->expire_queued();
      self->notify_waiting();  // e.g. an agent was lost: the cluster is smaller
    } catch (const IllegalTransition& e) {
      spdlog::error("leader: {}", e.what());
    }
    self->check_heartbeats();
  });
}

void Leader::Impl::on_register(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::RegisterBody>(env);
  const std::string& name = b.name;
  const int cores = b.cores;
  auto it = agents.find(name);
  if (it != agents.end() && !it->second.lost && !it->second.session.expired()) {
    const auto current = it->second.session.lock();
    const std::string from = current ? current->peer() : std::string("?");
    // Two machines with one host name (cloned VMs, containers): say so on both sides.
    spdlog::warn("refusing a second agent named \"{}\" from {}: one is registered from {}; give each machine its "
                 "own name (the name key of its agent configuration)",
                 name, s->peer(), from);
    return reply_error(s, env.id, wire::error_code::kConflict,
                       "an agent named \"" + name + "\" is already registered (from " + from +
                           "); set a unique name = \"...\" in this agent's configuration (it defaults to the host "
                           "name)",
                       "name");
  }
  AgentRec a;
  a.id = name;
  a.address = b.advertise_address;
  a.cores = cores;
  a.free_cores = cores;
  a.memory_mb = b.memory_mb;
  a.hardware_class = b.hardware_class;
  a.metrics_endpoint = b.metrics_endpoint.value_or("");
  a.serves_shards = b.shard_cache_bytes.value_or(1) > 0;
  a.gpus = b.gpus;
  for (const auto& g : a.gpus) a.free_gpus.push_back(g.index);
  std::sort(a.free_gpus.begin(), a.free_gpus.end());
  a.session = s;
  a.last_seen = Clock::now();
  // Reconcile with the tasks the agent says it still runs (after a reconnect, or after
  // the leader restarted): a task the leader still counts on carries on; any other is an
  // orphan — stopped, its cores held until its exit is reported. A task listed as
  // "exited" ended while the link was down; its exit report follows. Tasks the leader
  // counted on that the agent does not list were lost with the link.
  std::set<std::string> reported;
  for (const auto& rt : b.tasks) {
    const std::string &jid = rt.job, &tname = rt.task;
    reported.insert(jid + "/" + tname);
    auto jit = jobs.find(jid);
    TaskRec* t = jit == jobs.end() ? nullptr : jit->second.find_task(tname);
    const bool live =
        t != nullptr && t->agent == name && t->state != TaskState::kExited && rt.generation == jit->second.generation;
    // What it holds: what the agent says it was started with (an agent too old to say:
    // its job's cores per task, or 1 for a job the leader no longer knows).
    TaskHold hold{rt.threads > 0 ? rt.threads : jit == jobs.end() ? 1 : jit->second.spec.threads_per_task, rt.gpus};
    if (live && hold.gpus.empty()) hold.gpus = t->gpus;
    a.take(hold);
    if (!live && rt.exited) {
      a.orphans[orphan_key(jid, tname, rt.generation)] = hold;  // its exit report frees them
    } else if (!live) {
      a.orphans[orphan_key(jid, tname, rt.generation)] = hold;
      order(s, "l" + std::to_string(next_req++), wire::ControlType::kStopTask, wire::TaskRefBody{{}, jid, tname, rt.generation, {}, 0, {}}.to_json());
      spdlog::warn("agent {} still runs {}/{}, which the leader no longer counts on: stopping it", name, jid, tname);
    }
  }
  // Tasks the leader placed there but has not started yet hold their cores too.
  for (const auto& jid : jobs.order()) {
    auto& j = jobs.at(jid);
    if (j.terminal()) continue;
    for (auto& t : j.tasks) {
      if (t.agent == name && t.state == TaskState::kPending) a.take(hold_of(j, t));
    }
  }
  // Tasks the leader counts on that the agent no longer has: only when a new session
  // replaced one that was never declared lost (a lost agent's tasks were already
  // accounted for by agent_lost), or for a restored job the leader is adopting.
  std::vector<std::pair<std::string, std::string>> gone;  // job, why
  for (const auto& jid : jobs.order()) {
    auto& j = jobs.at(jid);
    if (j.terminal()) continue;
    const bool adopting = Recovery::adopting(j);
    for (auto& t : j.tasks) {
      if (t.agent == name && (t.state == TaskState::kStarting || t.state == TaskState::kRunning) && !reported.count(jid + "/" + t.name) &&
          ((it != agents.end() && !it->second.lost) || adopting)) {
        set_task_state(j, t, TaskState::kExited);
        t.exit = "ended while its agent was disconnected";
        gone.emplace_back(jid, t.name + " on agent " + name + " " + t.exit);
      }
    }
  }
  agents[name] = a;
  agent_by_session[s->id()] = name;
  spdlog::info("agent {} registered from {} ({} cores, {} MiB, {} GPUs, advertises {})", name, s->peer(), cores,
               a.memory_mb, a.gpus.size(), a.address);
  json welcome{{"agent_id", name}, {"heartbeat_interval_ms", opt.heartbeat_interval.count()}, {"leader", opt.name}};
  if (ha.term > 0) welcome["term"] = ha.term;  // the agent refuses a leader of an older term than it knows
  reply(s, env.id, welcome);
  if (on_registered) on_registered();
  for (auto& [jid, why] : gone) recovery.tasks_gone(jobs.at(jid), why);
  // A restored job whose agents are all back is adopted now.
  for (JobRec* j : jobs.in_order()) recovery.agent_back(*j);
  for (auto& [id, j] : jobs) recovery.try_resume(j);
  try_schedule();
}

// A PS shard listens: at its first start the job may start its workers; after a restart
// it must be where the workers expect it, with the state they need.
void Leader::Impl::on_ps_listening(JobRec& j, TaskRec& t, const json& raw) {
  const auto ev = events::Listening::from_json(raw);
  const int port = ev.port;
  const std::string address = ev.address.value_or(agents.at(t.agent).address);
  const bool restored = ev.checkpoint && ev.checkpoint->restored;
  if (t.restarts > 0) {
    // A restarted shard: it must be where the workers expect it (moving it would need a
    // new generation and new workers, which nothing does yet).
    if (restored) {
      t.recovery = "restored from its checkpoint (" + std::to_string(ev.checkpoint->partitions.value_or(0)) +
                   " partitions, " + std::to_string(ev.checkpoint->pushes.value_or(0)) + " pushes)";
    } else if (ev.checkpoint) {
      t.recovery = "checkpoint refused (" + ev.checkpoint->error.value_or("?") + "); rebuilt from the workers' replicas";
    } else {
      t.recovery = "no checkpoint yet; rebuilt from the workers' replicas";
    }
    spdlog::warn("job {}: {} on {} listens again on {}:{}, {}", j.id, t.name, t.agent, address, port, t.recovery);
    const json e = events::PsRecovered{{}, t.name, address + ":" + std::to_string(port), t.recovery}.to_json();
    event(j, e);
    notify(j, e);
    if (!restored && j.state() == JobState::kRunning) {
      // The shard forgot which workers finished; one that has already exited cannot tell
      // it again, so worker 0 would wait for it until its finish timeout.
      for (const auto& w : j.tasks) {
        if (w.kind == TaskKind::kWorker && w.state == TaskState::kExited && w.ok_exit) {
          set_task_state(j, t, TaskState::kRunning);
          t.port = port;
          t.address = address;
          return fail_job(j, t.name + " on agent " + t.agent + " restarted without its state (" + t.recovery +
                                 ") after " + w.name + " had finished; the other workers cannot learn that");
        }
      }
    }
    if (t.port > 0 && (port != t.port || address != t.address) && j.state() == JobState::kRunning) {
      set_task_state(j, t, TaskState::kRunning);
      return fail_job(j, t.name + " on agent " + t.agent + " restarted on " + address + ":" + std::to_string(port) +
                             " instead of " + t.address + ":" + std::to_string(t.port) +
                             "; its workers cannot follow it there");
    }
  }
  set_task_state(j, t, TaskState::kRunning);
  t.port = port;
  t.address = address;
  t.restored = restored;
  save(j);
  if (j.state() == JobState::kStarting &&
      std::all_of(j.tasks.begin(), j.tasks.end(), [](auto& x) { return x.kind != TaskKind::kPs || x.port > 0; })) {
    start_workers(j);
  }
}

namespace {

// The worker's counters in this generation (bytes_pushed / bytes_pulled, cumulative per
// process) from any event that carries them.
void note_bytes(JobRec& j, const TaskRec& t, const json& ev) {
  const auto b = events::ByteCounters::from_json(ev);
  if (b.bytes_pushed) j.bytes.pushed[t.index] = *b.bytes_pushed;
  if (b.bytes_pulled) j.bytes.pulled[t.index] = *b.bytes_pulled;
}

}  // namespace

void Leader::Impl::on_task_event(JobRec& j, TaskRec& t, const json& ev) {
  std::optional<events::TaskEvent> parsed;
  try {
    parsed = events::parse_task_event(ev, t.kind);
  } catch (const json::exception& e) {
    // Its agent relayed it as it came; it changes nothing here.
    spdlog::warn("job {}: {} reported a malformed {} event: {}", j.id, t.name, events::kind_of(ev), e.what());
    return;
  }
  if (!parsed) return;  // a kind this leader does not know
  const bool worker = t.kind == TaskKind::kWorker;
  if (worker) note_bytes(j, t, ev);
  std::visit(Overloaded{
                 [&](const events::Listening&) {
                   if (!worker) on_ps_listening(j, t, ev);
                 },
                 [&](const events::Started& e) { on_started(j, t, e); },
                 [&](const events::WorkerStopped& e) {
                   if (!worker) return;
                   t.replica = e.replica;
                   t.replica_generation = j.generation;
                   t.epochs_done = std::max(t.epochs_done, e.epochs_done.value_or(0));
                 },
                 [&](const events::Restarting& r) {
                   t.restarts = r.attempt.value_or(t.restarts + 1);
                   if (worker) {
                     spdlog::warn("job {}: {} on {} {}; restart {} of {}, resuming after epoch {}", j.id, t.name,
                                  t.agent, r.reason, t.restarts, r.max_restarts, r.resume_epoch.value_or(0));
                   } else {
                     spdlog::warn("job {}: {} on {} {}; restart {} of {}, from its latest checkpoint", j.id, t.name,
                                  t.agent, r.reason, t.restarts, r.max_restarts);
                   }
                   event(j, ev);
                 },
                 [&](const events::TaskError& e) { t.last_error = e.message; },
                 [&](const events::Left& e) {
                   spdlog::info("job {}: {} left after {} steps; {} workers still train", j.id, t.name, e.steps,
                                e.members);
                   json stored = ev;
                   stored["task"] = t.name;
                   event(j, stored);
                 },
                 [&](const events::PsResync& r) {
                   t.resyncs = r.resyncs.value_or(t.resyncs + 1);
                   spdlog::info("job {}: {} reconnected to PS shard {} and resynced ({})", j.id, t.name, r.shard,
                                r.reason);
                   json e = ev;
                   e["task"] = t.name;
                   event(j, e);
                 },
                 [&](const events::Progress& p) {
                   if (worker) on_progress(j, t, p);
                 },
                 [&](const events::Profile& p) {
                   if (!worker) return;
                   j.explore.profile_ips[t.index] = p.images_per_sec;
                   if (p.eval_seconds) j.explore.profile_eval_seconds = *p.eval_seconds;
                 },
                 [&](const events::Done& d) {
                   if (!worker) return;
                   if (d.traffic) j.figures.traffic[t.index] = *d.traffic;
                   if (d.traffic_after_warmup) j.figures.traffic_after_warmup[t.index] = *d.traffic_after_warmup;
                   if (d.skipped_images) j.figures.skipped_images[t.index] = *d.skipped_images;
                 },
                 [&](const events::EpochEnd& e) {
                   if (worker) on_epoch_end(j, t, e, ev);
                 },
                 [](const auto&) {}},
             *parsed);
  const bool relayed = std::visit([](const auto& e) { return events::kRelayedToFollowers<std::decay_t<decltype(e)>>; },
                                  *parsed);
  if (relayed) {
    json fwd = ev;
    fwd["task"] = t.name;
    notify(j, fwd);
  }
}

void Leader::Impl::on_started(JobRec& j, TaskRec& t, const events::Started& e) {
  set_task_state(j, t, TaskState::kRunning);
  if (t.kind != TaskKind::kWorker) return;
  // Its steps are known from its start, before its first progress report.
  t.steps_per_epoch = e.steps_per_epoch;
  // What a new worker costs the job (the shared plan's resize cost): its data and model.
  j.worker_start_seconds = std::max(j.worker_start_seconds, e.load_seconds);
  // A worker has taken the shards' parameters: from now on their state is training.
  if (!j.workers_started) {
    j.workers_started = true;
    save(j);
  }
  if (Recovery::seed_started(j, t)) {
    // The seed has initialised the rebuilt shards from its replica: the others follow.
    spdlog::info("job {}: {} initialised the shards from its replica; starting the other workers", j.id, t.name);
    for (auto& w : j.tasks) {
      if (w.kind == TaskKind::kWorker && w.state == TaskState::kPending) start_worker(j, w);
    }
  }
  // An elastic job whose workers all run can be resized now: the shared plan looks again
  // (jobs that arrived while it started may be waiting for its workers). Later, from the
  // event loop: the caller holds references into this job's tasks, which a grow appends to.
  if (opt.shared_plan && j.spec.elastic.on() &&
      std::all_of(j.tasks.begin(), j.tasks.end(),
                  [](const TaskRec& w) { return w.kind != TaskKind::kWorker || w.state == TaskState::kRunning; })) {
    boost::asio::post(io, [w = weak_from_this()] {
      if (auto self = w.lock()) self->try_schedule();
    });
  }
}

void Leader::Impl::on_progress(JobRec& j, TaskRec& t, const events::Progress& p) {
  record_series(j, t, p);
  t.global_step = p.global_step;
  t.steps_per_epoch = p.steps_per_epoch;
  if (!j.eta_base.training_since) {
    j.eta_base.training_since = Clock::now();
    j.eta_base.progress_at_training_since = j.progress().value_or(0);
  }
  std::set<std::string> before;
  for (const auto& w : j.tasks) {
    if (w.straggler) before.insert(w.name);
  }
  mark_stragglers(j, opt.straggler_factor);
  for (const auto& w : j.tasks) {
    if (w.straggler && !before.count(w.name)) {
      spdlog::warn("job {}: {} on {} is a straggler: step {}, more than {}x behind the most advanced worker", j.id,
                   w.name, w.agent, w.global_step, opt.straggler_factor);
    }
  }
}

void Leader::Impl::on_epoch_end(JobRec& j, TaskRec& t, const events::EpochEnd& e, const json& ev) {
  record_series(j, t, e);
  t.epochs_done = std::max(t.epochs_done, e.epoch);
  t.global_step = std::max(t.global_step, static_cast<std::int64_t>(e.epoch) * t.steps_per_epoch);
  j.figures.images_per_sec[t.index] = e.images_per_sec;
  j.figures.epoch_seconds[t.index] = e.epoch_seconds;
  if (e.skipped_images) j.figures.skipped_images[t.index] = *e.skipped_images;
  if (t.index == 0) {
    j.epochs_done = e.epoch;
    if (e.test_accuracy) j.test_accuracy = *e.test_accuracy;
    planning.record_epoch(j, e);
    json stored = ev;
    stored["task"] = t.name;
    event(j, stored);
  }
  save(j);  // where a re-assigned worker resumes, also after a leader restart
}

// Every worker finished (exit 0): the job succeeds, with the test accuracy worker 0 reported.
void Leader::Impl::maybe_succeed(JobRec& j) {
  const bool all_done = std::all_of(j.tasks.begin(), j.tasks.end(), [](auto& x) {
    return x.kind != TaskKind::kWorker || (x.state == TaskState::kExited && x.ok_exit);
  });
  if (!all_done || j.state() != JobState::kRunning) return;
  if (j.test_accuracy < 0 && !j.spec.profile) return fail_job(j, "workers finished without reporting a test accuracy");
  succeed_job(j);
}

void Leader::Impl::on_task_exit(JobRec& j, TaskRec& t, const wire::TaskExitBody& b) {
  if (t.state == TaskState::kExited) return;  // orphans are handled in addressed_task
  set_task_state(j, t, TaskState::kExited);
  t.exit = b.describe;
  t.ok_exit = b.exit_code == 0 && b.signal == 0;
  if (t.last_error.empty()) t.last_error = b.last_error;
  agents.release(t.agent, hold_of(j, t));
  spdlog::info("job {}: {} on {} {}", j.id, t.name, t.agent, t.exit);
  if (on_worker_left(j, t)) return;  // an elastic job's scale-down
  save(j);
  if (j.life.target().has_value()) return maybe_finish(j);
  if (b.agent_stopping) {
    // Its agent is shutting down (systemctl stop/restart, an upgrade): as if it were
    // lost, except that the leader knows at once. Nothing is placed there any more; a
    // restarted agent registers afresh.
    if (auto a = agents.find(t.agent); a != agents.end()) a->second.stopping = true;
    if (j.state() == JobState::kRecovering) return recovery.try_resume(j);
    if (!(t.kind == TaskKind::kWorker && t.ok_exit)) {
      return recovery.tasks_lost(j, t.name + " stopped with its agent " + t.agent + ", which is shutting down");
    }
  }
  if (j.state() == JobState::kRecovering) {
    // Stopped for the re-assignment. A worker that had just finished (exit 0 after its
    // "done") stays finished; its rank is passed to the new shards.
    return recovery.try_resume(j);
  }
  if (t.kind == TaskKind::kWorker && t.ok_exit) return maybe_succeed(j);
  std::string why = t.name + " on agent " + t.agent + " " + t.exit;
  if (!t.last_error.empty()) why += ": " + t.last_error;
  if (!j.failure) {
    events::Failure f;
    f.task = t.name;
    f.agent = t.agent;
    f.cause = b.cause.value_or(events::classify_exit(b.exit_code, b.signal, "", false));
    if (b.signal != 0) {
      f.signal = b.signal;
    } else {
      f.exit_code = b.exit_code;
    }
    f.message = why;
    f.last_lines = b.last_lines;
    j.failure = std::move(f);
  }
  fail_job(j, why);
}

}  // namespace dltrain::leader
