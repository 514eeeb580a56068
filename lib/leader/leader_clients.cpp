// The client protocol of the leader: submit, plan, history, list/status, agents, follow
// and cancel (docs/protocol.md, "Control messages"). Every decision is the leader's; the
// client only prints what comes back.
#include <algorithm>
#include <chrono>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/errors.h"
#include "common/secret.h"
#include "data/fetch.h"
#include "planner/policy.h"

namespace dltrain::leader {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using SessionPtr = Leader::Impl::SessionPtr;
namespace events = wire::events;

// ---------------------------------------------------------------- client messages
// The validated job of a submit or plan request (`b`, its body), or nullopt after replying
// the error.
std::optional<JobSpec> Leader::Impl::parse_submitted(const SessionPtr& s, const wire::Envelope& env,
                                                     const wire::SubmitBody& b, const std::string& manifest,
                                                     std::vector<JobRec::DataShard>* data_shards) {
  try {
    // An uploaded model file is checked in its stead (model_collection.cpp).
    std::string uploaded;
    if (b.model_sha256) {
      const auto path = models.uploaded(*b.model_sha256);
      if (!path) {
        reply_error(s, env.id, wire::error_code::kInvalidJob,
                    "model_file: the leader has no uploaded file " + *b.model_sha256 +
                        " (dltrain submit uploads the model file before it submits the job)",
                    "model_file");
        return std::nullopt;
      }
      uploaded = *path;
    }
    auto spec = parse_job_toml(*b.job_toml, b.base_dir, true, uploaded);
    if (!manifest.empty() && spec.dataset == DatasetKind::kShards) {
      const auto m = data::parse_manifest(manifest, data::join_url(spec.data, data::kManifestName));
      apply_manifest(spec, m);
      if (data_shards) {
        for (const auto& sh : m.train.shards) data_shards->push_back({sh.sha256, sh.bytes, sh.samples});
      }
    }
    if (b.model_sha256 && spec.model == ModelKind::kTorchScript) spec.model_sha256 = *b.model_sha256;
    // Starting from a job's model reads it: its owner's or an admin's to do.
    if (!spec.init_from.empty() && !b.init_sha256 &&
        !may_act(s, env.id, spec.init_from, "start from the model of", "init_from")) {
      return std::nullopt;
    }
    if (!spec.init_from.empty()) models.resolve_init_from(b, spec);  // throws wire::Refused
    // A job whose PS shard cannot fit on any agent is refused now, not when it is placed.
    if (auto why = spec.workers_auto ? std::nullopt : planning.ps_memory_problem(spec)) {
      reply_error(s, env.id, wire::error_code::kInvalidJob, *why, "workers");
      return std::nullopt;
    }
    return spec;
  } catch (const ConfigError& e) {
    reply_error(s, env.id, wire::error_code::kInvalidJob, e.what(), e.field());
    return std::nullopt;
  }
}

void Leader::Impl::add_client_handlers() {
  using T = wire::ControlType;
  const auto job_query = [this](void (Impl::*handle)(const SessionPtr&, const wire::Envelope&, JobRec&)) {
    return [this, handle](const SessionPtr& s, const wire::Envelope& env) {
      with_job(s, env, [&](JobRec& j) { (this->*handle)(s, env, j); });
    };
  };
  const auto plain = [this](void (Impl::*handle)(const SessionPtr&, const wire::Envelope&)) {
    return [this, handle](const SessionPtr& s, const wire::Envelope& env) { (this->*handle)(s, env); };
  };
  client_api.on(T::kSubmit, plain(&Impl::on_submit))
      .on(T::kPlan, plain(&Impl::on_plan))
      .on(T::kHistory, plain(&Impl::on_history))
      .on(T::kList, [this](const SessionPtr& s, const wire::Envelope& env) {
        on_list(s, env, wire::parse_body<wire::ListBody>(env));
      })
      .on(T::kStatus, [this](const SessionPtr& s, const wire::Envelope& env) {
        // status without a job is list's short form.
        if (!wire::parse_body<wire::JobQueryBody>(env).job) return on_list(s, env, wire::ListBody{});
        with_job(s, env, [&](JobRec& j) { reply(s, env.id, status_json(j)); });
      })
      .on(T::kCancel, job_query(&Impl::on_cancel))
      .on(T::kScale, job_query(&Impl::on_scale))
      .on(T::kClusterPlan, [this](const SessionPtr& s, const wire::Envelope& env) { reply(s, env.id, cluster_plan_json()); })
      .on(T::kFollow, job_query(&Impl::on_follow))
      .on(T::kAgents, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, {{"agents", agents_json()}, {"leader", leader_json()}});
      })
      .on(T::kLogs, plain(&Impl::on_logs))
      .on(T::kModels, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, models.on_models(wire::parse_body<wire::ModelsQueryBody>(env)));
      })
      .on(T::kModelRead, [this](const SessionPtr& s, const wire::Envelope& env) {
        const auto b = wire::parse_body<wire::ModelFileRequestBody>(env);
        if (may_act(s, env.id, b.job, "read the model of", "job")) reply(s, env.id, models.on_model_read(b));
      })
      .on(T::kModelUpload, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, models.on_model_upload(wire::parse_body<wire::ModelUploadBody>(env)));
      })
      .on(T::kResume, plain(&Impl::on_resume))
      .on(T::kSeries, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, series_reply(jobs, wire::parse_body<wire::JobQueryBody>(env)));
      })
      .on(T::kEvents, [this](const SessionPtr& s, const wire::Envelope& env) {
        reply(s, env.id, events_reply(jobs, db.get(), wire::parse_body<wire::EventsBody>(env)));
      });
}

