#include "store/rocksdb_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <cstdio>

namespace dltrain::store {

namespace {

void check(const rocksdb::Status& s, const std::string& path, const std::string& what) {
  if (s.ok()) return;
  std::string msg = "state database " + path + ": " + what + " failed: " + s.ToString();
  const std::string text = s.ToString();
  if (text.find("lock") != std::string::npos || text.find("LOCK") != std::string::npos ||
      text.find("Resource temporarily unavailable") != std::string::npos) {
    msg += " (another process, probably another dltrain-agent with the same state_dir, has it open)";
  } else if (text.find("Permission denied") != std::string::npos) {
    msg += " (the agent's user needs read and write access to the directory)";
  } else if (s.IsCorruption()) {
    msg += " (the files are damaged; restore the directory from a backup or move it aside to start empty)";
  } else if (text.find("No space left on device") != std::string::npos || s.IsNoSpace()) {
    msg += " (the file system holding the state directory is full; free space there: the store tries again at "
           "its next write, and what it stored before is intact)";
  } else if (text.find("Read-only file system") != std::string::npos) {
    msg += " (the file system holding the state directory is mounted read-only; remount it read-write and "
           "restart the agent)";
  }
  throw StoreError(msg);
}

bool read_only_fs(const rocksdb::Status& s) {
  return !s.ok() && s.ToString().find("Read-only file system") != std::string::npos;
}

void put_be(std::string& k, std::uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) k.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

std::uint64_t get_be(const rocksdb::Slice& s, std::size_t off, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(s.data()[off + i]);
  return v;
}

nlohmann::json parse(const rocksdb::Slice& v, const std::string& path, const std::string& where) {
  try {
    return nlohmann::json::parse(v.data(), v.data() + v.size());
  } catch (const nlohmann::json::exception& e) {
    throw StoreError("state database " + path + ": corrupt record in " + where + ": " + e.what());
  }
}

}  // namespace

struct RocksDbStore::Impl {
  std::string path;
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::ColumnFamilyHandle* history = nullptr;
  rocksdb::ColumnFamilyHandle* jobs = nullptr;
  rocksdb::ColumnFamilyHandle* events = nullptr;
  bool read_only = false;
  RocksDbOptions options;
  std::mutex mu;
  std::uint32_t history_seq = 0;
  std::map<std::uint64_t, std::uint64_t> event_seq;

  ~Impl() {
    if (db) {
      for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
      db->Close();
    }
  }
};

// Every write: refused at once on a read-only store or below the free-space reserve
// (RocksDbOptions::min_free_bytes: RocksDB must not meet a full disk); otherwise tried,
// and after a failure that left RocksDB in its background-error state (it then refuses
// every write until resumed), resumed and tried once more.
template <typename Op>
void write(RocksDbStore::Impl& im, const std::string& what, Op op) {
  if (im.read_only) {
    throw StoreError("state database " + im.path + ": " + what +
                     " refused: the database is open read-only (its file system is mounted read-only; remount it "
                     "read-write and restart the agent)");
  }
  if (im.options.min_free_bytes > 0) {
    struct statvfs fs {};
    if (::statvfs(im.path.c_str(), &fs) == 0) {
      const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (free_bytes < im.options.min_free_bytes) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "only %.1f MiB free on its file system, below the reserve of %.1f MiB",
                      static_cast<double>(free_bytes) / (1 << 20),
                      static_cast<double>(im.options.min_free_bytes) / (1 << 20));
        throw StoreError("state database " + im.path + ": " + what + " refused: " + buf +
                         " (the disk is (nearly) full; free space there: writes are taken again as soon as there "
                         "is, and what was stored before is intact)");
      }
    }
  }
  auto s = op();
  if (!s.ok() && (s.IsIOError() || s.IsNoSpace())) {
    if (im.db->Resume().ok()) s = op();
  }
  check(s, im.path, what);
}

