// Users of a shared cluster (docs/operations.md, "Users"): who may act on a job, the
// quotas admission keeps, and the audit line of every request that changes something.
// A session's user comes from its token (control::ClientIdentity); the client token is
// the admin, so a configuration without [users] is one admin user, as before.
#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "leader/leader_impl.h"
#include "common/toml_fields.h"

namespace dltrain::leader {

using json = nlohmann::json;
using SessionPtr = Leader::Impl::SessionPtr;

namespace {

// The client requests that change something, each with the body key naming its job.
bool changes_something(const std::string& type) {
  return type == "submit" || type == "cancel" || type == "resume" || type == "model_upload" || type == "scale";
}

// A job's tasks that hold cores or GPUs now: placed and not exited.
bool holds(const TaskRec& t) { return !t.agent.empty() && t.state != TaskState::kExited; }

}  // namespace

void Leader::Impl::audit_request(const SessionPtr& s, const wire::Envelope& env) {
  if (!changes_something(env.type)) return;
  json line{{"user", s->identity().user}, {"peer", s->peer()}, {"request", env.type}};
  if (env.type == "model_upload") {
    // One line per file, not per window: the first window names it.
    if (env.body.value("offset", std::int64_t{0}) != 0) return;
    for (const char* k : {"sha256", "size"}) {
      if (const auto v = env.body.find(k); v != env.body.end() && (v->is_string() || v->is_number())) line[k] = *v;
    }
  }
  if (const auto j = env.body.find("job"); j != env.body.end() && j->is_string()) {
    line[env.type == "resume" ? "resumed_from" : "job"] = *j;  // a resume's reply names the new job
  }
  if (const auto n = env.body.find("job_toml"); n != env.body.end() && n->is_string()) {
    // The job's name, as the file says it (for a submit that is refused before it has an id).
    try {
      const auto t = toml_fields::parse(n->get<std::string>());
      if (const auto name = t["name"].value<std::string>()) line["name"] = *name;
    } catch (const std::exception&) {
      // a malformed file: its refusal says why
    }
  }
  audit_pending[{s->id(), env.id}] = std::move(line);
}

void Leader::Impl::audit_reply(const SessionPtr& s, const std::string& id, const json* body, const std::string& code,
                               const std::string& message) {
  const auto it = audit_pending.find({s->id(), id});
  if (it == audit_pending.end()) return;
  json line = std::move(it->second);
  audit_pending.erase(it);
  if (body != nullptr) {
    line["result"] = "ok";
    if (const auto j = body->find("job"); j != body->end() && j->is_string()) line["job"] = *j;
  } else {
    line["result"] = "refused";
    line["code"] = code;
    line["error"] = message;
  }
  audit_log->write(std::move(line));
}

const config::UserOptions* Leader::Impl::user_options(const std::string& user) const {
  const auto it = std::find_if(opt.users.begin(), opt.users.end(), [&](const auto& u) { return u.name == user; });
  return it == opt.users.end() ? nullptr : &*it;
}

bool Leader::Impl::may_act(const SessionPtr& s, const std::string& req, const JobRec& j, const std::string& action) {
  const auto& who = s->identity();
  if (who.admin || who.user == j.owner) return true;
  reply_error(s, req, wire::error_code::kForbidden,
              "user " + who.user + " may not " + action + " " + j.id + ": it belongs to " + j.owner +
                  " (only its owner or an admin may)",
              "job");
  return false;
}

bool Leader::Impl::may_act(const SessionPtr& s, const std::string& req, const std::string& job, const std::string& action,
                           const std::string& field) {
  if (const auto j = jobs.find(job); j != jobs.end()) return may_act(s, req, j->second, action);
  // Nothing of it kept: nothing to protect, and the caller's own lookup says "not found".
  if (s->identity().admin || models.models_json(job).empty()) return true;
  reply_error(s, req, wire::error_code::kForbidden,
              "the leader no longer knows " + job + "'s owner: only an admin may " + action + " it", field);
  return false;
}

std::optional<Leader::Impl::QuotaRefusal> Leader::Impl::quota_refusal(const std::string& user, const JobSpec& spec) const {
  const auto* u = user_options(user);
  if (u == nullptr) return std::nullopt;
  // An automatic worker count is not known yet: its PS shards only.
  const int workers = spec.workers_auto ? 0 : spec.workers;
  const auto need = totals(job_needs(spec.ps_shards, workers, spec.threads_per_task, spec.gpus_per_worker));
  if (u->max_cores > 0 && need.cores > u->max_cores) {
    return QuotaRefusal{"workers", "needs " + std::to_string(need.cores) + " cores (" +
                                       std::to_string(workers + spec.ps_shards) + " tasks x " +
                                       std::to_string(spec.threads_per_task) + "), more than user " + user +
                                       "'s max_cores = " + std::to_string(u->max_cores)};
  }
  if (u->max_gpus > 0 && need.gpus > u->max_gpus) {
    return QuotaRefusal{"gpus_per_worker", "needs " + std::to_string(need.gpus) + " GPUs, more than user " + user +
                                               "'s max_gpus = " + std::to_string(u->max_gpus)};
  }
  return std::nullopt;
}

AdmitQuotas Leader::Impl::admit_quotas() const {
  AdmitQuotas q;
  for (const auto& u : opt.users) {
    if (u.max_cores > 0 || u.max_gpus > 0 || u.max_running_jobs > 0) {
      q.by_user[u.name] = Quota{u.max_cores, u.max_gpus, u.max_running_jobs, 0, 0, 0};
    }
  }
  if (q.by_user.empty()) return q;
  for (const auto& [id, j] : jobs) {
    const auto it = q.by_user.find(j.owner);
    if (it == q.by_user.end() || j.terminal()) continue;
    bool running = false;
    for (const auto& t : j.tasks) {
      if (!holds(t)) continue;
      running = true;
      const auto h = hold_of(j, t);
      it->second.cores += h.cores;
      it->second.gpus += static_cast<int>(h.gpus.size());
    }
    if (running) ++it->second.jobs;
  }
  q.owner_of = [this](const std::string& job) { return jobs.at(job).owner; };
  return q;
}

std::optional<std::string> Leader::Impl::quota_wait(const JobRec& j) const {
  const auto* u = user_options(j.owner);
  if (u == nullptr || (u->max_cores == 0 && u->max_gpus == 0 && u->max_running_jobs == 0)) return std::nullopt;
  auto q = admit_quotas();
  const auto& mine = q.by_user.at(j.owner);
  const auto over = [&](const JobRec& k) { return !mine.allows(totals(needs(k))); };
  if (!over(j)) {
    // Within the quota, but behind one of the owner's jobs that is not (no overtaking).
    for (const auto& id : queue.jobs()) {
      if (id == j.id) break;
      const auto& k = jobs.at(id);
      if (k.owner == j.owner && over(k)) {
        return "waits behind " + k.id + ", which user " + j.owner + "'s quota holds back (first come, first served)";
      }
    }
    return std::nullopt;
  }
  const auto of = [](int held, const char* what, int bound) {
    return std::to_string(held) + " " + what + (bound ? std::to_string(bound) : std::string("unbounded"));
  };
  return "user " + j.owner + "'s running jobs hold its quota (" + of(mine.jobs, "running of max_running_jobs ", u->max_running_jobs) +
         ", " + of(mine.cores, "cores of max_cores ", u->max_cores) + ", " + of(mine.gpus, "GPUs of max_gpus ", u->max_gpus) +
         "): it starts when they end";
}

}  // namespace dltrain::leader
