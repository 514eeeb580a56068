// A small tmpfs that a test mounts (as root) to give the code under test a real file
// system that fills up or turns read-only. Unmounted at scope exit.
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace dltrain::testing {

class Tmpfs {
 public:
  /// Mounts a tmpfs of `size_bytes` on a new temporary directory. error() says why when
  /// it could not (not root, no mount permission in a container): the caller skips then.
  explicit Tmpfs(std::size_t size_bytes) : dir_("dltrain-tmpfs") {
    const std::string opts = "size=" + std::to_string(size_bytes) + ",mode=0700";
    if (::mount("tmpfs", dir_.path.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      error_ = std::string("mount -t tmpfs: ") + std::strerror(errno);
    } else {
      mounted_ = true;
    }
  }
  ~Tmpfs() {
    if (mounted_) ::umount2(dir_.path.c_str(), MNT_DETACH);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;

  const std::string& error() const { return error_; }
  const std::filesystem::path& path() const { return dir_.path; }

  /// Writes a file (`filler`) 64 KiB at a time until at most `leave_bytes` are free
  /// (statvfs f_bavail) or the file system answers ENOSPC; returns the bytes written.
  /// Bounded by the mount's size.
  std::size_t fill(std::size_t leave_bytes = 0) {
    const int fd = ::open((dir_.path / "filler").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    std::vector<char> chunk(64 * 1024, 'x');
    std::size_t total = 0;
    for (int i = 0; i < 1 << 16 && free_bytes() > leave_bytes; ++i) {
      const auto want = std::min(chunk.size(), free_bytes() - leave_bytes);
      const ssize_t n = ::write(fd, chunk.data(), want);
      if (n <= 0) break;
      total += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return total;
  }
  /// Bytes free for unprivileged users (statvfs f_bavail · f_frsize).
  std::size_t free_bytes() const {
    struct statvfs v {};
    if (::statvfs(dir_.path.c_str(), &v) != 0) return 0;
    return static_cast<std::size_t>(v.f_bavail) * v.f_frsize;
  }
  /// Removes the filler file: the space is free again.
  void free_space() { std::filesystem::remove(dir_.path / "filler"); }
  /// Remounts read-only (or read-write again). Returns false with errno on failure.
  bool remount(bool read_only) {
    return ::mount("tmpfs", dir_.path.c_str(), "tmpfs", MS_REMOUNT | (read_only ? MS_RDONLY : 0), nullptr) == 0;
  }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace dltrain::testing