RocksDbStore::RocksDbStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RocksDbStore::~RocksDbStore() = default;

std::unique_ptr<RocksDbStore> RocksDbStore::open(const std::string& path, const RocksDbOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw StoreError("state database " + path + ": cannot create the directory: " + ec.message());
  auto im = std::make_unique<Impl>();
  im->path = path;
  im->options = options;
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.create_missing_column_families = true;
  opts.paranoid_checks = true;
  opts.keep_log_file_num = 5;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs{
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"history", rocksdb::ColumnFamilyOptions()},
      {"jobs", rocksdb::ColumnFamilyOptions()},
      {"events", rocksdb::ColumnFamilyOptions()}};
  rocksdb::DB* raw = nullptr;
  auto st = rocksdb::DB::Open(opts, path, cfs, &im->handles, &raw);
  if (read_only_fs(st)) {
    // A state directory on a read-only file system can still be read: serve it, and
    // refuse every write with the reason (RocksDbStore::read_only()).
    im->handles.clear();
    check(rocksdb::DB::OpenForReadOnly(opts, path, cfs, &im->handles, &raw), path, "open (read-only)");
    im->read_only = true;
  } else {
    check(st, path, "open");
  }
  im->db.reset(raw);
  im->history = im->handles[1];
  im->jobs = im->handles[2];
  im->events = im->handles[3];
  // History keys end in a sequence number that tells apart rows of one model, dataset
  // and microsecond: it continues after the largest stored, so that a row added after a
  // reopen never takes the key (and replaces the value) of an earlier one.
  std::unique_ptr<rocksdb::Iterator> it(im->db->NewIterator(rocksdb::ReadOptions(), im->history));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() >= 4) {
      const auto seq = static_cast<std::uint32_t>(get_be(it->key(), it->key().size() - 4, 4));
      im->history_seq = std::max(im->history_seq, seq + 1);
    }
  }
  check(it->status(), path, "reading history");
  it.reset();
  return std::unique_ptr<RocksDbStore>(new RocksDbStore(std::move(im)));
}

void RocksDbStore::add_observation(const Observation& o) {
  auto& im = *impl_;
  std::string key = o.model;
  key.push_back('\0');
  key += o.dataset;
  key.push_back('\0');
  const auto us = static_cast<std::uint64_t>(o.timestamp * 1e6);
  put_be(key, us, 8);
  {
    std::lock_guard lock(im.mu);
    put_be(key, im.history_seq++, 4);
  }
  const std::string value = nlohmann::json(o).dump();
  write(im, "writing an observation", [&] { return im.db->Put(rocksdb::WriteOptions(), im.history, key, value); });
}

std::vector<Observation> RocksDbStore::history(const std::string& model, const std::string& dataset) const {
  auto& im = *impl_;
  std::vector<Observation> out;
  std::string prefix;
  if (!model.empty()) {
    prefix = model;
    prefix.push_back('\0');
    if (!dataset.empty()) {
      prefix += dataset;
      prefix.push_back('\0');
    }
  }
  std::unique_ptr<rocksdb::Iterator> it(im.db->NewIterator(rocksdb::ReadOptions(), im.history));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    Observation o;
    try {
      o = parse(it->value(), im.path, "history").get<Observation>();
    } catch (const nlohmann::json::exception& e) {
      throw StoreError("state database " + im.path + ": corrupt record in history: " + e.what());
    }
    if (!dataset.empty() && o.dataset != dataset) continue;
    out.push_back(std::move(o));
  }
  check(it->status(), im.path, "reading history");
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.timestamp < b.timestamp; });
  return out;
}

void RocksDbStore::put_job(std::uint64_t number, const nlohmann::json& job) {
  auto& im = *impl_;
  std::string key;
  put_be(key, number, 8);
  const std::string value = job.dump();
  write(im, "writing a job", [&] { return im.db->Put(rocksdb::WriteOptions(), im.jobs, key, value); });
}

