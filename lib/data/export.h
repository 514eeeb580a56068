// Writes an IDX data set (MNIST, Fashion-MNIST) out as an ImageFolder of PNG or JPEG
// files: `dltrain dataset from-idx`, the example ImageFolder of configs/jobs/, the tests
// and the loader benchmark. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dltrain::data {

/// What export_idx_as_image_folder writes.
struct IdxExportOptions {
  std::string format = "png";  ///< "png", "jpeg", or "mixed" (even indices PNG, odd JPEG)
  int size = 28;               ///< output side, >= 28: the 28×28 image centred, zero-padded
  int jpeg_quality = 95;       ///< [1, 100]
  std::int64_t train = 0;      ///< the first N training images; 0 = all
  std::int64_t test = 0;       ///< the first N test images; 0 = all
  /// Class folder names by label; empty = Fashion-MNIST's (fashion_mnist_classes()).
  std::vector<std::string> classes;
};

/// Fashion-MNIST's class names by label (Xiao et al. 2017, Table 1), made file-system
/// safe ("T-shirt/top" → "T-shirt_top"). Sorted, they are not in label order.
const std::vector<std::string>& fashion_mnist_classes();

/// Writes out_dir/train/<class>/<index>.png|jpg and out_dir/test/<class>/… from the IDX
/// files in idx_dir (train/labels through data::load_split). Returns the number of
/// files written. Throws ConfigError for a bad option or data_dir, IoError when a file
/// cannot be written, and what load_split throws.
std::int64_t export_idx_as_image_folder(const std::string& idx_dir, const std::string& out_dir,
                                        const IdxExportOptions& options);

}  // namespace dltrain::data
