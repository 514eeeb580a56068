#include "data/idx.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <zlib.h>

#include "common/errors.h"

namespace dltrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

GzPtr open_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw IoError("cannot open \"" + path + "\": " + std::strerror(errno));
  gzbuffer(f, 1 << 17);
  return GzPtr(f);
}

void read_exact(gzFile f, void* dst, std::size_t n, const std::string& path, const char* what) {
  auto* p = static_cast<unsigned char*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
    const int r = gzread(f, p + got, chunk);
    if (r < 0) {
      int errnum = 0;
      throw IoError("\"" + path + "\": read error in " + what + ": " + gzerror(f, &errnum));
    }
    if (r == 0) {
      throw IoError("\"" + path + "\": file is short: expected " + std::to_string(n) + " bytes of " +
                    what + ", found " + std::to_string(got));
    }
    got += static_cast<std::size_t>(r);
  }
}

// Reads `n` bytes into `out` (resized to n) as read_exact does, but grows `out` as the
// data arrives, so that a header that claims gigabytes costs memory only for the bytes
// the file really holds.
void read_growing(gzFile f, std::vector<std::uint8_t>& out, std::size_t n, const std::string& path,
                  const char* what) {
  constexpr std::size_t kChunk = std::size_t{16} << 20;
  out.clear();
  std::size_t got = 0;
  while (got < n) {
    if (out.size() == got) out.resize(std::min(n, got + kChunk));
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(out.size() - got, 1u << 30));
    const int r = gzread(f, out.data() + got, chunk);
    if (r < 0) {
      int errnum = 0;
      throw IoError("\"" + path + "\": read error in " + what + ": " + gzerror(f, &errnum));
    }
    if (r == 0) {
      throw IoError("\"" + path + "\": file is short: expected " + std::to_string(n) + " bytes of " + what +
                    ", found " + std::to_string(got));
    }
    got += static_cast<std::size_t>(r);
  }
}

std::uint32_t be32(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

constexpr std::uint32_t kMaxDim = 1u << 16;
constexpr std::uint32_t kMaxCount = 1u << 28;

// The header of an IDX file of unsigned bytes with `dims` dimensions (1: labels, 3:
// images): its magic number (0x0000080N) checked, then the size of each dimension, big
// endian (LeCun et al., "The MNIST database", file formats). Throws IoError for a short
// file and ProtocolError naming the file for another magic number.
template <std::size_t dims>
std::array<std::uint32_t, dims> read_idx_header(gzFile f, const std::string& path) {
  std::array<unsigned char, 4 * (dims + 1)> h{};
  read_exact(f, h.data(), h.size(), path, "the header");
  const auto magic = be32(h.data());
  const std::uint32_t expected = 0x00000800u | static_cast<std::uint32_t>(dims);
  if (magic != expected) {
    throw ProtocolError("\"" + path + "\": IDX magic number: expected " + hex(expected) + " (ubyte, " +
                        std::to_string(dims) + (dims == 1 ? " dim" : " dims") + "), got " + hex(magic));
  }
  std::array<std::uint32_t, dims> size{};
  for (std::size_t i = 0; i < dims; ++i) size[i] = be32(h.data() + 4 * (i + 1));
  return size;
}

}  // namespace

IdxImages read_idx_images(const std::string& path, std::int64_t limit) {
  auto f = open_gz(path);
  const auto [n, rows, cols] = read_idx_header<3>(f.get(), path);
  if (n == 0 || n > kMaxCount || rows == 0 || rows > kMaxDim || cols == 0 || cols > kMaxDim) {
    throw ProtocolError("\"" + path + "\": implausible IDX dimensions " + std::to_string(n) + "x" +
                        std::to_string(rows) + "x" + std::to_string(cols));
  }
  IdxImages out;
  out.count = (limit > 0 && limit < n) ? limit : n;
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 32;  // 4 GiB of pixels
  if (static_cast<std::uint64_t>(out.count) * rows * cols > kMaxBytes) {
    throw ProtocolError("\"" + path + "\": " + std::to_string(out.count) + " images of " + std::to_string(rows) + "x" +
                        std::to_string(cols) + " exceed the 4 GiB limit");
  }
  out.rows = rows;
  out.cols = cols;
  read_growing(f.get(), out.pixels, static_cast<std::size_t>(out.count * rows * cols), path, "the images");
  return out;
}

std::vector<std::uint8_t> read_idx_labels(const std::string& path, std::int64_t limit) {
  auto f = open_gz(path);
  const auto [n] = read_idx_header<1>(f.get(), path);
  if (n == 0 || n > kMaxCount) {
    throw ProtocolError("\"" + path + "\": implausible IDX label count " + std::to_string(n));
  }
  std::vector<std::uint8_t> out;
  read_growing(f.get(), out, static_cast<std::size_t>((limit > 0 && limit < n) ? limit : n), path, "the labels");
  return out;
}

Split load_split(const std::string& dir, const std::string& split, std::int64_t limit) {
  namespace fs = std::filesystem;
  if (split != "train" && split != "test") {
    throw ConfigError("split", "expected train or test, got \"" + split + "\"");
  }
  const std::string prefix = split == "train" ? "train" : "t10k";
  auto find = [&](const std::string& name) {
    std::error_code ec;
    for (const auto& cand : {fs::path(dir) / (name + ".gz"), fs::path(dir) / name}) {
      if (fs::exists(cand, ec)) return cand.string();
    }
    throw ConfigError("data_dir", "\"" + dir + "\" has no " + name + "[.gz]");
  };
  Split s;
  s.images = read_idx_images(find(prefix + "-images-idx3-ubyte"), limit);
  s.labels = read_idx_labels(find(prefix + "-labels-idx1-ubyte"), limit);
  if (static_cast<std::int64_t>(s.labels.size()) != s.images.count) {
    throw ProtocolError("\"" + dir + "\": " + split + " split has " + std::to_string(s.images.count) +
                        " images but " + std::to_string(s.labels.size()) + " labels");
  }
  if (s.images.rows != 28 || s.images.cols != 28) {
    throw ProtocolError("\"" + dir + "\": expected 28x28 images, got " + std::to_string(s.images.rows) +
                        "x" + std::to_string(s.images.cols));
  }
  for (std::size_t i = 0; i < s.labels.size(); ++i) {
    if (s.labels[i] >= 10) {
      throw ProtocolError("\"" + dir + "\": " + split + " label " + std::to_string(i) + " is " +
                          std::to_string(s.labels[i]) + ", expected 0..9");
    }
  }
  return s;
}

std::vector<std::int64_t> shard_indices(std::int64_t count, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError("rank", "expected 0 <= rank < workers, got rank " + std::to_string(rank) +
                                  " of " + std::to_string(world));
  }
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(count / world + 1));
  for (std::int64_t i = rank; i < count; i += world) out.push_back(i);
  return out;
}

}  // namespace dltrain::data