std::vector<std::pair<std::uint64_t, nlohmann::json>> RocksDbStore::jobs() const {
  auto& im = *impl_;
  std::vector<std::pair<std::uint64_t, nlohmann::json>> out;
  std::unique_ptr<rocksdb::Iterator> it(im.db->NewIterator(rocksdb::ReadOptions(), im.jobs));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() != 8) throw StoreError("state database " + im.path + ": corrupt job key");
    out.emplace_back(get_be(it->key(), 0, 8), parse(it->value(), im.path, "jobs"));
  }
  check(it->status(), im.path, "reading jobs");
  return out;
}

void RocksDbStore::append_event(std::uint64_t job, const nlohmann::json& event) {
  auto& im = *impl_;
  std::uint64_t seq;
  {
    std::lock_guard lock(im.mu);
    auto found = im.event_seq.find(job);
    if (found == im.event_seq.end()) {
      // Continue after the last stored event of this job (after a restart).
      std::string prefix;
      put_be(prefix, job, 8);
      std::string upper;
      put_be(upper, job + 1, 8);
      std::unique_ptr<rocksdb::Iterator> it(im.db->NewIterator(rocksdb::ReadOptions(), im.events));
      it->SeekForPrev(upper);
      std::uint64_t next = 0;
      if (it->Valid() && it->key().starts_with(prefix) && it->key().size() == 16) next = get_be(it->key(), 8, 8) + 1;
      found = im.event_seq.emplace(job, next).first;
    }
    seq = found->second++;
  }
  std::string key;
  put_be(key, job, 8);
  put_be(key, seq, 8);
  const std::string value = event.dump();
  write(im, "writing an event", [&] { return im.db->Put(rocksdb::WriteOptions(), im.events, key, value); });
}

std::vector<nlohmann::json> RocksDbStore::events(std::uint64_t job) const {
  auto& im = *impl_;
  std::string prefix;
  put_be(prefix, job, 8);
  std::vector<nlohmann::json> out;
  std::unique_ptr<rocksdb::Iterator> it(im.db->NewIterator(rocksdb::ReadOptions(), im.events));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    out.push_back(parse(it->value(), im.path, "events"));
  }
  check(it->status(), im.path, "reading events");
  return out;
}

void RocksDbStore::delete_job(std::uint64_t number) {
  auto& im = *impl_;
  std::string key, upper;
  put_be(key, number, 8);
  put_be(upper, number + 1, 8);
  rocksdb::WriteBatch batch;
  check(batch.Delete(im.jobs, key), im.path, "deleting a job");
  check(batch.DeleteRange(im.events, key, upper), im.path, "deleting a job's events");
  write(im, "deleting a job", [&] { return im.db->Write(rocksdb::WriteOptions(), &batch); });
  std::lock_guard lock(im.mu);
  im.event_seq.erase(number);
}

void RocksDbStore::put_meta(const std::string& name, const std::string& value) {
  auto& im = *impl_;
  write(im, "writing " + name,
        [&] { return im.db->Put(rocksdb::WriteOptions(), im.db->DefaultColumnFamily(), "meta/" + name, value); });
}

std::optional<std::string> RocksDbStore::get_meta(const std::string& name) const {
  auto& im = *impl_;
  std::string v;
  auto s = im.db->Get(rocksdb::ReadOptions(), im.db->DefaultColumnFamily(), "meta/" + name, &v);
  if (s.IsNotFound()) return std::nullopt;
  check(s, im.path, "reading " + name);
  return v;
}

void RocksDbStore::flush() {
  auto& im = *impl_;
  if (im.read_only) return;  // nothing was written
  rocksdb::FlushOptions fo;
  fo.wait = true;
  write(im, "flush", [&] { return im.db->Flush(fo, im.handles); });
}

bool RocksDbStore::read_only() const { return impl_->read_only; }

const std::string& RocksDbStore::location() const { return impl_->path; }

}  // namespace dltrain::store
