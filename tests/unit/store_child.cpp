// The second process of tests/unit/store_test.cpp, started by exec (never a fork of a
// process that has RocksDB threads). Usage: store_child read-back|open-refused|write-and-hang DB_DIR.
// Exit 0 when every check holds; otherwise prints the first failed check and exits 1.
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>
#include <string>

#include "store/rocksdb_store.h"

using dltrain::store::RocksDbStore;
using dltrain::store::StoreError;

namespace {

int fail(const std::string& what) {
  std::cerr << "store_child: " << what << "\n";
  return 1;
}

int read_back(const std::string& db) {
  auto s = RocksDbStore::open(db);
  auto cnn = s->history("cnn", "fashion-mnist");
  if (cnn.size() != 2) return fail("expected 2 cnn rows, got " + std::to_string(cnn.size()));
  if (cnn[0].workers != 4 || cnn[1].workers != 2) return fail("history is not oldest first");
  if (cnn[1].images_per_sec != 2926.8 || cnn[1].job != "job-2") return fail("row fields differ");
  if (s->history().size() != 3 || s->history("mlp").size() != 1) return fail("model filter");
  auto jobs = s->jobs();
  if (jobs.size() != 2 || jobs[0].first != 1 || jobs[1].first != 12) return fail("job keys");
  if (jobs[1].second["state"] != "queued") return fail("job record");
  auto ev = s->events(1);
  if (ev.size() != 2 || ev[1]["state"] != "running") return fail("events");
  if (s->get_meta("next_job") != "13" || s->get_meta("absent").has_value()) return fail("meta");
  // Appending after a reopen continues the event sequence.
  s->append_event(1, {{"event", "state"}, {"state", "succeeded"}});
  if (s->events(1).size() != 3 || s->events(1)[2]["state"] != "succeeded") return fail("event sequence");
  return 0;
}

int open_refused(const std::string& db) {
  try {
    RocksDbStore::open(db);
  } catch (const StoreError& e) {
    const std::string m = e.what();
    if (m.find("another process") == std::string::npos || m.find(db) == std::string::npos) {
      return fail("unclear error: " + m);
    }
    return 0;
  }
  return fail("a second process opened a database that is in use");
}

// Writes three rows and the job counter (no flush: they live in the write-ahead log),
// creates DB_DIR/written, then sleeps holding the database until it is killed.
int write_and_hang(const std::string& db) {
  auto s = RocksDbStore::open(db);
  for (int w = 1; w <= 3; ++w) {
    dltrain::store::Observation o;
    o.model = "cnn";
    o.dataset = "fashion-mnist";
    o.workers = w;
    o.timestamp = 1000.0 + w;
    s->add_observation(o);
  }
  s->put_meta("next_job", "4");
  std::ofstream(db + "/written") << "1\n";
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // bounded: 60 s
  return fail("not killed within 60 s");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: store_child read-back|open-refused|write-and-hang DB_DIR");
  const std::string mode = argv[1];
  try {
    if (mode == "read-back") return read_back(argv[2]);
    if (mode == "open-refused") return open_refused(argv[2]);
    if (mode == "write-and-hang") return write_and_hang(argv[2]);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return fail("unknown mode " + mode);
}