void Leader::Impl::on_client_message(const SessionPtr& s, const wire::Envelope& env) {
  audit_request(s, env);
  if (client_api.dispatch(s, env)) return;
  reply_error(s, env.id, wire::error_code::kBadRequest, "unknown message type \"" + env.type + "\"", "type");
}

void Leader::Impl::with_manifest(const SessionPtr& s, const wire::Envelope& env, const wire::SubmitBody& b,
                                 std::function<void(const std::string&)> then) {
  std::string url;
  try {
    const auto spec = parse_job_toml(*b.job_toml, b.base_dir, false);
    if (spec.dataset == DatasetKind::kShards) url = data::join_url(spec.data, data::kManifestName);
  } catch (const ConfigError&) {
    // parse_submitted replies the error
  }
  if (url.empty()) return then("");
  if (data::is_local_url(url)) {
    std::string text;
    try {
      text = data::fetch_text(url, data::kMaxManifestBytes, {});
    } catch (const std::exception&) {
      // parse_job_toml names the file and the problem
    }
    return then(text);
  }
  std::erase_if(manifest_reads, [](ManifestRead& r) {  // those that ended
    if (!r.done->load()) return false;
    r.thread.join();
    return true;
  });
  data::FetchOptions fo;
  fo.attempts = 3;
  fo.connect_timeout_s = 5;
  fo.stall_timeout_s = 10;
  fo.s3 = {opt.s3_endpoint, opt.s3_region, opt.s3_credentials_file, ""};
  fo.log = [](const std::string& line) { spdlog::warn("manifest: {}", line); };
  spdlog::info("reading the manifest {} for a submitted job", url);
  auto done = std::make_shared<std::atomic<bool>>(false);
  manifest_reads.push_back({std::thread([w = weak_from_this(), &io = io, url, fo, s, env, then = std::move(then), done] {
    std::string text, error;
    try {
      text = data::fetch_text(url, data::kMaxManifestBytes, fo);
      if (text.empty()) error = url + " is empty";
    } catch (const std::exception& e) {
      error = e.what();
    }
    boost::asio::post(io, [w, s, env, text = std::move(text), error = std::move(error), then] {
      auto self = w.lock();
      if (!self) return;
      if (!error.empty()) {
        return self->reply_error(s, env.id, wire::error_code::kInvalidJob, "data: the manifest cannot be read: " + error, "data");
      }
      then(text);
    });
    done->store(true);
  }), done});
}

