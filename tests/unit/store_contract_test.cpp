// The Store contract (store/store.h), run against every backend: a backend is one
// class deriving from Store and one entry in kBackends below. Each case opens the
// backend on a fresh location, writes through the interface only, and checks what it
// reads back against values written out by hand here; "reopened" means the first
// instance is destroyed and a new one opened on the same location.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/observations.h"
#include "support/temp_dir.h"

#include "ha/etcd_store.h"
#include "store/rocksdb_store.h"
#include "store/store.h"
#include "support/etcd.h"

using dltrain::store::Observation;
using dltrain::store::Store;
using dltrain::testing::observation;
using dltrain::testing::TempDir;

namespace {

struct Backend {
  std::string name;
  /// Opens (or reopens) the backend's store at a location derived from `dir`.
  std::function<std::unique_ptr<Store>(const std::filesystem::path& dir)> open;
};

// Its name in GoogleTest's output (not its bytes).
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

// The term that fences an etcd store at `prefix`: the create revision of its election
// key, created by the first opening (as a leader's election would).
std::int64_t term_at(const std::string& prefix) {
  dltrain::ha::EtcdClient c(dltrain::testing::EtcdServer::shared()->options());
  const auto r = c.create(prefix + "/leader", "{\"candidate\":\"test\"}", 0);
  return r.succeeded ? r.revision : r.current->create_revision;
}

const std::vector<Backend> kBackends = {
    {"rocksdb", [](const std::filesystem::path& dir) -> std::unique_ptr<Store> {
       return dltrain::store::RocksDbStore::open((dir / "db").string());
     }},
    // The leader's state with [ha] (docs/ha.md): a real etcd; every location a key prefix.
    {"etcd", [](const std::filesystem::path& dir) -> std::unique_ptr<Store> {
       const std::string prefix = "/contract/" + dir.filename().string();
       return std::make_unique<dltrain::ha::EtcdStore>(dltrain::testing::EtcdServer::shared()->options(), prefix,
                                                       prefix + "/leader", term_at(prefix));
     }},
};

class StoreContract : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().name == "etcd" && !dltrain::testing::EtcdServer::shared()) {
      GTEST_SKIP() << "/usr/bin/etcd is missing (Debian's etcd-server; scripts/setup installs it)";
    }
  }
  std::unique_ptr<Store> open() { return GetParam().open(dir_.path); }
  TempDir dir_;
};

}  // namespace

TEST_P(StoreContract, HistoryIsFilteredByModelAndDatasetAndOldestFirst) {
  auto s = open();
  s->add_observation(observation("cnn", "fashion-mnist", 1000.0, 2));
  s->add_observation(observation("mlp", "fashion-mnist", 1001.0, 1));
  s->add_observation(observation("cnn", "fashion-mnist", 999.0, 4));
  s->add_observation(observation("cnn", "cifar10", 998.0, 8));
  // "cnn" must not match a model whose name it prefixes.
  s->add_observation(observation("cnn2", "fashion-mnist", 997.0, 16));
  auto cnn = s->history("cnn", "fashion-mnist");
  ASSERT_EQ(cnn.size(), 2u);
  EXPECT_EQ(cnn[0].workers, 4);  // 999.0 before 1000.0
  EXPECT_EQ(cnn[1].workers, 2);
  EXPECT_EQ(cnn[1].images_per_sec, 2926.8);
  EXPECT_EQ(cnn[1].job, "job-2");
  EXPECT_EQ(s->history("cnn").size(), 3u);
  EXPECT_EQ(s->history().size(), 5u);
  EXPECT_EQ(s->history("mlp").size(), 1u);
  EXPECT_TRUE(s->history("resnet20").empty());
  const auto all = s->history();
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end(),
                             [](const Observation& a, const Observation& b) { return a.timestamp < b.timestamp; }));
}

// A row added after a reopen, with the model, dataset and timestamp of one stored before,
// is a second row: it replaces nothing.
TEST_P(StoreContract, ARowAddedAfterAReopenKeepsTheRowsBeforeIt) {
  { open()->add_observation(observation("cnn", "fashion-mnist", 1000.0, 2)); }
  auto s = open();
  s->add_observation(observation("cnn", "fashion-mnist", 1000.0, 4));
  const auto rows = s->history("cnn", "fashion-mnist");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].workers + rows[1].workers, 6);
}

