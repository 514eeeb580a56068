#include "ha/election.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/secret.h"

namespace dltrain::ha {

using json = nlohmann::json;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

LeaderElection::LeaderElection(EtcdOptions etcd, ElectionOptions options, Callbacks callbacks)
    : etcd_opt_(std::move(etcd)), opt_(std::move(options)), cb_(std::move(callbacks)) {
  if (opt_.candidate.empty()) throw ConfigError("name", "a leader candidate needs a name");
  if (opt_.ttl_seconds < 2 || opt_.ttl_seconds > 300) {
    throw ConfigError("lease_ttl", "expected 2 to 300 seconds, got " + std::to_string(opt_.ttl_seconds));
  }
  const auto ttl = std::chrono::milliseconds(1000LL * opt_.ttl_seconds);
  if (opt_.safety_margin.count() <= 0 || opt_.safety_margin > ttl / 2) {
    throw ConfigError("lease_safety_margin", "expected more than 0 and at most half the TTL (" +
                                                 std::to_string(ttl.count() / 2) + " ms), got " +
                                                 std::to_string(opt_.safety_margin.count()) + " ms");
  }
  EtcdClient check(etcd_opt_);  // the endpoints and TLS files, now rather than on its thread
  static const char* hex = "0123456789abcdef";
  for (const auto b : random_bytes(8)) instance_ += std::string{hex[b >> 4], hex[b & 15]};
}

LeaderElection::~LeaderElection() { stop(); }

void LeaderElection::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void LeaderElection::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);  // under the lock: a waiter cannot miss it
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool LeaderElection::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return term_ != 0 && Clock::now() < valid_until_;
}

std::int64_t LeaderElection::term() const {
  std::lock_guard<std::mutex> lock(mu_);
  return term_ != 0 && Clock::now() < valid_until_ ? term_ : 0;
}

std::optional<LeaderInfo> LeaderElection::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_;
}

std::string LeaderElection::to_value(const LeaderInfo& info) {
  return json{{"candidate", info.candidate}, {"address", info.address}, {"since_unix", info.since_unix},
              {"instance", info.instance}}
      .dump();
}

LeaderInfo LeaderElection::from_value(const std::string& value, std::int64_t term) {
  const json j = json::parse(value, nullptr, false);
  const auto is = [&](const char* k, bool (json::*test)() const noexcept) { return !j.contains(k) || (j[k].*test)(); };
  if (!j.is_object() || !j.contains("candidate") || !j["candidate"].is_string() || !is("address", &json::is_string) ||
      !is("since_unix", &json::is_number) || !is("instance", &json::is_string)) {
    throw ProtocolError("the election key's value is not a dltrain leader's: " + value.substr(0, 200));
  }
  LeaderInfo info;
  info.candidate = j["candidate"].get<std::string>();
  info.address = j.value("address", "");
  info.since_unix = j.value("since_unix", 0.0);
  info.instance = j.value("instance", "");
  info.term = term;
  return info;
}

json LeaderElection::candidates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return candidates_;
}

