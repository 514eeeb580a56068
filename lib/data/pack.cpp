#include "data/pack.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>

#include "common/errors.h"
#include "common/log.h"
#include "data/cifar10.h"
#include "data/export.h"
#include "data/idx.h"
#include "data/image.h"
#include "data/imagefolder.h"
#include "data/loader.h"
#include "data/sharding.h"
#include "data/shards.h"

namespace dltrain::data {
namespace fs = std::filesystem;
namespace {

// One sample to write: its encoded bytes (IDX, CIFAR-10) or its file (ImageFolder).
struct Item {
  int label = 0;
  std::string path;                 ///< the source file; empty for in-memory images
  std::vector<std::uint8_t> bytes;  ///< encoded image when path is empty
  std::string ext;                  ///< "png", "jpg"
  std::int64_t size = 0;            ///< encoded bytes
};

// Sums of pixel/255 and its square per channel, for mean and std.
struct Moments {
  std::vector<double> sum, sumsq;
  std::int64_t pixels = 0;
  explicit Moments(int c) : sum(static_cast<std::size_t>(c)), sumsq(static_cast<std::size_t>(c)) {}
  void add(const Image& img) {
    const auto c = static_cast<std::size_t>(img.channels);
    for (std::size_t i = 0; i < img.pixels.size(); ++i) {
      const double v = img.pixels[i] / 255.0;
      sum[i % c] += v;
      sumsq[i % c] += v * v;
    }
    pixels += static_cast<std::int64_t>(img.pixels.size() / c);
  }
};

// What the images of the training split look like.
struct Stats {
  Moments gray{1}, rgb{3};
  std::map<int, std::int64_t> channels;  // channels → images
  std::map<int, std::int64_t> sides;     // larger side → images
  void add(const Image& img) {
    ++channels[img.channels];
    ++sides[std::max(img.height, img.width)];
    if (img.channels == 1) {
      gray.add(img);
      rgb.add(convert_channels(img, 3));
    } else {
      rgb.add(img);
      gray.add(convert_channels(img, 1));
    }
  }
};

template <typename M>
int most_common(const M& m) {
  return std::max_element(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.second < b.second; })->first;
}

std::vector<Item> in_memory_items(const InMemoryImages& m, Stats* stats) {
  std::vector<Item> out;
  const std::size_t per = static_cast<std::size_t>(m.height) * m.width * m.channels;
  for (std::int64_t i = 0; i < m.count; ++i) {
    Image img;
    img.height = m.height, img.width = m.width, img.channels = m.channels;
    const auto at = m.pixels.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * per);
    img.pixels.assign(at, at + static_cast<std::ptrdiff_t>(per));
    if (stats) stats->add(img);
    Item it;
    it.label = m.labels[static_cast<std::size_t>(i)];
    it.bytes = encode_png(img);
    it.size = static_cast<std::int64_t>(it.bytes.size());
    it.ext = "png";
    out.push_back(std::move(it));
  }
  return out;
}

std::vector<Item> file_items(const std::vector<ImageFile>& files, Stats* stats, nlohmann::json& skipped) {
  std::vector<Item> out;
  for (const auto& f : files) {
    try {
      const auto bytes = read_file_bytes(f.path);
      const auto img = decode_image(bytes, 0, f.path);
      if (stats) stats->add(img);
      Item it;
      it.label = f.label;
      it.path = f.path;
      it.size = static_cast<std::int64_t>(bytes.size());
      it.ext = sniff_format(bytes) == "png" ? "png" : "jpg";
      out.push_back(std::move(it));
    } catch (const CorruptImage& e) {
      skipped.push_back({{"path", f.path}, {"error", e.what()}});
    } catch (const IoError& e) {
      skipped.push_back({{"path", f.path}, {"error", e.what()}});
    }
  }
  return out;
}

// Writes one split's shards into dest as PREFIX-NNNNNN.tar.
ShardSplit write_split(std::vector<Item> items, const std::string& prefix, const fs::path& dest, const PackOptions& o,
                       std::int64_t split_id) {
  ShardSplit split;
  const auto n = static_cast<std::int64_t>(items.size());
  if (n == 0) throw ConfigError("SRC", "the " + prefix + " split has no readable image");
  std::int64_t total = 0;
  for (const auto& it : items) total += it.size + 1536;  // two headers, padding
  const std::int64_t shards = std::clamp<std::int64_t>((total + o.shard_bytes - 1) / o.shard_bytes, 1, n);
  const auto order = epoch_permutation(n, o.seed, -100 - split_id);
  for (std::int64_t s = 0; s < shards; ++s) {
    ShardInfo info;
    char name[64];
    std::snprintf(name, sizeof name, "%s-%06lld.tar", prefix.c_str(), static_cast<long long>(s));
    info.name = name;
    TarWriter w((dest / info.name).string());
    const std::int64_t lo = s * n / shards, hi = (s + 1) * n / shards;
    for (std::int64_t k = lo; k < hi; ++k) {
      auto& it = items[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])];
      char key[32];
      std::snprintf(key, sizeof key, "%08lld", static_cast<long long>(k));
      const auto bytes = it.path.empty() ? std::move(it.bytes) : read_file_bytes(it.path);
      w.add(std::string(key) + "." + it.ext, bytes);
      const auto cls = std::to_string(it.label);
      w.add(std::string(key) + ".cls", std::span(reinterpret_cast<const std::uint8_t*>(cls.data()), cls.size()));
    }
    info.samples = hi - lo;
    info.bytes = w.finish(info.sha256);
    split.samples += info.samples;
    split.bytes += info.bytes;
    split.shards.push_back(std::move(info));
  }
  return split;
}