TEST_P(StoreContract, JobsComeBackByAscendingNumberAndAPutReplaces) {
  auto s = open();
  s->put_job(12, {{"id", "job-12"}, {"state", "queued"}});
  s->put_job(1, {{"id", "job-1"}, {"state", "running"}});
  s->put_job(256, {{"id", "job-256"}});
  s->put_job(1, {{"id", "job-1"}, {"state", "succeeded"}});
  const auto jobs = s->jobs();
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[0].first, 1u);
  EXPECT_EQ(jobs[1].first, 12u);
  EXPECT_EQ(jobs[2].first, 256u);
  EXPECT_EQ(jobs[0].second["state"], "succeeded");
  EXPECT_EQ(jobs[1].second["state"], "queued");
}

TEST_P(StoreContract, EventsKeepTheirOrderAndContinueAfterAReopen) {
  {
    auto s = open();
    s->append_event(1, {{"event", "state"}, {"state", "starting"}});
    s->append_event(2, {{"event", "state"}, {"state", "queued"}});
    s->append_event(1, {{"event", "state"}, {"state", "running"}});
    s->flush();
  }
  auto s = open();
  ASSERT_EQ(s->events(1).size(), 2u);
  EXPECT_EQ(s->events(1)[1]["state"], "running");
  s->append_event(1, {{"event", "state"}, {"state", "succeeded"}});
  const auto ev = s->events(1);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0]["state"], "starting");
  EXPECT_EQ(ev[2]["state"], "succeeded");
  EXPECT_EQ(s->events(2).size(), 1u);
  EXPECT_TRUE(s->events(3).empty());
}

TEST_P(StoreContract, DeletingAJobRemovesItsRecordAndEventsAndNothingElse) {
  {
    auto s = open();
    s->add_observation(observation("cnn", "fashion-mnist", 1000.0, 2));
    for (std::uint64_t n : {1, 2, 3, 256}) {
      s->put_job(n, {{"id", "job-" + std::to_string(n)}});
      for (int e = 0; e < 3; ++e) s->append_event(n, {{"event", "state"}, {"n", e}});
    }
    s->delete_job(2);
    s->delete_job(255);  // job-256's key differs from 255's in the last byte only
    s->delete_job(77);   // not stored: nothing happens
    s->put_meta("next_job", "257");
    s->flush();
  }
  auto s = open();  // reopened: the deletion is durable
  std::vector<std::uint64_t> left;
  for (const auto& [n, j] : s->jobs()) left.push_back(n);
  EXPECT_EQ(left, (std::vector<std::uint64_t>{1, 3, 256}));
  EXPECT_TRUE(s->events(2).empty());
  for (std::uint64_t n : {1, 3, 256}) {
    ASSERT_EQ(s->events(n).size(), 3u) << n;
    EXPECT_EQ(s->events(n)[2]["n"], 2);
  }
  EXPECT_EQ(s->history().size(), 1u);
  EXPECT_EQ(s->get_meta("next_job"), "257");
}

TEST_P(StoreContract, NamedValuesAreStoredReplacedAndAbsentUntilPut) {
  auto s = open();
  EXPECT_FALSE(s->read_only());
  EXPECT_FALSE(s->location().empty());
  EXPECT_FALSE(s->get_meta("next_job").has_value());
  s->put_meta("next_job", "13");
  s->put_meta("plan/cnn/fashion-mnist", R"({"workers":2})");
  s->put_meta("next_job", "14");
  EXPECT_EQ(s->get_meta("next_job"), "14");
  EXPECT_EQ(s->get_meta("plan/cnn/fashion-mnist"), R"({"workers":2})");
  EXPECT_FALSE(s->get_meta("absent").has_value());
}

// Thread-safety: four threads append 50 events each to one job and 50 observations each
// at once; nothing is lost and each thread's events keep their order.
TEST_P(StoreContract, ConcurrentWritersLoseNothingAndKeepEachWritersOrder) {
  auto s = open();
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        s->append_event(7, {{"thread", t}, {"i", i}});
        s->add_observation(observation("cnn", "fashion-mnist", 1000.0 + t * kEach + i, t + 1));
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto ev = s->events(7);
  ASSERT_EQ(ev.size(), static_cast<std::size_t>(kThreads * kEach));
  std::vector<int> next(kThreads, 0);
  for (const auto& e : ev) {
    const int t = e["thread"];
    EXPECT_EQ(e["i"], next[t]) << "thread " << t << "'s events out of order";
    ++next[t];
  }
  EXPECT_EQ(s->history("cnn").size(), static_cast<std::size_t>(kThreads * kEach));
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreContract, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Backend>& info) { return info.param.name; });

