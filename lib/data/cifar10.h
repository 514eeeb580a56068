// Reader for CIFAR-10's binary version (Krizhevsky 2009, "Learning Multiple Layers of
// Features from Tiny Images"; https://www.cs.toronto.edu/~kriz/cifar.html, "Binary
// version"): data_batch_1.bin … data_batch_5.bin and test_batch.bin, each a sequence of
// 3073-byte records: 1 label byte (0–9), then 1024 red, 1024 green and 1024 blue bytes
// of a 32×32 image, row-major. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dltrain::data {

/// Bytes of one CIFAR-10 record (1 + 3·32·32).
inline constexpr std::size_t kCifar10RecordBytes = 3073;
/// Records in each published file.
inline constexpr std::int64_t kCifar10RecordsPerFile = 10000;

/// Images held in memory: `count` images of height × width × channels bytes, HWC
/// (data/image.h's layout), one after another, and their labels.
struct InMemoryImages {
  std::int64_t count = 0;
  int height = 0, width = 0, channels = 0;
  std::vector<std::uint8_t> pixels;  ///< count·height·width·channels
  std::vector<std::int32_t> labels;  ///< count, each in [0, classes)
  int classes = 10;
};

/// Parses the bytes of one CIFAR-10 binary file into 32×32×3 HWC images. Keeps at most
/// `limit` records when limit > 0. Throws ProtocolError naming `name` when the size is
/// zero or not a whole number of 3073-byte records (a short or padded file) or a label
/// is not in 0–9 (with the record's index). Thread-safe.
InMemoryImages parse_cifar10(std::span<const std::uint8_t> bytes, const std::string& name, std::int64_t limit = 0);

/// The files of `split` ("train": data_batch_1.bin … data_batch_5.bin; "test":
/// test_batch.bin) found in `dir` or in `dir`/cifar-10-batches-bin (where the published
/// archive unpacks). Throws ConfigError("data_dir", …) naming the missing file.
std::vector<std::string> cifar10_files(const std::string& dir, const std::string& split);

/// Checks the files of both splits without reading their pixels: present, non-empty and
/// a whole number of records. Throws ConfigError("data_dir", …) naming the file.
void check_cifar10_dir(const std::string& dir);

/// Loads a split (the files of cifar10_files, concatenated, at most `limit` images when
/// limit > 0). Throws ConfigError for a missing file, IoError when one cannot be read,
/// ProtocolError as parse_cifar10.
InMemoryImages load_cifar10(const std::string& dir, const std::string& split, std::int64_t limit = 0);

}  // namespace dltrain::data
