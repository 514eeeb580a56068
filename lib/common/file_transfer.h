// Moving whole files over the control channel, whose messages are JSON text: SHA-256
// checksums, base64 for the bytes, bounded windows of a file to send, and a writer that
// puts the windows back together and keeps the file only when its checksum matches
// (the trained model's way from an agent to the leader and from the leader to a client,
// docs/protocol.md "Models"). OpenSSL does the hashing and the base64 (RFC 4648 §4).
// Thread-safety: free functions are thread-safe; one ChunkedFileWriter per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace dltrain {

/// True when `s` is 64 lowercase hex digits (a SHA-256 as dltrain writes it).
bool is_sha256_hex(const std::string& s);

/// SHA-256 (FIPS 180-4) of `bytes`, as 64 lowercase hex digits.
std::string sha256_hex(std::span<const std::uint8_t> bytes);

/// SHA-256 of the file at `path`, read in 1 MiB blocks, as 64 lowercase hex digits.
/// Throws IoError naming `path` when it cannot be opened or read.
std::string sha256_file_hex(const std::string& path);

/// `bytes` in base64 (RFC 4648 §4, with padding, no line breaks).
std::string base64_encode(std::span<const std::uint8_t> bytes);

/// The bytes of base64 text `text` (RFC 4648 §4, padded). Throws ProtocolError("... not
/// base64") for a length that is not a multiple of 4 or a character outside the alphabet.
std::vector<std::uint8_t> base64_decode(const std::string& text);

/// A window of a file: at most `max_bytes` bytes from `offset`.
struct FileWindow {
  std::vector<std::uint8_t> bytes;  ///< what was read (empty at or past the end)
  std::int64_t offset = 0;          ///< where `bytes` starts, bytes into the file
  std::int64_t size = 0;            ///< the file's size, bytes
};

/// Reads the window [offset, offset + max_bytes) of the file at `path`, cut at its end.
/// Throws IoError naming `path` when it cannot be opened or read, InvalidArgument for
/// offset < 0 or max_bytes < 1.
FileWindow read_file_window(const std::string& path, std::int64_t offset, std::int64_t max_bytes);

/// Writes one file from windows received in order (offset 0, then each next offset) to
/// `path`.part, hashing them as they come, and on finish() checks its size and SHA-256
/// against what the sender said and renames it to `path` (so that `path` exists only whole
/// and checked). The part file is removed when the writer is destroyed unfinished.
class ChunkedFileWriter {
 public:
  /// Starts `path`.part for a file of `size` bytes (at most `max_size`) whose SHA-256 is
  /// `sha256`. Throws ProtocolError for a size above `max_size` or a sha256 that is not
  /// 64 hex digits, IoError when the part file cannot be created.
  ChunkedFileWriter(std::string path, std::int64_t size, std::string sha256, std::int64_t max_size);
  ~ChunkedFileWriter();
  ChunkedFileWriter(const ChunkedFileWriter&) = delete;
  ChunkedFileWriter& operator=(const ChunkedFileWriter&) = delete;

  /// Appends `bytes`, which must start at offset(). Throws ProtocolError for another
  /// offset, bytes beyond the announced size, or an empty window while bytes are missing
  /// (a sender that would never finish); IoError when the write fails.
  void append(std::int64_t offset, std::span<const std::uint8_t> bytes);
  /// Bytes written so far: where the next window starts.
  std::int64_t offset() const { return written_; }
  /// True once every announced byte is written.
  bool complete() const { return written_ == size_; }
  /// Checks size and SHA-256 and renames the part file to the path. Throws ProtocolError
  /// (the part file removed) naming the file and both checksums when they differ, or
  /// when bytes are missing; IoError when the rename fails.
  void finish();

 private:
  struct Hash;
  std::string path_, part_, sha256_;
  std::int64_t size_ = 0, written_ = 0;
  int fd_ = -1;
  bool finished_ = false;
  std::unique_ptr<Hash> hash_;
};

/// Files named by their content's SHA-256 in one directory, `<dir>/<sha256>.pt` (the model
/// files that jobs upload, on the leader and in each agent's cache), of which the `keep`
/// most recently stored or used stay. Files only enter whole, by rename, so a file found
/// is complete. Thread-safety: none.
class ContentStore {
 public:
  /// `keep` >= 1 (smaller values count as 1). Creates nothing yet.
  ContentStore(std::string dir, int keep);
  /// Creates the directory and removes part files an interrupted writer left. Throws
  /// IoError naming the directory.
  void open() const;
  /// Where `sha256`'s file is or goes.
  std::string path(const std::string& sha256) const;
  /// `sha256`'s file when it is there (its use time refreshed), for a 64-hex-digit sha256.
  std::optional<std::string> find(const std::string& sha256) const;
  /// Marks `sha256`'s file (just stored) as the most recently used, to the nanosecond (the
  /// time a write leaves is the kernel's coarse clock's, which ties within milliseconds).
  void touch(const std::string& sha256) const;
  /// Removes the files beyond the `keep` most recently stored or used ones, except the
  /// `pinned` ones (by sha256).
  void prune(const std::set<std::string>& pinned = {}) const;
  /// The SHA-256 of every stored file, most recently stored or used first (none when the
  /// directory does not exist).
  std::vector<std::string> list() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_;
};

}  // namespace dltrain
