// Fuzzes the IDX reader (data/idx.h): read_idx_images and read_idx_labels, what every
// worker runs on its data set's files (plain or gzip).
//
// Input: a whole file, read both as an image file and as a label file (from a memfd, so
// that nothing touches the disk), without a limit or, for inputs of even length, with a
// small one. Checks, beyond
// "no crash", "only IoError and ProtocolError escape" and libFuzzer's memory limit (a
// header that claims gigabytes must not allocate them):
//   - what is read has the size its header says (capped by the limit);
//   - for a plain (not gzip) file, the pixels and labels are the file's bytes after the
//     header, in order.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "fuzz_check.h"
#include "data/idx.h"

using namespace dltrain;

namespace {

// A memfd that holds the current input, named by a path gzopen can open.
struct MemFile {
  int fd = ::memfd_create("dltrain-fuzz-idx", 0);
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  void write(const std::uint8_t* data, std::size_t size) {
    FUZZ_CHECK(fd >= 0 && ::ftruncate(fd, 0) == 0, "memfd");
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      FUZZ_CHECK(n > 0, "pwrite to the memfd");
      done += static_cast<std::size_t>(n);
    }
  }
};

std::uint32_t be32(const std::uint8_t* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static MemFile file;
  file.write(data, size);
  const bool plain = !(size >= 2 && data[0] == 0x1f && data[1] == 0x8b);
  {
    const std::int64_t limit = size % 2 == 0 ? 3 : 0;
    try {
      const auto img = data::read_idx_images(file.path, limit);
      FUZZ_CHECK(img.count >= 1 && img.rows >= 1 && img.cols >= 1 && (limit == 0 || img.count <= limit),
                 "an image file with a zero dimension or past the limit");
      FUZZ_CHECK(img.pixels.size() == static_cast<std::size_t>(img.count * img.rows * img.cols),
                 "pixels do not match count x rows x cols");
      if (plain) {
        FUZZ_CHECK(size >= 16 + img.pixels.size() && be32(data + 4) >= img.count && be32(data + 8) == img.rows &&
                       be32(data + 12) == img.cols,
                   "the images do not match the plain file's header");
        FUZZ_CHECK(std::memcmp(img.pixels.data(), data + 16, img.pixels.size()) == 0,
                   "the pixels are not the plain file's bytes");
      }
    } catch (const IoError&) {
    } catch (const ProtocolError&) {
    }
    try {
      const auto labels = data::read_idx_labels(file.path, limit);
      FUZZ_CHECK(!labels.empty() && (limit == 0 || static_cast<std::int64_t>(labels.size()) <= limit),
                 "a label file without labels or past the limit");
      if (plain) {
        FUZZ_CHECK(size >= 8 + labels.size() && be32(data + 4) >= labels.size(), "labels past the plain file's header");
        FUZZ_CHECK(std::memcmp(labels.data(), data + 8, labels.size()) == 0, "the labels are not the plain file's bytes");
      }
    } catch (const IoError&) {
    } catch (const ProtocolError&) {
    }
  }
  return 0;
}