void Leader::Impl::on_plan(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::SubmitBody>(env);
  with_manifest(s, env, b, [this, s, env, b](const std::string& manifest) { plan_submitted(s, env, b, manifest); });
}

void Leader::Impl::plan_submitted(const SessionPtr& s, const wire::Envelope& env, const wire::SubmitBody& b,
                                  const std::string& manifest) {
  const auto parsed = parse_submitted(s, env, b, manifest);
  if (!parsed) return;
  if (const auto why = gpu_refusal(*parsed)) {
    return reply_error(s, env.id, wire::error_code::kInfeasible, *why, "gpus_per_worker");
  }
  reply(s, env.id, planner::to_json(planning.plan_for(*parsed, 0)));
}

void Leader::Impl::on_history(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::HistoryBody>(env);
  json rows = json::array();
  if (db) {
    for (const auto& o : db->history(b.model, b.dataset)) rows.push_back(o);
  }
  reply(s, env.id, {{"observations", rows}, {"persistent", db != nullptr}});
}

void Leader::Impl::on_list(const SessionPtr& s, const wire::Envelope& env, const wire::ListBody& b) {
  // The latest `limit` jobs, newest first while they are collected, so that a limit
  // or the size bound leaves out the oldest; sent in submission order.
  std::vector<json> latest;
  std::size_t bytes = 0;
  bool size_bound = false;
  for (const JobRec* j : jobs.newest(static_cast<std::size_t>(std::max<std::int64_t>(0, b.limit)))) {
    json st = status_json(*j);
    bytes += st.dump().size() + 1;
    if (bytes > wire::kMaxControlMessage / 2) {
      size_bound = true;
      break;
    }
    latest.push_back(std::move(st));
  }
  json arr = json::array();
  for (auto it = latest.rbegin(); it != latest.rend(); ++it) arr.push_back(std::move(*it));
  const std::size_t total = jobs.size();
  reply(s, env.id,
        {{"jobs", std::move(arr)},
         {"total", total},
         {"omitted", total - latest.size()},
         {"size_bound", size_bound},
         {"leader", leader_json()}});
}

void Leader::Impl::with_job(const SessionPtr& s, const wire::Envelope& env, const std::function<void(JobRec&)>& handle) {
  const auto query = wire::parse_body<wire::JobQueryBody>(env);
  if (!query.job) {
    return reply_error(s, env.id, wire::error_code::kBadRequest, env.type + " needs \"job\" (string)", "job");
  }
  const std::string& jid = *query.job;
  auto it = jobs.find(jid);
  if (it == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + jid + "\"", "job");
  handle(it->second);
}

void Leader::Impl::on_follow(const SessionPtr& s, const wire::Envelope& env, JobRec& j) {
  reply(s, env.id, status_json(j));
  if (j.terminal()) {
    s->send(wire::make_event(summary(j).to_json()));
  } else {
    j.followers.push_back(s);
    if (j.state() == JobState::kQueued) s->send(wire::make_event(waiting_event(j)));
  }
}

