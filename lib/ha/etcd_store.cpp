#include "ha/etcd_store.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace dltrain::ha {

using json = nlohmann::json;
using Op = EtcdClient::TxnOp;

namespace {

// Zero-padded to 20 digits (the width of 2^64 - 1): etcd orders keys as bytes.
std::string num(std::uint64_t n) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(n));
  return buf;
}

// The number after the last '/' of `key`, or nullopt when it is not one.
std::optional<std::uint64_t> last_number(const std::string& key) {
  const auto slash = key.rfind('/');
  const std::string tail = key.substr(slash == std::string::npos ? 0 : slash + 1);
  if (tail.empty() || tail.size() > 20 || !std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  try {
    return std::stoull(tail);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

EtcdStore::EtcdStore(EtcdOptions etcd, std::string prefix, std::string guard, std::int64_t term,
                     std::function<void(const std::string&)> on_fenced, Limits limits)
    : root_(std::move(prefix) + "/state/"),
      guard_(std::move(guard)),
      term_(term),
      limits_(limits),
      on_fenced_(std::move(on_fenced)) {
  limits_.events_per_job = std::max<std::uint64_t>(1, limits_.events_per_job);
  limits_.observations = std::max<std::uint64_t>(1, limits_.observations);
  std::string eps;
  for (const auto& e : etcd.endpoints) eps += (eps.empty() ? "" : ",") + e;
  location_ = "etcd " + eps + " under " + root_ + " (term " + std::to_string(term_) + ")";
  if (term_ <= 0) throw store::StoreError(location_ + ": a fenced store needs the leader's term (> 0)");
  etcd_ = std::make_unique<EtcdClient>(std::move(etcd));
  std::lock_guard<std::mutex> lock(mu_);
  history_seq_ = next_seq("history/");
}

std::vector<KeyValue> EtcdStore::read(const std::string& sub, const char* what, bool keys_only) const {
  // In pages, so that no reply approaches the gateway's message limits (the history
  // holds up to 20,000 observations).
  constexpr std::int64_t kPage = 500;
  std::vector<KeyValue> out;
  try {
    std::string from;
    for (;;) {
      auto page = etcd_->get_prefix(root_ + sub, kPage, from, keys_only);
      const bool last = static_cast<std::int64_t>(page.size()) < kPage;
      if (!page.empty()) from = page.back().key + std::string(1, '\0');
      for (auto& kv : page) out.push_back(std::move(kv));
      if (last) return out;
    }
  } catch (const std::exception& e) {
    throw store::StoreError(location_ + ": " + what + " failed: " + e.what());
  }
}

std::uint64_t EtcdStore::next_seq(const std::string& sub) const {
  std::uint64_t next = 0;
  for (const auto& kv : read(sub, "reading sequence numbers", true)) {
    if (const auto n = last_number(kv.key)) next = std::max(next, *n + 1);
  }
  return next;
}

void EtcdStore::check_size(const char* what, const std::string& value) const {
  if (value.size() > kMaxValueBytes) {
    throw store::StoreError(location_ + ": " + what + " not written: " + std::to_string(value.size()) +
                            " bytes, more than the " + std::to_string(kMaxValueBytes) + " an etcd value may hold here");
  }
}

void EtcdStore::write(const char* what, const std::vector<Op>& ops) {
  EtcdClient::TxnResult r;
  try {
    r = etcd_->fenced(guard_, term_, ops);
  } catch (const std::exception& e) {
    throw store::StoreError(location_ + ": " + what + " failed: " + e.what());
  }
  if (!r.succeeded) {
    const std::string now =
        r.current ? "term " + std::to_string(r.current->create_revision) + " serves" : "no leader serves";
    const std::string why = what + std::string(" refused by etcd: this leader's term ") + std::to_string(term_) +
                            " is over (" + now + ")";
    if (on_fenced_) on_fenced_(why);
    throw store::StoreError(location_ + ": " + why);
  }
  if (++writes_ % kCompactEvery == 0 && r.revision > static_cast<std::int64_t>(kCompactEvery)) {
    try {
      etcd_->compact(r.revision - static_cast<std::int64_t>(kCompactEvery));
    } catch (const std::exception& e) {
      // etcd allows compaction to its root role only once authentication is on: then etcd's
      // own --auto-compaction-mode must do it (docs/ha.md). Said once per store.
      if (!compaction_warned_) {
        compaction_warned_ = true;
        spdlog::warn("{}: compacting etcd's history failed ({}); unless etcd compacts by itself "
                     "(--auto-compaction-mode=revision --auto-compaction-retention=1000), its database grows with "
                     "every write",
                     location_, e.what());
      }
    }
  }
}

void EtcdStore::add_observation(const store::Observation& o) {
  const std::string value = json(o).dump();
  std::lock_guard<std::mutex> lock(mu_);
  check_size("an observation", value);
  std::vector<Op> ops{Op::put(root_ + "history/" + num(history_seq_), value)};
  if (history_seq_ >= limits_.observations) {
    ops.push_back(Op::erase(root_ + "history/" + num(history_seq_ - limits_.observations)));
  }
  write("adding an observation", ops);
  ++history_seq_;
}

std::vector<store::Observation> EtcdStore::history(const std::string& model, const std::string& dataset) const {
  std::vector<store::Observation> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : read("history/", "reading history")) {
    store::Observation o;
    try {
      o = json::parse(kv.value).get<store::Observation>();
    } catch (const std::exception& e) {
      throw store::StoreError(location_ + ": corrupt record " + kv.key + ": " + e.what());
    }
    if ((model.empty() || o.model == model) && (dataset.empty() || o.dataset == dataset)) out.push_back(std::move(o));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.timestamp < b.timestamp; });
  return out;
}

void EtcdStore::put_job(std::uint64_t number, const json& job) {
  const std::string value = job.dump();
  std::lock_guard<std::mutex> lock(mu_);
  check_size("a job record", value);
  write("writing a job record", {Op::put(root_ + "jobs/" + num(number), value)});
}

std::vector<std::pair<std::uint64_t, json>> EtcdStore::jobs() const {
  std::vector<std::pair<std::uint64_t, json>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : read("jobs/", "reading jobs")) {
    const auto n = last_number(kv.key);
    json j = json::parse(kv.value, nullptr, false);
    if (!n || j.is_discarded()) throw store::StoreError(location_ + ": corrupt job record " + kv.key);
    out.emplace_back(*n, std::move(j));
  }
  return out;
}

