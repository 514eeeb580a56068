#include "data/export.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "data/image.h"
#include "data/idx.h"

namespace dltrain::data {
namespace fs = std::filesystem;
namespace {

Image padded(const data::Split& s, std::int64_t i, int size) {
  Image img;
  img.height = img.width = size;
  img.channels = 1;
  img.pixels.assign(static_cast<std::size_t>(size) * size, 0);
  const int off = (size - 28) / 2;
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x) {
      img.pixels[static_cast<std::size_t>(y + off) * size + x + off] =
          s.images.pixels[static_cast<std::size_t>(i) * 784 + static_cast<std::size_t>(y) * 28 + x];
    }
  }
  return img;
}

std::int64_t write_split(const data::Split& s, const fs::path& dir, const IdxExportOptions& o,
                         const std::vector<std::string>& classes) {
  for (const auto& c : classes) fs::create_directories(dir / c);
  for (std::int64_t i = 0; i < s.images.count; ++i) {
    const bool png = o.format == "png" || (o.format == "mixed" && i % 2 == 0);
    const auto img = padded(s, i, o.size);
    const auto bytes = png ? encode_png(img) : encode_jpeg(img, o.jpeg_quality);
    char name[32];
    std::snprintf(name, sizeof name, "%06lld.%s", static_cast<long long>(i), png ? "png" : "jpg");
    const auto p = dir / classes[s.labels[static_cast<std::size_t>(i)]] / name;
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw IoError("cannot write \"" + p.string() + "\"");
  }
  return s.images.count;
}

}  // namespace

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle_boot"};
  return names;
}

std::int64_t export_idx_as_image_folder(const std::string& idx_dir, const std::string& out_dir,
                                        const IdxExportOptions& o) {
  if (o.format != "png" && o.format != "jpeg" && o.format != "mixed") {
    throw ConfigError("format", "expected png, jpeg or mixed, got \"" + o.format + "\"");
  }
  if (o.size < 28 || o.size > 1024) throw ConfigError("size", "expected 28..1024, got " + std::to_string(o.size));
  const auto& classes = o.classes.empty() ? fashion_mnist_classes() : o.classes;
  if (classes.size() != 10) throw ConfigError("classes", "expected 10 names, got " + std::to_string(classes.size()));
  std::int64_t n = 0;
  n += write_split(data::load_split(idx_dir, "train", o.train), fs::path(out_dir) / "train", o, classes);
  n += write_split(data::load_split(idx_dir, "test", o.test), fs::path(out_dir) / "test", o, classes);
  return n;
}

}  // namespace dltrain::data