// A cuda job whose workers could not all have their GPUs even on an idle cluster is
// refused at once, with the numbers (unlike cores, which agents joining later may bring,
// a GPU job is sized to the GPUs registered now: docs/gpu.md).
std::optional<std::string> Leader::Impl::gpu_refusal(const JobSpec& spec) const {
  if (spec.device != Device::kCuda) return std::nullopt;
  const auto caps = agents.capacities();
  int largest = 0;
  std::string per_agent;
  for (const auto& a : caps) {
    largest = std::max(largest, static_cast<int>(a.free_gpus.size()));
    per_agent += (per_agent.empty() ? "" : ", ") + a.id + ": " + std::to_string(a.free_gpus.size());
  }
  const std::string where = caps.empty() ? "no agent is registered"
                                         : std::to_string(caps.size()) + " agent" + (caps.size() == 1 ? "" : "s") +
                                               " (" + per_agent + " GPUs)";
  if (spec.gpus_per_worker > largest) {
    return "device = \"cuda\" with gpus_per_worker = " + std::to_string(spec.gpus_per_worker) +
           ": no agent offers that many GPUs (the most on one agent is " + std::to_string(largest) + "; " + where +
           ")";
  }
  const int workers = spec.workers_auto ? 1 : spec.workers;
  if (!fits(caps, std::vector<TaskNeed>(static_cast<std::size_t>(workers), TaskNeed{0, spec.gpus_per_worker, true, {}}))) {
    return "device = \"cuda\": " + std::to_string(workers) + " workers x " + std::to_string(spec.gpus_per_worker) +
           " GPUs = " + std::to_string(workers * spec.gpus_per_worker) + " GPUs, more than the cluster can give (" +
           std::to_string(agents.total_gpus()) + " GPUs on " + where + ")";
  }
  return std::nullopt;
}

std::optional<std::string> Leader::Impl::reregistering() {
  std::optional<Clock::time_point> until;
  std::set<std::string> missing;
  int restored = 0;
  for (const JobRec* j : jobs.in_order()) {
    if (!Recovery::adopting(*j)) continue;
    ++restored;
    until = std::max(until.value_or(*j->recovery.adopt_until), *j->recovery.adopt_until);
    for (const auto& t : j->tasks) {
      if (!t.agent.empty() && !agents.live(t.agent)) missing.insert(t.agent);
    }
  }
  if (!until) return std::nullopt;
  const auto left = std::chrono::ceil<std::chrono::seconds>(std::max(Clock::duration::zero(), *until - Clock::now()));
  std::string names;
  for (const auto& a : missing) names += (names.empty() ? "" : ", ") + a;
  return "the agents are re-registering with this leader, which restored " + std::to_string(restored) +
         " running job" + (restored == 1 ? "" : "s") + (names.empty() ? "" : " and waits for " + names) +
         " (up to " + std::to_string(left.count()) + " s more): retry then";
}

void Leader::Impl::on_submit(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::SubmitBody>(env);
  with_manifest(s, env, b, [this, s, env, b](const std::string& manifest) {
    JobRec j;
    const auto parsed = parse_submitted(s, env, b, manifest, &j.data_shards);
    if (!parsed) return;
    j.spec = *parsed;
    j.owner = s->identity().user;
    accept_job(s, env.id, std::move(j), b.follow, json::object());
  });
}

