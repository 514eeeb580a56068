#include "agent/task_logs.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace dltrain::agent {

namespace fs = std::filesystem;

std::vector<std::string> last_lines(const std::string& path, std::size_t n, std::size_t max_line) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  constexpr std::streamoff kWindow = 64 * 1024;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > kWindow ? size - kWindow : 0;
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::string> lines;
  std::istringstream ss(text);
  std::string line;
  bool first = from > 0;  // a window's first line is probably cut: dropped
  while (std::getline(ss, line)) {
    if (first) {
      first = false;
      continue;
    }
    if (line.empty()) continue;
    if (line.size() > max_line) line = line.substr(0, max_line) + "...";
    lines.push_back(std::move(line));
  }
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines;
}

LogWindow read_log_window(const std::string& path, std::optional<std::int64_t> from, std::size_t tail,
                          std::size_t max_bytes) {
  LogWindow w;
  std::ifstream in(path, std::ios::binary);
  if (!in) return w;
  w.exists = true;
  in.seekg(0, std::ios::end);
  w.size = static_cast<std::int64_t>(in.tellg());
  if (!from) {
    std::string text;
    for (const auto& l : last_lines(path, tail, max_bytes)) text += l + "\n";
    w.text = std::move(text);
    w.offset = w.size;  // not a byte range: whole lines from the end
    w.next_offset = w.size;
    return w;
  }
  std::int64_t at = *from;
  if (at > w.size || at < 0) {
    w.rotated = at > w.size;
    at = 0;
  }
  const auto n = static_cast<std::size_t>(std::min<std::int64_t>(w.size - at, static_cast<std::int64_t>(max_bytes)));
  w.text.resize(n);
  in.seekg(at);
  in.read(w.text.data(), static_cast<std::streamsize>(n));
  w.text.resize(static_cast<std::size_t>(in.gcount()));
  w.offset = at;
  w.next_offset = at + static_cast<std::int64_t>(w.text.size());
  return w;
}

bool rotate_log_if_larger(const std::string& path, std::uintmax_t max_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size <= max_bytes) return false;
  fs::copy_file(path, path + ".1", fs::copy_options::overwrite_existing, ec);
  if (ec) throw IoError("cannot rotate the task log \"" + path + "\": " + ec.message());
  fs::resize_file(path, 0, ec);
  if (ec) throw IoError("cannot truncate the task log \"" + path + "\": " + ec.message());
  return true;
}

}  // namespace dltrain::agent
