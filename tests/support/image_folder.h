// Writes ImageFolder collections (data/imagefolder.h) from the real Fashion-MNIST IDX
// files, encoded with the libraries the reader decodes with (libpng, libjpeg-turbo):
// used by the data unit tests, the ImageFolder cluster test and the loader benchmark.
// The encoding itself is data::export_idx_as_image_folder's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/export.h"
#include "data/image.h"
#include "data/idx.h"

namespace dltrain::testing {

inline const std::vector<std::string>& fashion_mnist_classes() { return data::fashion_mnist_classes(); }

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& b) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// Image i of an IDX split as a 1-channel 28×28 data::Image (the pixels the files hold).
inline data::Image idx_image(const data::Split& s, std::int64_t i) {
  data::Image img;
  img.height = img.width = 28;
  img.channels = 1;
  const auto* p = s.images.pixels.data() + static_cast<std::size_t>(i) * 784;
  img.pixels.assign(p, p + 784);
  return img;
}

/// Writes root/train/<class>/<index>.<png|jpg> from the first `train` training images
/// and root/test/… from the first `test` test images ("mixed": even indices PNG, odd
/// JPEG at quality 95), each padded to `size`.
inline void write_fashion_mnist_folder(const std::filesystem::path& root, std::int64_t train, std::int64_t test,
                                       const std::string& format = "png", int size = 28) {
  data::IdxExportOptions o;
  o.format = format;
  o.size = size;
  o.train = train;
  o.test = test;
  data::export_idx_as_image_folder("/usr/share/datasets/fashion-mnist", root.string(), o);
}

}  // namespace dltrain::testing
