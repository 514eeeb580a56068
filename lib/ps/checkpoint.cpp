#include "ps/checkpoint.h"

#include <chrono>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/errors.h"

namespace dltrain::ps {
namespace {

static_assert(std::endian::native == std::endian::little,
              "dltrain's checkpoint format is little-endian; big-endian hosts need byte swaps here");

std::uint32_t crc32_of(std::span<const std::byte> b) {
  // zlib's crc32 takes uInt lengths; feed it in pieces.
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t off = 0;
  while (off < b.size()) {
    const std::size_t n = std::min<std::size_t>(b.size() - off, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(b.data() + off), static_cast<uInt>(n));
    off += n;
  }
  return static_cast<std::uint32_t>(crc);
}

class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    const auto off = out_.size();
    out_.resize(off + sizeof(T));
    std::memcpy(out_.data() + off, &v, sizeof(T));
  }
  void put_floats(const std::vector<float>& v) {
    const auto off = out_.size();
    out_.resize(off + 4 * v.size());
    if (!v.empty()) std::memcpy(out_.data() + off, v.data(), 4 * v.size());
  }

 private:
  std::vector<std::byte>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  std::size_t left() const { return in_.size() - off_; }
  // Callers check left() first; this only guards against a bug.
  template <typename T>
  T get() {
    if (left() < sizeof(T)) throw ProtocolError("checkpoint: internal read past the end");
    T v;
    std::memcpy(&v, in_.data() + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  void get_floats(std::vector<float>& v, std::size_t n) {
    if (left() / 4 < n) throw ProtocolError("checkpoint: internal read past the end");
    v.resize(n);
    if (n) std::memcpy(v.data(), in_.data() + off_, 4 * n);
    off_ += 4 * n;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t off_ = 0;
};

std::string errno_text() { return std::strerror(errno); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<std::byte> encode_checkpoint(const ShardSnapshot& snap, std::uint64_t job, std::uint32_t shard) {
  std::size_t total = kCheckpointHeaderSize + 4 * snap.done.size() + kCheckpointTrailerSize;
  for (const auto& p : snap.partitions) {
    if (p.x.empty() || p.x.size() > kCheckpointMaxPartitionLength) {
      throw ProtocolError("checkpoint: partition " + std::to_string(p.key) + " has " + std::to_string(p.x.size()) +
                          " values, expected 1 to " + std::to_string(kCheckpointMaxPartitionLength));
    }
    if (!p.v.empty() && p.v.size() != p.x.size()) {
      throw ProtocolError("checkpoint: partition " + std::to_string(p.key) + " has a momentum buffer of " +
                          std::to_string(p.v.size()) + " values for " + std::to_string(p.x.size()) + " parameters");
    }
    total += kCheckpointPartitionHeaderSize + 4 * (p.x.size() + p.v.size());
  }
  std::vector<std::byte> out;
  out.reserve(total);
  Writer w(out);
  w.put<std::uint32_t>(kCheckpointMagic);
  w.put<std::uint16_t>(kCheckpointVersion);
  w.put<std::uint16_t>(0);  // flags
  w.put<std::uint64_t>(job);
  w.put<std::uint32_t>(shard);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(snap.partitions.size()));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(snap.done.size()));
  w.put<std::uint32_t>(0);  // reserved
  w.put<std::uint64_t>(snap.pushes);
  for (auto r : snap.done) w.put<std::uint32_t>(r);
  for (const auto& p : snap.partitions) {
    w.put<std::uint32_t>(p.key);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(p.x.size()));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(p.v.size()));
    w.put<std::uint32_t>(0);  // reserved
    w.put<std::uint64_t>(p.pushes);
    w.put_floats(p.x);
    w.put_floats(p.v);
  }
  w.put<std::uint32_t>(crc32_of(out));
  return out;
}