json LeaderElection::read_candidates(EtcdClient& etcd, const std::string& prefix) {
  json out = json::array();
  for (const auto& kv : etcd.get_prefix(prefix)) {
    json j = json::parse(kv.value, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

void LeaderElection::announce(EtcdClient& etcd, std::int64_t lease, const char* state) {
  if (opt_.candidates_prefix.empty()) return;
  try {
    etcd.put(opt_.candidates_prefix + opt_.candidate,
             json{{"candidate", opt_.candidate}, {"address", opt_.address}, {"state", state}, {"since_unix", unix_now()}}
                 .dump(),
             lease);
  } catch (const std::exception& e) {
    if (cb_.trouble) cb_.trouble(std::string("announcing this candidate: ") + e.what());
  }
}

void LeaderElection::refresh_candidates(EtcdClient& etcd) {
  if (opt_.candidates_prefix.empty()) return;
  try {
    auto list = read_candidates(etcd, opt_.candidates_prefix);
    std::lock_guard<std::mutex> lock(mu_);
    candidates_ = std::move(list);
  } catch (const std::exception& e) {
    if (cb_.trouble) cb_.trouble(std::string("reading the candidates: ") + e.what());
  }
}

bool LeaderElection::wait_for(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [this] { return stopping_.load(); });
  return !stopping_;
}

void LeaderElection::run() {
  std::unique_ptr<EtcdClient> etcd;
  std::chrono::milliseconds backoff{250};
  while (!stopping_) {
    try {
      if (!etcd) etcd = std::make_unique<EtcdClient>(etcd_opt_);
      campaign_once(*etcd);
      backoff = std::chrono::milliseconds(250);
    } catch (const std::exception& e) {
      // etcd unreachable (no quorum, every member down), or a reply it could not read:
      // try again, less often, saying why each time.
      if (cb_.trouble) cb_.trouble(e.what());
      wait_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
  }
}

// One attempt: take a lease, try to create the key; serve until deposed, or watch the
// serving candidate's key until it goes.
void LeaderElection::campaign_once(EtcdClient& etcd) {
  const auto granted_at = Clock::now();  // the lease lives at least TTL after this on etcd
  std::int64_t lease = etcd.lease_grant(opt_.ttl_seconds);
  LeaderInfo me{opt_.candidate, opt_.address, 0, unix_now(), instance_};
  EtcdClient::TxnResult r;
  try {
    r = etcd.create(opt_.key, to_value(me), lease);
  } catch (...) {
    try {
      etcd.lease_revoke(lease);
    } catch (const std::exception&) {
      // it expires by itself
    }
    throw;
  }
  if (r.succeeded) {
    announce(etcd, lease, "serving");
    serve(etcd, lease, granted_at, r.revision);
    return;
  }
  // Another candidate serves: this lease now carries only the announcement, renewed while
  // it stands by and revoked (the announcement with it) before it campaigns again.
  struct Revoke {
    EtcdClient& etcd;
    std::int64_t lease;
    ~Revoke() {
      try {
        etcd.lease_revoke(lease);
      } catch (const std::exception&) {
        // it expires by itself
      }
    }
  } revoke{etcd, lease};
  if (!r.current) return;    // deleted in between: try again at once
  const std::int64_t term = r.current->create_revision;
  LeaderInfo other;
  try {
    other = from_value(r.current->value, term);
  } catch (const ProtocolError& e) {
    other.candidate = "?";
    if (cb_.trouble) cb_.trouble(e.what());
  }
  if (other.instance == instance_) {
    // Its own key of an earlier term (a resignation or a revoke that did not reach etcd):
    // nobody serves behind it. Delete that term's key and campaign again.
    etcd.erase_if(opt_.key, term);
    return;
  }
  if (other.candidate == opt_.candidate && cb_.trouble) {
    cb_.trouble("another process serves as candidate \"" + opt_.candidate +
                "\": every candidate needs a name of its own (name, or --name)");
  }
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed = !leader_ || leader_->term != term;
    leader_ = other;
  }
  if (changed && cb_.standing_by) cb_.standing_by(other);
  announce(etcd, lease, "standing by");
  // Watch from the revision after the one we read, so that no deletion is missed; a short
  // wait in a loop lets stop() end it.
  std::int64_t from = r.revision + 1;
  // At most TTL/3 between renewals of the announcement's lease.
  const auto wait = std::chrono::milliseconds(std::min(2000, 1000 * opt_.ttl_seconds / 3));
  while (!stopping_) {
    const auto began = Clock::now();
    if (!opt_.candidates_prefix.empty() && etcd.lease_keepalive(lease) <= 0) {
      announce(etcd, lease = etcd.lease_grant(opt_.ttl_seconds), "standing by");  // it had expired (a pause)
      revoke.lease = lease;
    }
    const auto events = etcd.watch(opt_.key, from, wait);
    for (const auto& e : events) {
      if (e.deleted) return;  // the leader resigned or its lease expired: campaign
      from = std::max(from, e.kv.mod_revision + 1);
    }
    if (events.empty()) {
      // Nothing within the wait (or the watch was cancelled: its revision compacted):
      // make sure the key is still there, then watch from now on — a deletion between
      // this read and that watch is found by the next read, one wait later.
      const auto kv = etcd.get(opt_.key);
      if (!kv || kv->create_revision != term) return;
      from = 0;
      if (Clock::now() - began < wait / 2) wait_for(std::chrono::milliseconds(250));  // cancelled early: no spin
    }
  }
}

void LeaderElection::serve(EtcdClient& etcd, std::int64_t lease, Clock::time_point granted_at, std::int64_t term) {
  const auto ttl = std::chrono::milliseconds(1000LL * opt_.ttl_seconds);
  {
    std::lock_guard<std::mutex> lock(mu_);
    term_ = term;
    valid_until_ = granted_at + ttl - opt_.safety_margin;
    leader_ = LeaderInfo{opt_.candidate, opt_.address, term, unix_now(), instance_};
  }
  spdlog::info("leader election: {} serves, term {} (lease {:x}, TTL {} s)", opt_.candidate, term, lease,
               opt_.ttl_seconds);
  refresh_candidates(etcd);
  if (cb_.elected) {
    try {
      cb_.elected(term);
    } catch (const std::exception& e) {
      spdlog::error("leader election: the elected callback failed: {}", e.what());  // the term goes on
    }
  }
  std::string why;
  bool failed = false;  // the last renewal failed: try again soon, not after TTL/3
  while (why.empty()) {
    if (stopping_) {
      why = "stopping";
      break;
    }
    // Renew every TTL/3; never sleep past the moment the lease might expire.
    Clock::time_point until;
    {
      std::lock_guard<std::mutex> lock(mu_);
      until = valid_until_;
    }
    const auto now = Clock::now();
    if (now >= until) {
      why = "its lease could not be renewed within " + std::to_string(opt_.ttl_seconds) + " s minus the margin";
      break;
    }
    const Clock::duration every = failed ? Clock::duration(std::chrono::milliseconds(250)) : Clock::duration(ttl / 3);
    const auto next = std::min<Clock::duration>(every, until - now);
    wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(next));
    if (stopping_) continue;
    const auto sent = Clock::now();
    if (sent >= until) continue;  // woke too late (a paused process): deposed above
    try {
      const auto left = etcd.lease_keepalive(lease);
      if (left <= 0) {
        why = "its lease expired on etcd";
        break;
      }
      const auto kv = etcd.get(opt_.key);
      if (!kv || kv->create_revision != term) {
        why = "the election key is no longer its own";
        break;
      }
      // Losing the lease is final for a term: a renewal whose answer came after the
      // window closed (serving() went false meanwhile) does not reopen it.
      if (Clock::now() >= until) continue;
      failed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        valid_until_ = std::max(valid_until_, sent + ttl - opt_.safety_margin);
      }
      refresh_candidates(etcd);
    } catch (const std::exception& e) {
      // Keep trying until the lease may have expired: a member may be back in time.
      failed = true;
      if (cb_.trouble) cb_.trouble(std::string("renewing the lease: ") + e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    term_ = 0;
    valid_until_ = {};
    leader_.reset();
  }
  if (why == "stopping") {
    // Resign: only this term's key, so that a standby serves at once.
    try {
      etcd.erase_if(opt_.key, term);
      etcd.lease_revoke(lease);
      spdlog::info("leader election: {} resigned (term {})", opt_.candidate, term);
    } catch (const std::exception& e) {
      spdlog::warn("leader election: {} could not resign (its lease expires in at most {} s): {}", opt_.candidate,
                   opt_.ttl_seconds, e.what());
    }
  } else {
    spdlog::warn("leader election: {} no longer serves (term {}): {}", opt_.candidate, term, why);
    try {
      etcd.lease_revoke(lease);
    } catch (const std::exception&) {
      // expired already, or etcd is away: it expires by itself
    }
  }
  if (cb_.deposed) cb_.deposed(term, why);
}

}  // namespace dltrain::ha
