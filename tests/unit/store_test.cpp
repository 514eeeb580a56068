// The RocksDB store: a real database in a temporary directory, reopened by another
// process, locked against a second opener, and refusing corrupt files clearly.
#include <sys/wait.h>
#include <unistd.h>

#include <unistd.h>

#include <filesystem>
#include <signal.h>
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

// Runs tests/unit/store_child.cpp as a new process (exec, not a bare fork of this
// process, whose RocksDB threads could hold locks in the child); returns its exit status
// (0 = its checks held). Bounded: the child is killed after 60 s.
int run_child(const std::string& mode, const std::string& db) {
  const std::string exe = std::string(DLTRAIN_BIN_DIR) + "/store_child";
  const pid_t pid = fork();
  if (pid == 0) {
    execl(exe.c_str(), "store_child", mode.c_str(), db.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return 124;
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
  EXPECT_EQ(run_child("read-back", db), 0);
  auto s = Store::open(db);
  EXPECT_EQ(s->events(1).size(), 3u);
}

TEST(Store, ASecondProcessGetsAClearError) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  auto s = Store::open(db);
  EXPECT_EQ(run_child("open-refused", db), 0);
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