void Leader::Impl::accept_job(const SessionPtr& s, const std::string& req, JobRec j, bool follow, const json& extra) {
  const JobSpec spec = j.spec;  // a copy: j moves into the job table below
  if (const auto why = quota_refusal(j.owner, spec)) {
    return reply_error(s, req, wire::error_code::kInfeasible, why->message, why->field);
  }
  // Capacity this leader does not know yet (agents re-registering) is no reason to refuse.
  const auto registering = reregistering();
  if (const auto why = gpu_refusal(spec)) {
    if (registering) return reply_error(s, req, wire::error_code::kUnavailable, *why + "; " + *registering, "gpus_per_worker");
    return reply_error(s, req, wire::error_code::kInfeasible, *why, "gpus_per_worker");
  }
  const bool automatic = spec.workers_auto || spec.batch_auto || spec.compression.method_auto;
  std::optional<planner::Plan> p;
  if (automatic) {
    p = planning.plan_for(spec, 0);
    if (!p->feasible && p->explore.empty()) {
      if (registering) return reply_error(s, req, wire::error_code::kUnavailable, "planner: " + p->explanation + "; " + *registering);
      return reply_error(s, req, wire::error_code::kInfeasible, "planner: " + p->explanation);
    }
  }
  jobs.number(j);
  j.submitted = Clock::now();
  j.submitted_unix = unix_now();
  j.secret = new_job_secret_hex();
  // An automatic job the planner decides at once is planning until then (decide).
  if (automatic && p->explore.empty()) j.life = JobLifecycle(JobState::kPlanning);
  if (follow) j.followers.push_back(s);
  const std::string id = j.id;
  if (db) {
    // A job is accepted only once it is stored: a leader restarted later must know it.
    // When the store refuses (a full disk, a read-only file system) the submit is
    // refused with the cause, and nothing of the job is kept.
    // The counter first: should the job record then fail, a restarted leader only skips
    // a number; it never finds a job the client was told was refused.
    try {
      db->put_meta("next_job", std::to_string(jobs.next_number()));
      db->put_job(j.num, stored_record(j));
    } catch (const std::exception& e) {
      jobs.unnumber(j);
      spdlog::error("job submission refused: the state database cannot store it: {}", e.what());
      return reply_error(s, req, wire::error_code::kUnavailable,
                         std::string("the leader cannot store the job, so it does not accept it: ") + e.what() +
                             ". Running jobs carry on; list, status and history still answer");
    }
  }
  auto& job = jobs.add(std::move(j));
  spdlog::info("job {} ({}) submitted: {} workers, {} PS shards, batch {}, {} epochs{}", id, job.spec.name,
               job.spec.workers_auto ? "auto" : std::to_string(job.spec.workers),
               job.spec.ps_shards_auto ? "auto" : std::to_string(job.spec.ps_shards),
               job.spec.batch_auto ? "auto" : std::to_string(job.spec.batch_size), job.spec.epochs,
               job.resume.from.empty() ? std::string()
                                        : ", resuming " + job.resume.from + " from its checkpoint " +
                                              job.resume.checkpoint + " at epoch " + std::to_string(job.resume.epoch + 1));
  json r = extra;
  r["job"] = id;
  if (const auto w = compression_warnings(job.spec); !w.empty()) {
    std::string text;
    for (const auto& x : w) text += (text.empty() ? "" : "; ") + x;
    r["warning"] = text;
  }
  if (automatic && !p->explore.empty()) {
    job.explore.plan = planner::to_json(*p);
    r["state"] = to_string(JobState::kExploring);
    reply(s, req, r);
    explore(job, p->explore);
  } else if (automatic) {
    r["state"] = to_string(JobState::kQueued);
    r["plan"] = planner::to_json(*p);
    reply(s, req, r);
    decide(job);
  } else {
    enqueue(job);
    save(job);
    r["state"] = to_string(JobState::kQueued);
    const auto q = queue_status(job);
    if (!q.fits_cluster) {
      // It waits for agents to join (or its queue_timeout); say so now, not never.
      r["warning"] = (r.contains("warning") ? r["warning"].get<std::string>() + "; " : std::string()) + "needs " + std::to_string(q.cores_needed) + " cores (" +
                     std::to_string(job.spec.workers + job.spec.ps_shards) + " tasks x " +
                     std::to_string(job.spec.threads_per_task) + "), more than the " + std::to_string(q.cores_total) +
                     " cores of the agents registered now" + q.cache_note() + "; it waits in the queue until agents join";
      if (registering) r["warning"] = r["warning"].get<std::string>() + " (" + *registering + ")";
    }
    if (auto f = shared_plan_forecast(job)) {
      // The shared plan's size and predicted run time now, and whether its deadline holds.
      r["shared_plan"] = f->first;
      if (!f->second.empty()) {
        r["warning"] = (r.contains("warning") ? r["warning"].get<std::string>() + "; " : std::string()) + f->second;
        spdlog::warn("job {}: {}", id, f->second);
      }
    }
    reply(s, req, r);
  }
  try_schedule();
}