ShardSnapshot decode_checkpoint(std::span<const std::byte> bytes, std::uint64_t job, std::uint32_t shard) {
  if (bytes.size() < kCheckpointHeaderSize + kCheckpointTrailerSize) {
    throw ProtocolError("checkpoint: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                        std::to_string(kCheckpointHeaderSize + kCheckpointTrailerSize) +
                        " of an empty checkpoint (truncated)");
  }
  Reader r(bytes);
  const auto magic = r.get<std::uint32_t>();
  if (magic != kCheckpointMagic) {
    throw ProtocolError("checkpoint: magic 0x" + [&] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08X", magic);
      return std::string(buf);
    }() + ", expected 0x4B434C44 (\"DLCK\"): not a dltrain PS checkpoint");
  }
  const auto version = r.get<std::uint16_t>();
  if (version != kCheckpointVersion && version != 1) {
    throw ProtocolError("checkpoint: format version " + std::to_string(version) + ", this build reads 1 to " +
                        std::to_string(kCheckpointVersion));
  }
  const std::size_t part_header = version == 1 ? kCheckpointV1PartitionHeaderSize : kCheckpointPartitionHeaderSize;
  // The checksum before any length is trusted: a flipped byte anywhere is reported as
  // corruption, not as whatever absurd length it happened to produce.
  const auto body = bytes.first(bytes.size() - kCheckpointTrailerSize);
  std::uint32_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), 4);
  const std::uint32_t computed = crc32_of(body);
  if (stored != computed) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "stored CRC-32 %08X, computed %08X over %zu bytes", stored, computed, body.size());
    throw ProtocolError(std::string("checkpoint: checksum mismatch (") + buf +
                        "): the file is corrupted or was truncated");
  }
  Reader b(body);
  b.get<std::uint32_t>();
  b.get<std::uint16_t>();
  const auto flags = b.get<std::uint16_t>();
  const auto file_job = b.get<std::uint64_t>();
  const auto file_shard = b.get<std::uint32_t>();
  const auto parts = b.get<std::uint32_t>();
  const auto ndone = b.get<std::uint32_t>();
  const auto reserved = b.get<std::uint32_t>();
  ShardSnapshot snap;
  snap.pushes = b.get<std::uint64_t>();
  if (flags != 0 || reserved != 0) {
    throw ProtocolError("checkpoint: flags " + std::to_string(flags) + " / reserved " + std::to_string(reserved) +
                        ", expected 0");
  }
  if (file_job != job || file_shard != shard) {
    throw ProtocolError("checkpoint: written by shard " + std::to_string(file_shard) + " of job " +
                        std::to_string(file_job) + ", this is shard " + std::to_string(shard) + " of job " +
                        std::to_string(job));
  }
  if (ndone > kCheckpointMaxDone || b.left() / 4 < ndone) {
    throw ProtocolError("checkpoint: " + std::to_string(ndone) + " finished workers do not fit in the " +
                        std::to_string(b.left()) + " bytes left");
  }
  if (b.left() / part_header < parts) {
    throw ProtocolError("checkpoint: " + std::to_string(parts) + " partitions do not fit in the " +
                        std::to_string(b.left()) + " bytes left");
  }
  snap.done.reserve(ndone);
  for (std::uint32_t i = 0; i < ndone; ++i) {
    const auto rank = b.get<std::uint32_t>();
    if (i > 0 && rank <= snap.done.back()) {
      throw ProtocolError("checkpoint: finished-worker ranks not strictly ascending (" +
                          std::to_string(snap.done.back()) + " then " + std::to_string(rank) + ")");
    }
    snap.done.push_back(rank);
  }
  snap.partitions.reserve(parts);
  for (std::uint32_t i = 0; i < parts; ++i) {
    if (b.left() < part_header) {
      throw ProtocolError("checkpoint: partition " + std::to_string(i) + " of " + std::to_string(parts) +
                          " runs past the end of the file");
    }
    ShardSnapshot::Partition p;
    p.key = b.get<std::uint32_t>();
    const auto n = b.get<std::uint32_t>();
    const auto nv = b.get<std::uint32_t>();
    const auto res = b.get<std::uint32_t>();
    // Version 1 kept no per-partition count: the shard's total is an upper bound, so a
    // replica offered after the restart replaces such a partition only if it is fresher.
    p.pushes = version == 1 ? snap.pushes : b.get<std::uint64_t>();
    const std::string what = "checkpoint: partition " + std::to_string(p.key);
    if (i > 0 && p.key <= snap.partitions.back().key) {
      throw ProtocolError(what + " follows partition " + std::to_string(snap.partitions.back().key) +
                          " (keys must be strictly ascending)");
    }
    if (n == 0 || n > kCheckpointMaxPartitionLength || (nv != 0 && nv != n) || res != 0) {
      throw ProtocolError(what + ": length " + std::to_string(n) + ", momentum length " + std::to_string(nv) +
                          ", reserved " + std::to_string(res) + "; expected 1 to " +
                          std::to_string(kCheckpointMaxPartitionLength) + ", 0 or the length, and 0");
    }
    const std::uint64_t need = 4 * (static_cast<std::uint64_t>(n) + nv);
    if (b.left() < need) {
      throw ProtocolError(what + ": " + std::to_string(need) + " bytes of values, only " +
                          std::to_string(b.left()) + " left");
    }
    b.get_floats(p.x, n);
    b.get_floats(p.v, nv);
    snap.partitions.push_back(std::move(p));
  }
  if (b.left() != 0) {
    throw ProtocolError("checkpoint: " + std::to_string(b.left()) + " unexpected bytes after the last partition");
  }
  return snap;
}

void write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  const std::string tmp = path + ".tmp";
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)};
    if (f.fd < 0) throw IoError("cannot create \"" + tmp + "\": " + errno_text());
    // A stale temporary file keeps its mode through O_TRUNC; the state stays private.
    if (::fchmod(f.fd, 0600) != 0) throw IoError("cannot chmod \"" + tmp + "\": " + errno_text());
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw IoError("cannot write \"" + tmp + "\": " + errno_text());
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(f.fd) != 0) throw IoError("cannot fsync \"" + tmp + "\": " + errno_text());
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw IoError("cannot close \"" + tmp + "\": " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw IoError("cannot rename \"" + tmp + "\" to \"" + path + "\": " + errno_text());
  }
  // The rename is durable only once the directory is.
  auto dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) throw IoError("cannot open directory \"" + dir.string() + "\": " + errno_text());
  if (::fsync(d.fd) != 0) throw IoError("cannot fsync directory \"" + dir.string() + "\": " + errno_text());
}

