// The leader's state in etcd (store/store.h's contract), for leader candidates with
// [ha]: whichever candidate serves reads what the one before it wrote. Every write is one
// etcd transaction fenced by the writer's term — it is applied only while the election
// key still has the create revision this leader won it at — so a deposed leader (paused,
// cut off, slow to notice) changes nothing. docs/ha.md "State in etcd".
//
// Keys, under PREFIX/state/ (numbers zero-padded to 20 digits so that etcd's key order is
// numeric order):
//   history/<seq>            an Observation (JSON)
//   jobs/<number>            a job record (JSON)
//   events/<number>/<seq>    one event of job <number> (JSON)
//   meta/<name>              a named value
// Bounds, within etcd's limits (a request of at most 1.5 MiB, a database of at most its
// quota, 2 GiB by default): a value of at most kMaxValueBytes; the latest 2,000 events
// of a job and the latest 20,000 observations (EtcdStore::Limits) (older ones are deleted in
// the same transaction that adds a new one); and every kCompactEvery writes the store
// compacts etcd's revision history older than kCompactEvery revisions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ha/etcd_client.h"
#include "store/store.h"

namespace dltrain::ha {

/// How much an EtcdStore keeps (each >= 1): older events and observations are deleted as
/// new ones are added.
struct EtcdStoreLimits {
  std::uint64_t events_per_job = 2000;  ///< the latest kept per job
  std::uint64_t observations = 20000;   ///< the latest kept
};

/// A Store in etcd, its writes fenced by a term. Thread-safe (one mutex around one
/// EtcdClient: the leader writes from one thread).
class EtcdStore : public store::Store {
 public:
  static constexpr std::size_t kMaxValueBytes = 1u << 20;   ///< one record or event, bytes
  static constexpr std::uint64_t kCompactEvery = 1000;      ///< writes between compactions
  using Limits = EtcdStoreLimits;

  /// A store under `prefix` + "/state/" whose writes are applied only while the key
  /// `guard` (the election key) has create revision `term` (> 0). `on_fenced` (may be
  /// empty) is called, on the writing thread, when etcd refused a write because the
  /// guard has changed: this leader's term is over. Reads the sequence numbers it
  /// continues from; throws StoreError when etcd cannot be read.
  EtcdStore(EtcdOptions etcd, std::string prefix, std::string guard, std::int64_t term,
            std::function<void(const std::string& why)> on_fenced = {}, EtcdStoreLimits limits = {});

  void add_observation(const store::Observation& o) override;
  std::vector<store::Observation> history(const std::string& model = "", const std::string& dataset = "") const override;
  void put_job(std::uint64_t number, const nlohmann::json& job) override;
  std::vector<std::pair<std::uint64_t, nlohmann::json>> jobs() const override;
  void append_event(std::uint64_t job, const nlohmann::json& event) override;
  std::vector<nlohmann::json> events(std::uint64_t job) const override;
  void delete_job(std::uint64_t number) override;
  void put_meta(const std::string& name, const std::string& value) override;
  std::optional<std::string> get_meta(const std::string& name) const override;
  /// Nothing to do: a returned write is on a quorum of etcd members.
  void flush() override {}
  bool read_only() const override { return false; }
  /// "etcd http://a:2379,http://b:2379 under /dltrain/state/ (term 42)".
  const std::string& location() const override { return location_; }

 private:
  /// Runs `ops` fenced by the term; throws StoreError naming `what` (and calls on_fenced
  /// when the term is over).
  void write(const char* what, const std::vector<EtcdClient::TxnOp>& ops);
  /// Reads under `sub` (e.g. "jobs/"), in pages, converting etcd's errors; `keys_only`:
  /// without the values (what a sequence number needs).
  std::vector<KeyValue> read(const std::string& sub, const char* what, bool keys_only = false) const;
  void check_size(const char* what, const std::string& value) const;
  /// The largest <seq> among the keys under `sub` + 1, 0 when there is none.
  std::uint64_t next_seq(const std::string& sub) const;

  std::string root_, guard_, location_;
  std::int64_t term_;
  Limits limits_;
  std::function<void(const std::string&)> on_fenced_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<EtcdClient> etcd_;  // guarded by mu_
  std::uint64_t history_seq_ = 0;                         // guarded by mu_
  std::map<std::uint64_t, std::uint64_t> event_seq_;      // job → next seq; guarded by mu_
  std::uint64_t writes_ = 0;                              // guarded by mu_
  bool compaction_warned_ = false;                        // guarded by mu_
};

}  // namespace dltrain::ha
