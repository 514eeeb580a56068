#include "common/file_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <openssl/evp.h>

#include "common/errors.h"

namespace dltrain {

// Not in the anonymous namespace: ChunkedFileWriter::Hash (external linkage) holds one.
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

namespace {

MdCtx new_sha256() {
  MdCtx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw Error("OpenSSL SHA-256 init failed");
  return ctx;
}

std::string finish_hex(EVP_MD_CTX* ctx) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx, md.data(), &len) != 1) throw Error("OpenSSL SHA-256 final failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

}  // namespace

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

struct ChunkedFileWriter::Hash {
  MdCtx ctx = new_sha256();
};

std::string sha256_hex(std::span<const std::uint8_t> bytes) {
  auto ctx = new_sha256();
  if (EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1) throw Error("OpenSSL SHA-256 update failed");
  return finish_hex(ctx.get());
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  auto ctx = new_sha256();
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = in.gcount();
    if (n > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n)) != 1) {
      throw Error("OpenSSL SHA-256 update failed");
    }
  }
  if (in.bad()) throw IoError("cannot read " + path);
  return finish_hex(ctx.get());
}

std::string base64_encode(std::span<const std::uint8_t> bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes.data(), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::vector<std::uint8_t> base64_decode(const std::string& text) {
  if (text.size() % 4 != 0) {
    throw ProtocolError("data is not base64: its length " + std::to_string(text.size()) + " is not a multiple of 4");
  }
  std::vector<std::uint8_t> out(3 * (text.size() / 4));
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) throw ProtocolError("data is not base64: a character outside the alphabet");
  // EVP_DecodeBlock counts the padding's bytes too.
  std::size_t len = static_cast<std::size_t>(n);
  if (!text.empty() && text.back() == '=') --len;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

FileWindow read_file_window(const std::string& path, std::int64_t offset, std::int64_t max_bytes) {
  if (offset < 0) throw InvalidArgument("read_file_window: offset " + std::to_string(offset) + " < 0");
  if (max_bytes < 1) throw InvalidArgument("read_file_window: max_bytes " + std::to_string(max_bytes) + " < 1");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  FileWindow w;
  w.size = static_cast<std::int64_t>(in.tellg());
  w.offset = offset;
  if (offset >= w.size) return w;
  w.bytes.resize(static_cast<std::size_t>(std::min(max_bytes, w.size - offset)));
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(w.bytes.size())) throw IoError("cannot read " + path);
  return w;
}

ChunkedFileWriter::ChunkedFileWriter(std::string path, std::int64_t size, std::string sha256, std::int64_t max_size)
    : path_(std::move(path)), part_(path_ + ".part"), sha256_(std::move(sha256)), size_(size) {
  if (size < 0 || size > max_size) {
    throw ProtocolError(path_ + ": announced size " + std::to_string(size) + " bytes is outside [0, " +
                        std::to_string(max_size) + "]");
  }
  if (!is_sha256_hex(sha256_)) throw ProtocolError(path_ + ": announced sha256 \"" + sha256_ + "\" is not 64 hex digits");
  hash_ = std::make_unique<Hash>();  // first: should it throw, no file is left behind
  fd_ = ::open(part_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError("cannot create " + part_ + ": " + std::strerror(errno));
}

ChunkedFileWriter::~ChunkedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(part_.c_str());
}

void ChunkedFileWriter::append(std::int64_t offset, std::span<const std::uint8_t> bytes) {
  if (offset != written_) {
    throw ProtocolError(path_ + ": a window at offset " + std::to_string(offset) + ", expected " +
                        std::to_string(written_));
  }
  if (bytes.empty() && written_ < size_) {
    throw ProtocolError(path_ + ": an empty window at offset " + std::to_string(offset) + " of " +
                        std::to_string(size_) + " bytes");
  }
  if (written_ + static_cast<std::int64_t>(bytes.size()) > size_) {
    throw ProtocolError(path_ + ": " + std::to_string(written_ + static_cast<std::int64_t>(bytes.size())) +
                        " bytes received, more than the announced " + std::to_string(size_));
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write " + part_ + ": " + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
  if (EVP_DigestUpdate(hash_->ctx.get(), bytes.data(), bytes.size()) != 1) throw Error("OpenSSL SHA-256 update failed");
  written_ += static_cast<std::int64_t>(bytes.size());
}

void ChunkedFileWriter::finish() {
  if (written_ != size_) {
    throw ProtocolError(path_ + ": " + std::to_string(written_) + " of " + std::to_string(size_) + " bytes received");
  }
  // The descriptor is closed whatever fsync says (close's own error counts as well).
  int err = ::fsync(fd_) != 0 ? errno : 0;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) throw IoError("cannot write " + part_ + ": " + std::strerror(err));
  const std::string got = finish_hex(hash_->ctx.get());
  if (got != sha256_) {
    throw ProtocolError(path_ + ": checksum mismatch: sha256 " + got + " received, " + sha256_ + " sent");
  }
  std::error_code ec;
  std::filesystem::rename(part_, path_, ec);
  if (ec) throw IoError("cannot rename " + part_ + " to " + path_ + ": " + ec.message());
  finished_ = true;
}

ContentStore::ContentStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(std::max(1, keep)) {}

void ContentStore::open() const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw IoError("cannot create " + dir_ + ": " + ec.message());
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() == ".part") fs::remove(e.path(), ec);
  }
}

std::string ContentStore::path(const std::string& sha256) const {
  return (std::filesystem::path(dir_) / (sha256 + ".pt")).string();
}

std::optional<std::string> ContentStore::find(const std::string& sha256) const {
  namespace fs = std::filesystem;
  if (!is_sha256_hex(sha256)) return std::nullopt;
  const auto p = path(sha256);
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  fs::last_write_time(p, fs::file_time_type::clock::now(), ec);  // recently used
  return p;
}

void ContentStore::touch(const std::string& sha256) const {
  std::error_code ec;
  std::filesystem::last_write_time(path(sha256), std::filesystem::file_time_type::clock::now(), ec);
}

namespace {

// The stored files (<sha256>.pt, whole ones: part files end in .part), newest first;
// equal times in name order, so that an order does not depend on the directory's.
std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> stored_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".pt") files.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  return files;
}

}  // namespace

std::vector<std::string> ContentStore::list() const {
  std::vector<std::string> out;
  for (const auto& [t, p] : stored_files(dir_)) out.push_back(p.stem().string());
  return out;
}

void ContentStore::prune(const std::set<std::string>& pinned) const {
  std::error_code ec;
  const auto files = stored_files(dir_);
  if (files.size() <= static_cast<std::size_t>(keep_)) return;
  for (std::size_t i = static_cast<std::size_t>(keep_); i < files.size(); ++i) {
    if (!pinned.count(files[i].second.stem().string())) std::filesystem::remove(files[i].second, ec);
  }
}

}  // namespace dltrain