// Beyond the contract, what only the etcd backend does: a write of a leader whose term is
// over (the election key re-created by another) is refused by etcd and changes nothing,
// and the oldest events and observations beyond its limits go as new ones come.
TEST(EtcdStore, AWriteAfterTheTermEndedIsRefusedAndChangesNothing) {
  auto* etcd = dltrain::testing::EtcdServer::shared();
  if (!etcd) GTEST_SKIP() << "/usr/bin/etcd is missing";
  TempDir dir;
  const std::string prefix = "/fenced/" + dir.path.filename().string();
  const auto term = term_at(prefix);
  std::string fenced_why;
  dltrain::ha::EtcdStore s(etcd->options(), prefix, prefix + "/leader", term,
                           [&](const std::string& why) { fenced_why = why; });
  s.put_job(1, {{"state", "running"}});
  // Another leader's term: the key deleted (its lease expired) and created again.
  dltrain::ha::EtcdClient c(etcd->options());
  c.erase(prefix + "/leader");
  const auto next = c.create(prefix + "/leader", "{\"candidate\":\"other\"}", 0);
  ASSERT_TRUE(next.succeeded);
  try {
    s.put_job(1, {{"state", "failed"}});
    FAIL() << "a stale leader's write was applied";
  } catch (const dltrain::store::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("this leader's term " + std::to_string(term) + " is over (term " +
                                         std::to_string(next.revision) + " serves)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fenced_why.empty());
  EXPECT_THROW(s.append_event(1, {{"event", "x"}}), dltrain::store::StoreError);
  EXPECT_THROW(s.delete_job(1), dltrain::store::StoreError);
  // What the new leader reads: the record as the old term left it, no event.
  dltrain::ha::EtcdStore now(etcd->options(), prefix, prefix + "/leader", next.revision);
  const auto jobs = now.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].second["state"], "running");
  EXPECT_TRUE(now.events(1).empty());
}

TEST(EtcdStore, KeepsTheLatestEventsAndObservationsWithinItsLimits) {
  auto* etcd = dltrain::testing::EtcdServer::shared();
  if (!etcd) GTEST_SKIP() << "/usr/bin/etcd is missing";
  TempDir dir;
  const std::string prefix = "/limits/" + dir.path.filename().string();
  dltrain::ha::EtcdStore::Limits limits;
  limits.events_per_job = 3;
  limits.observations = 2;
  {
    dltrain::ha::EtcdStore s(etcd->options(), prefix, prefix + "/leader", term_at(prefix), {}, limits);
    for (int i = 0; i < 5; ++i) s.append_event(7, {{"n", i}});
    for (int i = 0; i < 3; ++i) s.add_observation(observation("cnn", "fashion-mnist", 1000.0 + i, i + 1));
  }
  // Reopened: the sequence goes on after the largest kept.
  dltrain::ha::EtcdStore s(etcd->options(), prefix, prefix + "/leader", term_at(prefix), {}, limits);
  s.append_event(7, {{"n", 5}});
  const auto ev = s.events(7);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0]["n"], 3);
  EXPECT_EQ(ev[2]["n"], 5);
  const auto h = s.history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].workers, 2);
  EXPECT_EQ(h[1].workers, 3);
  EXPECT_THROW(s.put_meta("big", std::string(dltrain::ha::EtcdStore::kMaxValueBytes + 1, 'x')),
               dltrain::store::StoreError);
}

// Reads come in pages of 500 keys: 1,001 events come back whole and in order.
TEST(EtcdStore, ReadsMoreKeysThanOnePageHolds) {
  auto* etcd = dltrain::testing::EtcdServer::shared();
  if (!etcd) GTEST_SKIP() << "/usr/bin/etcd is missing";
  TempDir dir;
  const std::string prefix = "/pages/" + dir.path.filename().string();
  dltrain::ha::EtcdStore s(etcd->options(), prefix, prefix + "/leader", term_at(prefix));
  for (int i = 0; i < 1001; ++i) s.append_event(3, {{"n", i}});
  const auto ev = s.events(3);
  ASSERT_EQ(ev.size(), 1001u);
  for (int i = 0; i < 1001; ++i) ASSERT_EQ(ev[i]["n"], i);
}