std::string detect(const fs::path& src) {
  if (fs::is_directory(src / "train")) return "imagefolder";
  if (fs::exists(src / "data_batch_1.bin")) return "cifar10";
  return "fashion-mnist";
}

}  // namespace

std::int64_t parse_byte_size(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0 || digits > 15) throw ConfigError("shard_size", "\"" + text + "\" is not a size such as 256MB or 1GiB");
  const std::int64_t v = std::stoll(s.substr(0, digits));
  std::string unit = s.substr(digits);
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  static const std::map<std::string, std::int64_t> units{{"", 1},          {"k", 1000},         {"m", 1000000},
                                                         {"g", 1000000000}, {"ki", 1 << 10},     {"mi", 1 << 20},
                                                         {"gi", 1 << 30}};
  const auto it = units.find(unit);
  if (it == units.end()) throw ConfigError("shard_size", "\"" + text + "\": unknown unit (use k, M, G, KiB, MiB or GiB)");
  return v * it->second;
}

nlohmann::json pack_dataset(const std::string& src_dir, const std::string& dest_dir, const PackOptions& o) {
  if (o.shard_bytes < 4096) throw ConfigError("shard_size", std::to_string(o.shard_bytes) + " bytes is below 4096");
  const fs::path src(src_dir), dest(dest_dir);
  if (!fs::is_directory(src)) throw ConfigError("SRC", "\"" + src_dir + "\" is not a directory");
  const std::string kind = o.dataset == "auto" ? detect(src) : o.dataset;
  Manifest m;
  Stats stats;
  nlohmann::json skipped = nlohmann::json::array();
  std::vector<Item> train, test;
  if (kind == "imagefolder") {
    auto idx = scan_image_folder(src_dir);
    m.classes = idx.classes;
    train = file_items(idx.train, &stats, skipped);
    test = file_items(idx.test, nullptr, skipped);
  } else if (kind == "cifar10") {
    check_cifar10_dir(src_dir);
    m.classes = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
    train = in_memory_items(load_cifar10(src_dir, "train"), &stats);
    test = in_memory_items(load_cifar10(src_dir, "test"), nullptr);
  } else if (kind == "fashion-mnist" || kind == "mnist") {
    m.classes = kind == "mnist" ? std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
                                : fashion_mnist_classes();
    train = in_memory_items(idx_as_in_memory(load_split(src_dir, "train")), &stats);
    test = in_memory_items(idx_as_in_memory(load_split(src_dir, "test")), nullptr);
  } else {
    throw ConfigError("dataset", "\"" + o.dataset + "\" is not auto, fashion-mnist, mnist, cifar10 or imagefolder");
  }
  if (train.empty()) throw ConfigError("SRC", "\"" + src_dir + "\": no readable training image");
  std::error_code ec;
  fs::create_directories(dest, ec);
  if (ec) throw IoError("cannot create \"" + dest_dir + "\": " + ec.message());
  for (const auto& e : fs::directory_iterator(dest)) {  // an earlier pack's shards
    const auto name = e.path().filename().string();
    if (name.ends_with(".tar") && (name.starts_with("train-") || name.starts_with("test-"))) fs::remove(e.path());
  }
  m.train = write_split(std::move(train), "train", dest, o, 0);
  m.test = write_split(std::move(test), "test", dest, o, 1);
  m.channels = most_common(stats.channels);
  m.image_size = most_common(stats.sides);
  const Moments& mo = m.channels == 1 ? stats.gray : stats.rgb;
  for (std::size_t c = 0; c < mo.sum.size(); ++c) {
    const double mean = mo.sum[c] / static_cast<double>(mo.pixels);
    const double var = std::max(0.0, mo.sumsq[c] / static_cast<double>(mo.pixels) - mean * mean);
    m.mean.push_back(static_cast<float>(mean));
    m.std.push_back(static_cast<float>(std::max(1e-3, std::sqrt(var))));
  }
  m.source = kind;
  m.skipped = static_cast<std::int64_t>(skipped.size());
  const auto mj = manifest_json(m);
  {
    const auto path = dest / kManifestName;
    const auto tmp = dest / (std::string(kManifestName) + ".tmp");
    std::ofstream out(tmp, std::ios::trunc);
    out << mj.dump(1) << "\n";
    out.close();
    if (!out) throw IoError("cannot write \"" + tmp.string() + "\"");
    fs::rename(tmp, path);
  }
  nlohmann::json splits;
  for (const auto& [name, s] : {std::pair<std::string, const ShardSplit*>{"train", &m.train}, {"test", &m.test}}) {
    splits[name] = {{"samples", s->samples}, {"shards", s->shards.size()}, {"bytes", s->bytes}};
  }
  return {{"dest", dest_dir}, {"dataset", kind}, {"classes", m.classes}, {"splits", splits}, {"skipped", skipped}, {"manifest", mj}};
}

}  // namespace dltrain::data
