// Writes an ImageFolder collection (data/imagefolder.h) from the real Fashion-MNIST IDX
// files, encoded with the libraries the reader decodes with (libpng, libjpeg-turbo):
// used by the data unit tests, the ImageFolder cluster test and the loader benchmark.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image.h"
#include "train/idx.h"

namespace dltrain::testing {

/// Fashion-MNIST's class names (Xiao et al. 2017, Table 1), by label; file-system safe
/// ("T-shirt/top" → "T-shirt_top"). Sorted, they are not in label order, which is what
/// the class-order tests rely on.
inline const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle_boot"};
  return names;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& b) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// Image i of an IDX split as a 1-channel data::Image, padded with zeros to `size`
/// (centred) when size > 28.
inline data::Image idx_image(const train::Split& s, std::int64_t i, int size = 28) {
  data::Image img;
  img.height = img.width = size;
  img.channels = 1;
  img.pixels.assign(static_cast<std::size_t>(size) * size, 0);
  const int off = (size - 28) / 2;
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x) {
      img.pixels[static_cast<std::size_t>(y + off) * size + x + off] = s.images.pixels[static_cast<std::size_t>(i) * 784 + y * 28 + x];
    }
  }
  return img;
}

/// What to write: `split` ("train", "test", "val") gets images [first, first + count) of
/// the IDX split `source` ("train" or "test"), as PNG or JPEG (`format` "png", "jpeg",
/// or "mixed": even indices PNG, odd JPEG), padded to `size`.
struct FolderSplit {
  std::string split;
  std::string source;
  std::int64_t first = 0, count = 0;
  std::string format = "png";
  int size = 28;
  int jpeg_quality = 95;
};

/// The file name of IDX image i in `format` ("000042.png").
inline std::string image_file_name(std::int64_t i, const std::string& format) {
  const bool png = format == "png" || (format == "mixed" && i % 2 == 0);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06lld.%s", static_cast<long long>(i), png ? "png" : "jpg");
  return buf;
}

/// Writes root/<split>/<class name>/<index>.<png|jpg> for each FolderSplit.
inline void write_fashion_mnist_folder(const std::filesystem::path& root, const std::vector<FolderSplit>& splits,
                                       const std::string& idx_dir = "/usr/share/datasets/fashion-mnist") {
  std::int64_t need_train = 0, need_test = 0;
  for (const auto& s : splits) (s.source == "train" ? need_train : need_test) =
      std::max(s.source == "train" ? need_train : need_test, s.first + s.count);
  const train::Split train = need_train > 0 ? train::load_split(idx_dir, "train", need_train) : train::Split{};
  const train::Split test = need_test > 0 ? train::load_split(idx_dir, "test", need_test) : train::Split{};
  for (const auto& s : splits) {
    const auto& src = s.source == "train" ? train : test;
    for (std::int64_t i = s.first; i < s.first + s.count; ++i) {
      const auto img = idx_image(src, i, s.size);
      const auto name = image_file_name(i, s.format);
      const bool png = name.ends_with(".png");
      write_bytes(root / s.split / fashion_mnist_classes()[src.labels[static_cast<std::size_t>(i)]] / name,
                  png ? data::encode_png(img) : data::encode_jpeg(img, s.jpeg_quality));
    }
  }
}

}  // namespace dltrain::testing
