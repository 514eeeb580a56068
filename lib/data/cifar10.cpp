#include "data/cifar10.h"

#include <filesystem>

#include "common/errors.h"
#include "data/image.h"

namespace dltrain::data {
namespace fs = std::filesystem;
namespace {

std::string records_message(std::uintmax_t size) {
  return std::to_string(size) + " bytes is not a whole number of " + std::to_string(kCifar10RecordBytes) +
         "-byte records (" + std::to_string(size / kCifar10RecordBytes) + " records and " +
         std::to_string(size % kCifar10RecordBytes) + " bytes more)";
}

}  // namespace

InMemoryImages parse_cifar10(std::span<const std::uint8_t> bytes, const std::string& name, std::int64_t limit) {
  if (bytes.empty()) throw ProtocolError("\"" + name + "\": empty CIFAR-10 file (0 bytes)");
  if (bytes.size() % kCifar10RecordBytes != 0) {
    throw ProtocolError("\"" + name + "\": " + records_message(bytes.size()) + "; a CIFAR-10 binary record is 1 label "
                        "byte and 3072 pixel bytes");
  }
  auto n = static_cast<std::int64_t>(bytes.size() / kCifar10RecordBytes);
  if (limit > 0 && limit < n) n = limit;
  InMemoryImages out;
  out.count = n;
  out.height = out.width = 32;
  out.channels = 3;
  out.pixels.resize(static_cast<std::size_t>(n) * 3072);
  out.labels.resize(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint8_t* rec = bytes.data() + r * kCifar10RecordBytes;
    if (rec[0] >= 10) {
      throw ProtocolError("\"" + name + "\": record " + std::to_string(r) + " has label " + std::to_string(rec[0]) +
                          ", expected 0..9");
    }
    out.labels[static_cast<std::size_t>(r)] = rec[0];
    std::uint8_t* dst = out.pixels.data() + r * 3072;
    // Planar (1024 R, 1024 G, 1024 B) to interleaved HWC.
    for (int p = 0; p < 1024; ++p) {
      dst[p * 3 + 0] = rec[1 + p];
      dst[p * 3 + 1] = rec[1 + 1024 + p];
      dst[p * 3 + 2] = rec[1 + 2048 + p];
    }
  }
  return out;
}

std::vector<std::string> cifar10_files(const std::string& dir, const std::string& split) {
  std::vector<std::string> names;
  if (split == "train") {
    for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else if (split == "test") {
    names.push_back("test_batch.bin");
  } else {
    throw ConfigError("split", "expected train or test, got \"" + split + "\"");
  }
  std::error_code ec;
  fs::path base(dir);
  if (!fs::exists(base / names[0], ec) && fs::exists(base / "cifar-10-batches-bin" / names[0], ec)) {
    base /= "cifar-10-batches-bin";
  }
  std::vector<std::string> out;
  for (const auto& n : names) {
    const auto p = base / n;
    if (!fs::is_regular_file(p, ec)) {
      throw ConfigError("data_dir", "\"" + dir + "\" has no " + n +
                                        " (CIFAR-10's binary version: data_batch_1.bin … data_batch_5.bin, "
                                        "test_batch.bin, here or in cifar-10-batches-bin/)");
    }
    out.push_back(p.string());
  }
  return out;
}

void check_cifar10_dir(const std::string& dir) {
  for (const char* split : {"train", "test"}) {
    for (const auto& f : cifar10_files(dir, split)) {
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      if (ec) throw ConfigError("data_dir", "cannot read the size of \"" + f + "\": " + ec.message());
      if (size == 0 || size % kCifar10RecordBytes != 0) {
        throw ConfigError("data_dir", "\"" + f + "\": " + (size == 0 ? std::string("empty file") : records_message(size)));
      }
    }
  }
}

InMemoryImages load_cifar10(const std::string& dir, const std::string& split, std::int64_t limit) {
  InMemoryImages all;
  all.height = all.width = 32;
  all.channels = 3;
  for (const auto& f : cifar10_files(dir, split)) {
    const std::int64_t want = limit > 0 ? limit - all.count : 0;
    if (limit > 0 && want <= 0) break;
    auto part = parse_cifar10(read_file_bytes(f), f, want);
    all.pixels.insert(all.pixels.end(), part.pixels.begin(), part.pixels.end());
    all.labels.insert(all.labels.end(), part.labels.begin(), part.labels.end());
    all.count += part.count;
  }
  return all;
}

}  // namespace dltrain::data