void EtcdStore::append_event(std::uint64_t job, const json& event) {
  const std::string value = event.dump();
  std::lock_guard<std::mutex> lock(mu_);
  check_size("an event", value);
  const std::string dir = "events/" + num(job) + "/";
  auto it = event_seq_.find(job);
  if (it == event_seq_.end()) it = event_seq_.emplace(job, next_seq(dir)).first;
  const std::uint64_t seq = it->second;
  std::vector<Op> ops{Op::put(root_ + dir + num(seq), value)};
  if (seq >= limits_.events_per_job) ops.push_back(Op::erase(root_ + dir + num(seq - limits_.events_per_job)));
  write("appending an event", ops);
  ++it->second;
}

std::vector<json> EtcdStore::events(std::uint64_t job) const {
  std::vector<json> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : read("events/" + num(job) + "/", "reading events")) {
    json j = json::parse(kv.value, nullptr, false);
    if (j.is_discarded()) throw store::StoreError(location_ + ": corrupt event " + kv.key);
    out.push_back(std::move(j));
  }
  return out;
}

void EtcdStore::delete_job(std::uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  write("deleting a job", {Op::erase(root_ + "jobs/" + num(number)), Op::erase_prefix(root_ + "events/" + num(number) + "/")});
  event_seq_.erase(number);
}

void EtcdStore::put_meta(const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  check_size("a named value", value);
  write("writing a named value", {Op::put(root_ + "meta/" + name, value)});
}

std::optional<std::string> EtcdStore::get_meta(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    const auto kv = etcd_->get(root_ + "meta/" + name);
    if (!kv) return std::nullopt;
    return kv->value;
  } catch (const std::exception& e) {
    throw store::StoreError(location_ + ": reading " + name + " failed: " + e.what());
  }
}

}  // namespace dltrain::ha
