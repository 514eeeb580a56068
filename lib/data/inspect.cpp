#include "data/inspect.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "common/errors.h"
#include "data/cifar10.h"
#include "data/image.h"
#include "data/imagefolder.h"

namespace dltrain::data {
namespace {

using json = nlohmann::json;
using Size = std::tuple<int, int, int>;  // width, height, channels

json sizes_json(const std::map<Size, std::int64_t>& sizes) {
  std::vector<std::pair<Size, std::int64_t>> v(sizes.begin(), sizes.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  json out = json::array();
  for (const auto& [s, n] : v) {
    out.push_back({{"width", std::get<0>(s)}, {"height", std::get<1>(s)}, {"channels", std::get<2>(s)}, {"images", n}});
  }
  return out;
}

json split_json(const std::vector<ImageFile>& files, const std::vector<std::string>& classes) {
  json per = json::object();
  for (const auto& c : classes) per[c] = 0;
  for (const auto& f : files) per[classes[static_cast<std::size_t>(f.label)]] = per[classes[static_cast<std::size_t>(f.label)]].get<std::int64_t>() + 1;
  return {{"images", files.size()}, {"per_class", per}};
}

json inspect_image_folder(const std::string& dir, int threads) {
  const auto idx = scan_image_folder(dir);
  std::vector<const ImageFile*> all;
  for (const auto& f : idx.train) all.push_back(&f);
  for (const auto& f : idx.test) all.push_back(&f);
  std::mutex mu;
  std::map<Size, std::int64_t> sizes;
  std::vector<std::pair<std::string, std::string>> unreadable;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < all.size(); i = next++) {
      const auto& path = all[i]->path;
      try {
        const auto img = decode_image(read_file_bytes(path), 0, path);
        std::lock_guard lk(mu);
        ++sizes[{img.width, img.height, img.channels}];
      } catch (const std::exception& e) {  // CorruptImage, IoError: what training would skip
        std::lock_guard lk(mu);
        unreadable.emplace_back(path, e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  std::sort(unreadable.begin(), unreadable.end());
  json bad = json::array();
  for (const auto& [p, e] : unreadable) bad.push_back({{"path", p}, {"error", e}});
  json other = json::object();
  for (const auto& [split, n] : idx.other_files) other[split] = n;
  return {{"dataset", "imagefolder"},
          {"data_dir", dir},
          {"classes", idx.classes},
          {"splits", {{"train", split_json(idx.train, idx.classes)}, {idx.test_split, split_json(idx.test, idx.classes)}}},
          {"sizes", sizes_json(sizes)},
          {"unreadable", bad},
          {"other_files", other}};
}

json inspect_cifar10(const std::string& dir) {
  static const std::vector<std::string> names{"airplane", "automobile", "bird", "cat", "deer",
                                              "dog",      "frog",       "horse", "ship", "truck"};
  json splits = json::object();
  std::int64_t total = 0;
  for (const char* split : {"train", "test"}) {
    const auto m = load_cifar10(dir, split);
    json per = json::object();
    std::vector<std::int64_t> counts(10, 0);
    for (const auto l : m.labels) ++counts[static_cast<std::size_t>(l)];
    for (int c = 0; c < 10; ++c) per[names[static_cast<std::size_t>(c)]] = counts[static_cast<std::size_t>(c)];
    splits[split] = {{"images", m.count}, {"per_class", per}};
    total += m.count;
  }
  return {{"dataset", "cifar10"},
          {"data_dir", dir},
          {"classes", names},
          {"splits", splits},
          {"sizes", json::array({{{"width", 32}, {"height", 32}, {"channels", 3}, {"images", total}}})},
          {"unreadable", json::array()},
          {"other_files", json::object()}};
}

}  // namespace

json inspect_dataset(const std::string& dir, int threads) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError("data_dir", "directory \"" + dir + "\" does not exist");
  if (!fs::is_directory(fs::path(dir) / "train", ec)) {
    bool cifar = true;
    try {
      cifar10_files(dir, "train");
    } catch (const ConfigError&) {
      cifar = false;
    }
    if (cifar) return inspect_cifar10(dir);
  }
  return inspect_image_folder(dir, threads);
}

}  // namespace dltrain::data
