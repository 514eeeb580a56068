// The RocksDB store: a real database in a temporary directory, reopened by another
// process, locked against a second opener, and refusing corrupt files clearly; under
// storage faults (a full and a read-only tmpfs, a lock left by a killed process). What
// every backend must do is tests/unit/store_contract_test.cpp.
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "support/observations.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"
#include "support/wait.h"

#include "store/rocksdb_store.h"

using namespace dltrain;
using namespace dltrain::store;
namespace fs = std::filesystem;
using dltrain::testing::TempDir;

namespace {

Observation obs(const std::string& model, double ts, int workers) {
  return dltrain::testing::observation(model, "fashion-mnist", ts, workers);
}

// Runs tests/unit/store_child.cpp as a new process (exec, not a bare fork of this
// process, whose RocksDB threads could hold locks in the child); returns its exit status
// (0 = its checks held; -1 when it had not ended within 60 s, and it is then killed).
int run_child(const std::string& mode, const std::string& db) {
  dltrain::testing::Background child(std::string(DLTRAIN_BIN_DIR) + "/store_child " + mode + " " + db,
                                     db + ".child-" + mode + ".log");
  return child.wait(60);
}

}  // namespace

TEST(Store, WrittenClosedReopenedByAnotherProcessAndReadBack) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  {
    auto s = RocksDbStore::open(db);
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
  auto s = RocksDbStore::open(db);
  EXPECT_EQ(s->events(1).size(), 3u);
}

TEST(Store, ASecondProcessGetsAClearError) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  auto s = RocksDbStore::open(db);
  EXPECT_EQ(run_child("open-refused", db), 0);
}

TEST(Store, CorruptOrUnusableDirectoriesGiveClearErrors) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  { RocksDbStore::open(db)->put_meta("x", "1"); }
  // Damage the manifest pointer.
  std::ofstream(d.path / "db" / "CURRENT", std::ios::trunc) << "MANIFEST-999999\n";
  try {
    RocksDbStore::open(db);
    FAIL() << "opened a database with a dangling CURRENT";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("state database " + db + ": open failed"), std::string::npos) << e.what();
  }
  // A regular file where the directory should be.
  std::ofstream(d.path / "file") << "x";
  EXPECT_THROW(RocksDbStore::open((d.path / "file").string()), StoreError);
}

// A full disk (a 16 MiB tmpfs the test mounts and fills to 1 MiB free, below a reserve of
// 4 MiB): a write is refused with the cause before RocksDB meets the full disk, nothing
// stored before is lost, reads go on, and writing works again once space is freed — in
// this process and after a reopen.
TEST(StoreFaults, AFullDiskRefusesWritesWithTheCauseLosesNothingAndRecoversWhenSpaceIsFreed) {
  dltrain::testing::Tmpfs fs(16u << 20);
  if (!fs.error().empty()) GTEST_SKIP() << "needs root to mount a tmpfs: " << fs.error();
  const std::string db = (fs.path() / "db").string();
  RocksDbOptions opt;
  opt.min_free_bytes = 4u << 20;
  auto s = RocksDbStore::open(db, opt);
  int stored = 0;
  for (; stored < 50; ++stored) s->add_observation(obs("cnn", 1000.0 + stored, stored + 1));
  s->put_job(1, {{"id", "job-1"}, {"state", "running"}});
  ASSERT_GT(fs.fill(1u << 20), 0u);
  ASSERT_LE(fs.free_bytes(), 1u << 20);
  try {
    s->add_observation(obs("cnn", 1000.0 + stored, stored + 1));
    ADD_FAILURE() << "a row was written below the reserve";
  } catch (const StoreError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("state database " + db + ": writing an observation refused: only "), std::string::npos) << m;
    EXPECT_NE(m.find("MiB free on its file system, below the reserve of 4.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("free space there"), std::string::npos) << m;
  }
  EXPECT_THROW(s->put_job(2, {{"id", "job-2"}}), StoreError);
  EXPECT_THROW(s->append_event(1, {{"event", "x"}}), StoreError);
  EXPECT_THROW(s->put_meta("next_job", "3"), StoreError);
  // Reads keep working, and hold everything stored before.
  EXPECT_EQ(s->history("cnn").size(), static_cast<std::size_t>(stored));
  ASSERT_EQ(s->jobs().size(), 1u);
  EXPECT_EQ(s->jobs()[0].second["state"], "running");

  fs.free_space();
  s->add_observation(obs("cnn", 1000.0 + stored, stored + 1));
  ++stored;
  s->put_job(2, {{"id", "job-2"}});
  s.reset();
  auto again = RocksDbStore::open(db, opt);
  const auto rows = again->history("cnn");
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(stored));
  for (int i = 0; i < stored; ++i) EXPECT_EQ(rows[i].workers, i + 1) << "row " << i;
  EXPECT_EQ(again->jobs().size(), 2u);
}