std::optional<ShardSnapshot> read_checkpoint_file(const std::string& path, std::uint64_t job, std::uint32_t shard) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw IoError("cannot open checkpoint \"" + path + "\": " + errno_text());
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw IoError("cannot stat checkpoint \"" + path + "\": " + errno_text());
  if (!S_ISREG(st.st_mode)) throw IoError("checkpoint \"" + path + "\" is not a regular file");
  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError("cannot read checkpoint \"" + path + "\": " + errno_text());
    if (n == 0) break;  // shrank while reading: decode reports it as truncated
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  try {
    return decode_checkpoint(bytes, job, shard);
  } catch (const ProtocolError& e) {
    throw ProtocolError("\"" + path + "\": " + e.what());
  }
}

void write_replica_file(const std::string& path, std::span<const float> params, const PartitionLayout& layout,
                        std::uint64_t job, std::uint64_t steps) {
  if (static_cast<std::int64_t>(params.size()) != layout.total_floats) {
    throw ConfigError("replica", std::to_string(params.size()) + " floats, the layout has " +
                                     std::to_string(layout.total_floats));
  }
  ShardSnapshot snap;
  snap.pushes = steps;
  snap.partitions.reserve(layout.partitions.size());
  for (const auto& p : layout.partitions) {
    ShardSnapshot::Partition part;
    part.key = p.key;
    const auto first = params.begin() + p.offset;
    part.x.assign(first, first + p.length);
    snap.partitions.push_back(std::move(part));
  }
  std::sort(snap.partitions.begin(), snap.partitions.end(), [](auto& a, auto& b) { return a.key < b.key; });
  write_file_atomically(path, encode_checkpoint(snap, job, kWorkerReplicaShard));
}

std::uint64_t replica_into(const ShardSnapshot& snap, std::span<float> params, const PartitionLayout& layout) {
  if (static_cast<std::int64_t>(params.size()) != layout.total_floats) {
    throw ConfigError("replica", std::to_string(params.size()) + " floats, the layout has " +
                                     std::to_string(layout.total_floats));
  }
  if (snap.partitions.size() != layout.partitions.size()) {
    throw ProtocolError(std::to_string(snap.partitions.size()) + " partitions, the job's model has " +
                        std::to_string(layout.partitions.size()));
  }
  // Keys strictly ascending and below the count: every partition of the layout exactly once.
  for (std::size_t i = 0; i < snap.partitions.size(); ++i) {
    const auto& part = snap.partitions[i];
    if (part.key >= layout.partitions.size() || (i > 0 && part.key <= snap.partitions[i - 1].key)) {
      throw ProtocolError("partition key " + std::to_string(part.key) + " out of range or out of order");
    }
    const auto& p = layout.partitions[part.key];
    if (static_cast<std::int64_t>(part.x.size()) != p.length) {
      throw ProtocolError("partition " + std::to_string(part.key) + " has " + std::to_string(part.x.size()) +
                          " values, the job's model has " + std::to_string(p.length));
    }
  }
  for (const auto& part : snap.partitions) {
    std::copy(part.x.begin(), part.x.end(), params.begin() + layout.partitions[part.key].offset);
  }
  return snap.pushes;
}

std::uint64_t read_replica_file(const std::string& path, std::span<float> params, const PartitionLayout& layout,
                                std::uint64_t job) {
  auto snap = read_checkpoint_file(path, job, kWorkerReplicaShard);
  if (!snap) throw IoError("replica \"" + path + "\" does not exist");
  try {
    return replica_into(*snap, params, layout);
  } catch (const ProtocolError& e) {
    throw ProtocolError("replica \"" + path + "\": " + e.what());
  }
}

ShardCheckpointer::ShardCheckpointer(std::string path, std::uint64_t job, std::uint32_t shard,
                                     std::shared_ptr<ShardState> state)
    : path_(std::move(path)), job_(job), shard_(shard), state_(std::move(state)) {}

bool ShardCheckpointer::save() {
  std::lock_guard lock(mu_);
  if (state_->num_partitions() == 0) return false;
  const auto bytes = encode_checkpoint(state_->snapshot(), job_, shard_);
  write_file_atomically(path_, bytes);
  ++saves_;
  last_bytes_ = bytes.size();
  last_save_unix_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return true;
}

double ShardCheckpointer::last_save_unix() const {
  std::lock_guard lock(mu_);
  return last_save_unix_;
}

std::uint64_t ShardCheckpointer::saves() const {
  std::lock_guard lock(mu_);
  return saves_;
}

std::uint64_t ShardCheckpointer::last_bytes() const {
  std::lock_guard lock(mu_);
  return last_bytes_;
}

}  // namespace dltrain::ps
