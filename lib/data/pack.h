// `dltrain dataset pack SRC DEST`: an IDX (Fashion-MNIST, MNIST), CIFAR-10 or ImageFolder
// directory written as a sharded data set (data/shards.h): tar shards in WebDataset's
// layout and a manifest. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dltrain::data {

/// What pack_dataset writes.
struct PackOptions {
  std::int64_t shard_bytes = 256 << 20;  ///< target size of a shard, bytes, >= 4096
  std::uint64_t seed = 0;                ///< shuffles the samples across the shards
  /// "auto" (ImageFolder when SRC/train is a directory, CIFAR-10 when SRC holds
  /// data_batch_1.bin, else IDX with Fashion-MNIST's class names), "fashion-mnist",
  /// "mnist", "cifar10" or "imagefolder".
  std::string dataset = "auto";
};

/// Writes DEST/train-NNNNNN.tar, DEST/test-NNNNNN.tar and DEST/manifest.json from the
/// data set in `src` (DEST is created; shards and a manifest already there are replaced).
/// Samples are shuffled across the shards by `seed` and split evenly between them (counts
/// differ by at most one); a split gets ⌈its bytes / shard_bytes⌉ shards. IDX and CIFAR-10
/// images are stored as PNG (lossless); ImageFolder files are stored as they are, after a
/// decode that checks them: an unreadable file is left out and listed, as the loader
/// would skip it. The manifest's mean/std are of pixel/255 over every training image at
/// its own size, in the most common channel count. Returns the report: {"dest", "dataset",
/// "classes", "splits": {split: {"samples", "shards", "bytes"}}, "skipped": [{"path",
/// "error"}], "manifest"}. Throws ConfigError("shard_size"|"dataset"|"SRC", …) for a bad
/// option or source, IoError when a file cannot be read or written.
nlohmann::json pack_dataset(const std::string& src, const std::string& dest, const PackOptions& options);

/// "256MB", "1GiB", "512k", "4096" → bytes (k/M/G = 10^3/10^6/10^9, KiB/MiB/GiB = 2^10…;
/// case-insensitive, optional trailing "B"). Throws ConfigError("shard_size", …).
std::int64_t parse_byte_size(const std::string& text);

}  // namespace dltrain::data