// A read-only file system (Linux refuses to remount one read-only while a file on it is
// open for writing, so the store is closed first, as after a reboot onto a read-only
// mount): the store is opened read-only, serves everything stored, refuses writes
// saying why, and is read-write again once the file system is.
TEST(StoreFaults, AReadOnlyFileSystemServesReadsAndRefusesWritesWithTheCause) {
  dltrain::testing::Tmpfs fs(16u << 20);
  if (!fs.error().empty()) GTEST_SKIP() << "needs root to mount a tmpfs: " << fs.error();
  const std::string db = (fs.path() / "db").string();
  RocksDbOptions opt;
  opt.min_free_bytes = 1u << 20;
  {
    auto s = RocksDbStore::open(db, opt);
    s->add_observation(obs("cnn", 1000.0, 2));
    s->put_job(1, {{"id", "job-1"}, {"state", "succeeded"}});
    s->put_meta("next_job", "2");
  }
  ASSERT_TRUE(fs.remount(true)) << std::strerror(errno);
  auto ro = RocksDbStore::open(db, opt);
  EXPECT_TRUE(ro->read_only());
  ASSERT_EQ(ro->history().size(), 1u);
  EXPECT_EQ(ro->history()[0].workers, 2);
  ASSERT_EQ(ro->jobs().size(), 1u);
  EXPECT_EQ(ro->get_meta("next_job"), "2");
  try {
    ro->add_observation(obs("cnn", 1001.0, 3));
    ADD_FAILURE() << "a read-only store took a write";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("writing an observation refused: the database is open read-only"),
              std::string::npos)
        << e.what();
  }
  ro->flush();  // nothing to do, no error
  ro.reset();
  ASSERT_TRUE(fs.remount(false)) << std::strerror(errno);
  auto rw = RocksDbStore::open(db, opt);
  EXPECT_FALSE(rw->read_only());
  rw->add_observation(obs("cnn", 1002.0, 4));
  EXPECT_EQ(rw->history().size(), 2u);
  EXPECT_EQ(rw->jobs().size(), 1u);
}

// A process holding the database is killed (SIGKILL): its LOCK file stays behind, but
// the lock (an fcntl lock) died with it, so the next opener gets in and finds every row.
TEST(StoreFaults, ALockLeftByAKilledProcessDoesNotBlockTheNextOpener) {
  TempDir d;
  const std::string db = (d.path / "db").string();
  // The child writes, then creates db/written and sleeps holding the database open.
  dltrain::testing::Background child(std::string(DLTRAIN_BIN_DIR) + "/store_child write-and-hang " + db,
                                     (d.path / "child.log").string());
  const bool ready = dltrain::testing::wait_until([&] { return fs::exists(d.path / "db" / "written"); },
                                                  std::chrono::seconds(60), std::chrono::milliseconds(100));
  ASSERT_TRUE(ready) << "store_child did not get to write";
  ASSERT_EQ(child.wait(0), -1) << "store_child ended before it was killed";  // the premise: it holds the lock
  ::kill(child.pid(), SIGKILL);
  ASSERT_EQ(child.wait(30), -1) << "store_child exited instead of being killed";
  ASSERT_TRUE(fs::exists(d.path / "db" / "LOCK"));
  auto s = RocksDbStore::open(db);
  const auto rows = s->history("cnn");
  ASSERT_EQ(rows.size(), 3u);  // written without a flush: recovered from the write-ahead log
  EXPECT_EQ(rows[2].workers, 3);
  EXPECT_EQ(s->get_meta("next_job"), "4");
}
