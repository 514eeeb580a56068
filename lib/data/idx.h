// Reader for the IDX files of MNIST and Fashion-MNIST (LeCun et al., "THE MNIST
// DATABASE", file-format section), gzip-compressed or not. Plain C++ (zlib), no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dltrain::data {

/// Images of one IDX3 file: `count` images of rows×cols unsigned bytes, row-major,
/// image after image (pixels.size() == count·rows·cols).
struct IdxImages {
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> pixels;
};

/// Reads an IDX3 unsigned-byte image file (magic 0x00000803), plain or gzip.
/// Reads at most `limit` images when limit > 0. Throws IoError when the file cannot be
/// opened or is shorter than its header says, ProtocolError on a wrong magic number,
/// a zero dimension, dimensions over 2^16 or more than 4 GiB of pixels. Memory grows
/// with the bytes the file really holds (16 MiB at a time), never to what a corrupt
/// header claims.
IdxImages read_idx_images(const std::string& path, std::int64_t limit = 0);

/// Reads an IDX1 unsigned-byte label file (magic 0x00000801). Same errors as above.
std::vector<std::uint8_t> read_idx_labels(const std::string& path, std::int64_t limit = 0);

/// One split of a dataset, validated: labels.size() == images.count, every label < 10,
/// 28×28 images.
struct Split {
  IdxImages images;
  std::vector<std::uint8_t> labels;
};

/// Loads "train" or "test" from `dir`, which holds the four standard file names
/// (train-images-idx3-ubyte, ..., t10k-labels-idx1-ubyte), each optionally with ".gz".
/// `limit` > 0 keeps the first `limit` examples. Throws ConfigError naming "data_dir"
/// when a file is missing, ProtocolError/IoError as the readers above, and
/// ProtocolError when image and label counts differ or a label is >= 10.
Split load_split(const std::string& dir, const std::string& split, std::int64_t limit = 0);

/// Indices of the examples worker `rank` of `world` trains on: every world-th example
/// starting at `rank` (i ≡ rank mod world), so shards differ in size by at most one and
/// together cover [0, count) exactly once. Throws ConfigError unless 0 <= rank < world.
std::vector<std::int64_t> shard_indices(std::int64_t count, int rank, int world);

}  // namespace dltrain::data