// `cancel {job}`: refused for a job that has ended; else cancel_job (leader.cpp).
void Leader::Impl::on_cancel(const SessionPtr& s, const wire::Envelope& env, JobRec& j) {
  if (!may_act(s, env.id, j, "cancel")) return;
  const std::string jid = j.id;
  if (j.terminal()) {
    return reply_error(s, env.id, wire::error_code::kConflict, "job " + jid + " already " + std::string(to_string(j.state())), "job");
  }
  cancel_job(j);
  reply(s, env.id, {{"job", jid}, {"state", to_string(j.state())}});
}

json Leader::Impl::agents_json() const {
  json arr = json::array();
  for (auto& [id, a] : agents) {
    arr.push_back({{"agent", id},
                   {"address", a.address},
                   {"cores", a.cores},
                   {"free_cores", a.lost ? 0 : a.free_cores},  // a lost agent offers nothing
                   {"memory_mb", a.memory_mb},
                   {"link_bytes_per_sec", a.link_bytes_per_sec},
                   {"shard_cache", a.shard_cache},
                   {"hardware_class", a.hardware_class},
                   {"gpus", [&] {
                      json g = json::array();
                      for (const auto& x : a.gpus) g.push_back(x.to_json());
                      return g;
                    }()},
                   {"gpus_free", a.lost ? 0 : static_cast<int>(a.free_gpus.size())},
                   {"metrics_endpoint", a.metrics_endpoint.empty() ? json(nullptr) : json(a.metrics_endpoint)},
                   {"state", a.lost ? "lost" : a.stopping ? "stopping" : "ready"},
                   {"seconds_since_heartbeat",
                    std::chrono::duration<double>(Clock::now() - a.last_seen).count()}});
  }
  return arr;
}

// `dltrain resume JOB` (ModelCollection::resume_job): the job's configuration as planned,
// its latest epoch checkpoint's state_dict as init_from, its workers starting at that
// checkpoint's epoch (leader.cpp, launch).
void Leader::Impl::on_resume(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::ResumeBody>(env);
  if (!may_act(s, env.id, b.job, "resume", "job")) return;
  JobRec j = models.resume_job(b, [this](const JobSpec& spec) { return planning.ps_memory_problem(spec); });
  j.owner = s->identity().user;
  const json extra{{"resumed_from", j.resume.from}, {"checkpoint", j.resume.checkpoint}, {"resume_epoch", j.resume.epoch}};
  accept_job(s, env.id, std::move(j), b.follow, extra);
}

// ---------------------------------------------------------------- the planner's answers
// (planning.h asks the planner; the leader applies what it says)
// Applies a feasible plan to an auto job and queues it; fails it otherwise.
void Leader::Impl::decide(JobRec& j) {
  const auto p = planning.plan_for(j.spec, j.explore.exploration_seconds);
  j.explore.plan = planner::to_json(p);
  ++counters.plans;
  if (!p.explore.empty() && j.explore.rounds < JobExploration::kMaxRounds) {
    // The plan would choose a method never measured here: profile it, then plan again.
    notify(j, events::PlanDecided{{}, j.explore.plan}.to_json());
    return explore(j, p.explore);
  }
  if (!p.feasible) {
    ++counters.infeasible_plans;
    return fail_unplaced(j, "planner: " + p.explanation);
  }
  j.spec.workers = p.choice.workers;
  j.spec.batch_size = p.choice.batch_size;
  if (j.spec.compression.method_auto) planner::apply_method(j.spec, p.choice.compression);
  if (auto why = planning.ps_memory_problem(j.spec)) {
    return fail_unplaced(j, "planner chose " + std::to_string(p.choice.workers) + " workers, but " + *why);
  }
  if (auto why = quota_refusal(j.owner, j.spec)) {
    return fail_unplaced(j, "planner chose " + std::to_string(p.choice.workers) + " workers, but the job then " + why->message);
  }
  planning.remember(j.spec, p.choice);
  spdlog::info("job {}: planner chose {} workers x batch {}, compression {}: {}", j.id, p.choice.workers,
               p.choice.batch_size, planner::method_label(p.choice.compression), p.explanation);
  notify(j, events::PlanDecided{{}, j.explore.plan}.to_json());
  set_state(j, JobState::kQueued);
  enqueue(j);
}

