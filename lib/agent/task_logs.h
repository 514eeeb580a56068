// Task logs on an agent: what `dltrain logs` reads (a window of a task's log), the tail a
// failure shows, and the size bound (copy-and-truncate rotation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::agent {

/// The last `n` non-empty lines of the file at `path` (oldest first), each cut to
/// `max_line` bytes; reads at most the last 64 KiB. Empty when it cannot be read.
std::vector<std::string> last_lines(const std::string& path, std::size_t n, std::size_t max_line = 500);

/// A window of a log file.
struct LogWindow {
  std::string text;            ///< the bytes read (whole lines when `tail` was asked for)
  std::int64_t offset = 0;     ///< where `text` starts in the file, bytes
  std::int64_t next_offset = 0;  ///< where the next read continues
  std::int64_t size = 0;       ///< the file's size now, bytes
  bool rotated = false;        ///< `from` was past the end: the file was rotated, read from 0
  bool exists = false;         ///< the file exists
};

/// Reads the log at `path`: with `from`, the bytes from offset *from (at most
/// `max_bytes`); without, its last `tail` lines. A `from` beyond the file's size means
/// it was rotated (truncated) since: the read starts at 0 and says so. Never throws;
/// a missing file gives an empty window with exists = false.
LogWindow read_log_window(const std::string& path, std::optional<std::int64_t> from, std::size_t tail,
                          std::size_t max_bytes);

/// Bounds a log that a process appends to (O_APPEND) while it runs: when `path` is
/// larger than `max_bytes`, copies it to `path`.1 (replacing the previous one) and
/// truncates it to 0, where the writer's next append lands (logrotate's copytruncate;
/// lines written between the copy and the truncation are lost). Disk use stays below
/// 2 × max_bytes plus what is written between two calls. Returns true when it rotated;
/// throws IoError when the copy or truncation fails.
bool rotate_log_if_larger(const std::string& path, std::uintmax_t max_bytes);

}  // namespace dltrain::agent
