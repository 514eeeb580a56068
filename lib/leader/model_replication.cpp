// The serving leader's side of artifact replication (docs/ha.md "Artifacts"): each leader
// candidate that stands by keeps a copy of the leader's trained models, kept checkpoints
// and uploaded model files, so that a new leader serves them after the serving
// candidate's machine is lost. A standby asks with `replicate`, saying what it holds; the
// leader answers with what it keeps when the standby lacks something, else holds the
// request until that changes (a long poll). The standby fetches what it lacks with
// model_read / model_download, as a client and an agent do, and asks again: that request
// is its acknowledgement. A job ends (and is reported succeeded, failed or cancelled) once
// every candidate standing by holds its models and uploads, or after the replication
// timeout, whichever comes first: the semi-synchronous replication of databases, which
// waits for the replicas it can reach and does not stop for one that is down.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "leader/model_collection.h"

namespace dltrain::leader {

using json = nlohmann::json;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

ModelCollection::Awaiting ModelCollection::wanted_of(const JobRec& j) const {
  Awaiting a;
  if (models_) {
    for (const auto& m : models_->list(j.id)) a.models.insert(m.key());
  }
  for (const auto* sha : {&j.spec.model_sha256, &j.spec.init_sha256}) {
    if (!sha->empty() && uploaded(*sha)) a.uploads.insert(*sha);
  }
  return a;
}

std::vector<std::string> ModelCollection::missing_replicas(const Awaiting& a) const {
  std::vector<std::string> missing;
  if (!hooks_.standbys) return missing;
  for (const auto& name : hooks_.standbys()) {
    // Only a standby that copies now is waited for: one that never asked (no state_dir,
    // its stores unusable) or whose session closed copies what it lacks when it asks.
    const auto it = replicas_.find(name);
    if (it == replicas_.end() || !it->second.connected) continue;
    const auto& r = it->second;
    std::size_t lacks = 0;
    for (const auto& k : a.models) lacks += r.models.count(k) == 0;
    for (const auto& k : a.uploads) lacks += r.uploads.count(k) == 0;
    if (lacks > 0) missing.push_back(name + " (" + std::to_string(lacks) + " model(s) or upload(s) still to copy)");
  }
  return missing;
}

void ModelCollection::await_replicas(JobRec& j) {
  const auto finish = [&] {
    j.model.done = true;
    hooks_.ended(j);
  };
  Awaiting a = wanted_of(j);
  const auto standbys = hooks_.standbys ? hooks_.standbys() : std::vector<std::string>{};
  if (a.models.empty() && a.uploads.empty()) return finish();
  if (replication_timeout_.count() <= 0 || missing_replicas(a).empty()) {
    j.model.replicas = replicas_of(j.id);
    // Standing by but not copying: said, so that nobody counts on a copy that is not there.
    std::vector<std::string> away;
    for (const auto& s : standbys) {
      if (std::find(j.model.replicas.begin(), j.model.replicas.end(), s) == j.model.replicas.end()) away.push_back(s);
    }
    if (!away.empty()) {
      j.model.replication = "not copied yet to " + join(away) + " (standing by, not copying now): kept on this " +
                            "candidate until they do";
    }
    return finish();
  }
  a.deadline = Clock::now() + replication_timeout_;
  spdlog::info("job {}: waiting for the standby candidates to hold its models (up to {} s)", j.id,
               replication_timeout_.count() / 1000.0);
  awaiting_[j.id] = std::move(a);
}

void ModelCollection::check_awaiting(Clock::time_point now) {
  std::vector<std::string> done;
  for (auto& [job, a] : awaiting_) {
    const auto jit = jobs_.find(job);
    if (jit == jobs_.end()) {
      done.push_back(job);
      continue;
    }
    const auto missing = missing_replicas(a);
    if (!missing.empty() && now < a.deadline) continue;
    auto& m = jit->second.model;
    m.replicas = replicas_of(job);
    if (!missing.empty()) {
      m.replication = "not copied to " + join(missing) + " within " +
                      std::to_string(replication_timeout_.count() / 1000.0).substr(0, 4) +
                      " s: kept on this candidate only until a standby copies it";
      spdlog::warn("job {}: its models are {}", job, m.replication);
    } else {
      spdlog::info("job {}: its models are held by {}", job, join(m.replicas));
    }
    done.push_back(job);
  }
  for (const auto& job : done) {
    awaiting_.erase(job);
    const auto jit = jobs_.find(job);
    if (jit == jobs_.end()) continue;
    jit->second.model.done = true;
    hooks_.ended(jit->second);
  }
}

std::vector<std::string> ModelCollection::replicas_of(const std::string& job) const {
  std::vector<std::string> out;
  const auto jit = jobs_.find(job);
  if (jit == jobs_.end()) return out;
  const Awaiting a = wanted_of(jit->second);
  for (const auto& [name, r] : replicas_) {
    const bool all = std::all_of(a.models.begin(), a.models.end(), [&](const auto& k) { return r.models.count(k); }) &&
                     std::all_of(a.uploads.begin(), a.uploads.end(), [&](const auto& k) { return r.uploads.count(k); });
    if (all) out.push_back(name);
  }
  return out;
}

json ModelCollection::inventory_json() const {
  // Inside the 4 MiB message limit whatever the retention: the newest models first, up to
  // 3 MiB of manifests (a manifest is ~400 bytes: about 7,000 models).
  constexpr std::size_t kBudget = 3u << 20;
  wire::ReplicaInventoryBody inv;
  std::size_t bytes = 0;
  if (models_) {
    for (const auto& m : models_->list()) {
      auto j = m.to_json();
      bytes += j.dump().size();
      if (bytes > kBudget) break;
      inv.models.push_back(std::move(j));
    }
  }
  if (uploads_) inv.uploads = uploads_->list();
  inv.jobs = jobs_.order();
  return inv.to_json();
}

void ModelCollection::answer(Replica& r, const Reply& reply) {
  const auto s = r.session.lock();
  const std::string id = std::exchange(r.parked, "");
  if (!s || id.empty() || !reply) return;
  r.answered_version = inventory_version_;
  reply(s, id, inventory_json());
}

void ModelCollection::on_replicate(const SessionPtr& s, const std::string& id, const wire::ReplicateBody& b,
                                   const Reply& reply) {
  reply_ = reply;
  auto& r = replicas_[b.candidate];
  if (r.session_id != s->id()) {
    spdlog::info("standby candidate {} ({}) copies the models and uploads", b.candidate, s->peer());
    r.answered_version = 0;  // a new session: it has seen no inventory yet
  }
  r.models = {b.models.begin(), b.models.end()};
  r.uploads = {b.uploads.begin(), b.uploads.end()};
  r.session = s;
  r.session_id = s->id();
  r.connected = true;
  r.parked = id;
  r.parked_until = Clock::now() + wire::ReplicateBody::kHold;
  check_awaiting(Clock::now());
  // Answered at once when the inventory changed since its last answer; otherwise the
  // request waits for a change or kHold — also when the standby still lacks what the
  // last answer listed (a copy that failed, which it logged): asking again at once
  // would spin.
  if (r.answered_version != inventory_version_) answer(r, reply);
}

void ModelCollection::on_replica_closed(const SessionPtr& s) {
  for (auto& [name, r] : replicas_) {
    if (r.session_id == s->id()) {
      r.parked.clear();
      r.connected = false;
    }
  }
  check_awaiting(Clock::now());  // a job that waited only for it ends now
}

bool ModelCollection::is_replica(const SessionPtr& s) const {
  return std::any_of(replicas_.begin(), replicas_.end(), [&](const auto& kv) { return kv.second.session_id == s->id(); });
}

void ModelCollection::inventory_changed() {
  ++inventory_version_;
  for (auto& [name, r] : replicas_) {
    if (!r.parked.empty()) answer(r, reply_);
  }
}

}  // namespace dltrain::leader