// Starts one exploration run per configuration the planner asked to profile.
void Leader::Impl::explore(JobRec& parent, const std::vector<planner::Config>& configs) {
  ++parent.explore.rounds;
  if (parent.state() != JobState::kExploring) set_state(parent, JobState::kExploring);
  for (const auto& c : configs) {
    JobRec p;
    p.spec = planner::exploration_spec(parent.spec, parent.id, c, opt.explore_steps);
    if (const auto why = quota_refusal(parent.owner, p.spec)) {
      spdlog::info("job {}: not exploring {} workers x batch {}: it {}", parent.id, c.workers, c.batch_size, why->message);
      continue;
    }
    jobs.number(p);
    p.submitted = Clock::now();
    p.submitted_unix = unix_now();
    p.secret = new_job_secret_hex();
    p.explore.profile_of = parent.id;
    p.owner = parent.owner;
    ++counters.exploration_runs;
    parent.explore.pending_profiles.push_back(p.id);
    auto& run = jobs.add(std::move(p));
    enqueue(run);
    save(run);
    spdlog::info("job {}: exploring {} workers x batch {} ({}) as {}", parent.id, c.workers, c.batch_size,
                 planner::method_label(c.compression), run.id);
  }
  persist("saving the job counter", [&] { db->put_meta("next_job", std::to_string(jobs.next_number())); });
  // Every run it asked for is beyond its owner's quota: plan again without them (the
  // rounds are bounded, JobExploration::kMaxRounds).
  if (parent.explore.pending_profiles.empty()) decide(parent);
}

// `dltrain logs`: the client's request checked against the job and its task, then handed
// to the log relay (log_relay.h) on its way to the agent that keeps the log.
void Leader::Impl::on_logs(const SessionPtr& s, const wire::Envelope& env) {
  auto b = wire::parse_body<wire::LogRequestBody>(env);
  const auto jit = jobs.find(b.job);
  if (jit == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + b.job + "\"", "job");
  JobRec& j = jit->second;
  if (!may_act(s, env.id, j, "read the logs of")) return;
  const TaskRec* t = j.find_task(b.task);
  if (t == nullptr) {
    std::string names;
    for (const auto& x : j.tasks) names += (names.empty() ? "" : ", ") + x.name;
    return reply_error(s, env.id, wire::error_code::kNotFound,
                       j.id + " has no task \"" + b.task + "\"" + (names.empty() ? "" : " (its tasks: " + names + ")"),
                       "task");
  }
  if (t->agent.empty()) {
    return reply_error(s, env.id, wire::error_code::kNotFound, b.task + " of " + j.id + " has not been placed yet",
                       "task");
  }
  const auto a = agents.find(t->agent);
  const auto session = a == agents.end() || a->second.lost ? nullptr : a->second.session.lock();
  if (!session) {
    return reply_error(s, env.id, wire::error_code::kUnavailable,
                       "agent " + t->agent + ", which keeps the log of " + b.task + ", is not connected");
  }
  b.generation = j.generation;
  const std::string id = "log-" + std::to_string(next_req++);
  if (!order(session, id, wire::ControlType::kReadLog, b.to_json())) {
    return reply_error(s, env.id, wire::error_code::kUnavailable, "this leader no longer serves: ask the serving one");
  }
  std::weak_ptr<control::Session> client = s;
  const std::string client_id = env.id;
  LogRelay::Client answer{
      [this, client, client_id](const json& body) {
        if (auto c = client.lock()) reply(c, client_id, body);
      },
      [this, client, client_id](const std::string& code, const std::string& message, const std::string& field) {
        if (auto c = client.lock()) reply_error(c, client_id, code, message, field);
      }};
  log_relay.expect(id, t->agent, t->state != TaskState::kExited, std::move(answer), Clock::now());
}

}  // namespace dltrain::leader
