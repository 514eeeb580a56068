// The RocksDB store: a real database in a temporary directory, reopened by another
// process, locked against a second opener, and refusing corrupt files clearly.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "support/temp_dir.h"

#include "store/store.h"

using namespace dltrain;
using namespace dltrain::store;
namespace fs = std::filesystem;
using dltrain::testing::TempDir;

namespace {

Observation obs(const std::string& model, double ts, int workers) {
  Observation o;
  o.model = model;
  o.dataset = "fashion-mnist";
  o.job = "job-" + std::to_string(workers);
  o.workers = workers;
  o.batch_size = 64;
  o.epoch = 1;
  o.epoch_seconds = 20.5;
  o.images_per_sec = 2926.8;
  o.timestamp = ts;
  return o;
}

// Runs `f` in a child process; returns its exit status (0 = all checks passed).
template <typename F>
int in_child(F f) {
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = f();
    } catch (...) {
      rc = 99;
    }
    _exit(rc);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

}  // namespace

TEST(Store, WrittenClosedReopenedByAnotherProcessAndReadBack) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  {
    auto s = Store::open(db);
    s->add_observation(obs("cnn", 1000.0, 2));
    s->add_observation(obs("mlp", 1001.0, 1));
    s->add_observation(obs("cnn", 999.0, 4));
    s->put_job(1, {{"id", "job-1"}, {"state", "running"}});
    s->put_job(12, {{"id", "job-12"}, {"state", "queued"}});
    s->append_event(1, {{"event", "state"}, {"state", "starting"}});
    s->append_event(1, {{"event", "state"}, {"state", "running"}});
    s->put_meta("next_job", "13");
    s->flush();
  }
  // A new process opens the same directory and sees everything, in key order.
  const int rc = in_child([&] {
    auto s = Store::open(db);
    auto cnn = s->history("cnn", "fashion-mnist");
    if (cnn.size() != 2 || cnn[0].workers != 4 || cnn[1].workers != 2) return 2;  // oldest first
    if (cnn[1].images_per_sec != 2926.8 || cnn[1].job != "job-2") return 3;
    if (s->history().size() != 3 || s->history("mlp").size() != 1) return 4;
    auto jobs = s->jobs();
    if (jobs.size() != 2 || jobs[0].first != 1 || jobs[1].first != 12) return 5;
    if (jobs[1].second["state"] != "queued") return 6;
    auto ev = s->events(1);
    if (ev.size() != 2 || ev[1]["state"] != "running") return 7;
    if (s->get_meta("next_job") != "13" || s->get_meta("absent").has_value()) return 8;
    // Appending after a reopen continues the event sequence.
    s->append_event(1, {{"event", "state"}, {"state", "succeeded"}});
    return s->events(1).size() == 3 && s->events(1)[2]["state"] == "succeeded" ? 0 : 9;
  });
  EXPECT_EQ(rc, 0);
  auto s = Store::open(db);
  EXPECT_EQ(s->events(1).size(), 3u);
}

TEST(Store, ASecondProcessGetsAClearError) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  auto s = Store::open(db);
  const int rc = in_child([&] {
    try {
      Store::open(db);
    } catch (const StoreError& e) {
      const std::string m = e.what();
      return m.find("another process") != std::string::npos && m.find(db) != std::string::npos ? 0 : 2;
    }
    return 3;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Store, CorruptOrUnusableDirectoriesGiveClearErrors) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  { Store::open(db)->put_meta("x", "1"); }
  // Damage the manifest pointer.
  std::ofstream(d.path / "db" / "CURRENT", std::ios::trunc) << "MANIFEST-999999\n";
  try {
    Store::open(db);
    FAIL() << "opened a database with a dangling CURRENT";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("state database " + db + ": open failed"), std::string::npos) << e.what();
  }
  // A regular file where the directory should be.
  std::ofstream(d.path / "file") << "x";
  EXPECT_THROW(Store::open((d.path / "file").string()), StoreError);
}
