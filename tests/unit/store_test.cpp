// The RocksDB store: a real database in a temporary directory, reopened by another
// process, locked against a second opener, and refusing corrupt files clearly.
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;
#include <unistd.h>

#include <filesystem>
#include <signal.h>
#include <vector>
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

// Runs this test binary again as a new process (fork + exec at once: nothing of this
// process's RocksDB threads is carried over) with only `filter` selected and the
// database path in DLTRAIN_STORE_CHILD; returns its exit status (0 = its checks passed).
// Bounded: the child is killed after 60 s.
int run_child(const std::string& filter, const std::string& db) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) env_store.emplace_back(*e);
  env_store.push_back("DLTRAIN_STORE_CHILD=" + db);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string arg = "--gtest_filter=" + filter;
  char* argv[] = {self.data(), arg.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    execve(self.c_str(), argv, envp.data());
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

const char* child_db() { return std::getenv("DLTRAIN_STORE_CHILD"); }

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
  EXPECT_EQ(run_child("StoreChild.ReadsBack", db), 0);
  auto s = Store::open(db);
  EXPECT_EQ(s->events(1).size(), 3u);
}

TEST(Store, ASecondProcessGetsAClearError) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  auto s = Store::open(db);
  EXPECT_EQ(run_child("StoreChild.OpenIsRefused", db), 0);
}

// The child halves of the tests above: they run only in the process run_child starts.
TEST(StoreChild, ReadsBack) {
  if (child_db() == nullptr) GTEST_SKIP() << "runs only as a child of Store.WrittenClosedReopenedByAnotherProcessAndReadBack";
  auto s = Store::open(child_db());
  auto cnn = s->history("cnn", "fashion-mnist");
  ASSERT_EQ(cnn.size(), 2u);
  EXPECT_EQ(cnn[0].workers, 4);  // oldest first
  EXPECT_EQ(cnn[1].workers, 2);
  EXPECT_EQ(cnn[1].images_per_sec, 2926.8);
  EXPECT_EQ(cnn[1].job, "job-2");
  EXPECT_EQ(s->history().size(), 3u);
  EXPECT_EQ(s->history("mlp").size(), 1u);
  auto jobs = s->jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].first, 1u);
  EXPECT_EQ(jobs[1].first, 12u);
  EXPECT_EQ(jobs[1].second["state"], "queued");
  auto ev = s->events(1);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["state"], "running");
  EXPECT_EQ(s->get_meta("next_job"), "13");
  EXPECT_FALSE(s->get_meta("absent").has_value());
  // Appending after a reopen continues the event sequence.
  s->append_event(1, {{"event", "state"}, {"state", "succeeded"}});
  ASSERT_EQ(s->events(1).size(), 3u);
  EXPECT_EQ(s->events(1)[2]["state"], "succeeded");
}

TEST(StoreChild, OpenIsRefused) {
  if (child_db() == nullptr) GTEST_SKIP() << "runs only as a child of Store.ASecondProcessGetsAClearError";
  try {
    Store::open(child_db());
    FAIL() << "a second process opened a database that is in use";
  } catch (const StoreError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("another process"), std::string::npos) << m;
    EXPECT_NE(m.find(child_db()), std::string::npos) << m;
  }
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
