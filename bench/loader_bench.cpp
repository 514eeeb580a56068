// Streaming-loader throughput (docs/benchmarks/data.md, "Data loading"): images/s that
// data::StreamingLoader delivers from an ImageFolder (read, decode, transform, normalise,
// batch) with T threads, the consumer taking batches as fast as they come — the most a
// worker's step could be fed. Compare with the worker's step rate (progress events).
//
// Usage: loader_bench DATA_DIR [--threads T] [--images N] [--batch B] [--size S]
//                     [--channels C] [--augment]
// Prints one JSON line: {"data_dir", "threads", "images", "seconds", "images_per_sec",
// "skipped"}.
#include <chrono>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "data/imagefolder.h"
#include "data/loader.h"
#include "data/sharding.h"

using namespace dltrain;

int main(int argc, char** argv) {
  CLI::App app{"streaming-loader throughput on an ImageFolder"};
  std::string dir;
  int threads = 1, batch = 64, size = 32, channels = 1;
  std::int64_t images = 20000;
  bool augment = false;
  app.add_option("DATA_DIR", dir, "an ImageFolder (train/<class>/…)")->required();
  app.add_option("--threads", threads, "loader threads")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--images", images, "training images to load (from a seeded shuffle)")->capture_default_str();
  app.add_option("--batch", batch, "batch size")->capture_default_str();
  app.add_option("--size", size, "image_size")->capture_default_str();
  app.add_option("--channels", channels, "1 or 3")->capture_default_str();
  app.add_flag("--augment", augment, "crop_padding 4 and horizontal_flip");
  CLI11_PARSE(app, argc, argv);
  try {
    auto idx = data::scan_image_folder(dir);
    auto source = std::make_shared<data::ImageFileSource>(idx.train);
    auto order = data::epoch_permutation(source->size(), 1, 0);
    if (static_cast<std::int64_t>(order.size()) > images) order.resize(static_cast<std::size_t>(images));
    data::Transform t;
    t.image_size = size;
    t.channels = channels;
    t.mean.assign(static_cast<std::size_t>(channels), 0.5f);
    t.std.assign(static_cast<std::size_t>(channels), 0.25f);
    t.train = augment;
    t.augment.crop_padding = augment ? 4 : 0;
    t.augment.horizontal_flip = augment;
    data::LoaderOptions o;
    o.batch_size = batch;
    o.threads = threads;
    const auto n = static_cast<std::int64_t>(order.size());
    const auto t0 = std::chrono::steady_clock::now();
    data::StreamingLoader loader(source, std::move(order), t, o);
    data::Batch b;
    std::int64_t got = 0, skipped = 0;
    while (loader.next(b)) {
      got += b.size;
      skipped += b.skipped;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << nlohmann::json{{"data_dir", dir}, {"threads", threads}, {"images", got}, {"requested", n},
                                {"seconds", s},    {"images_per_sec", static_cast<double>(got) / s},
                                {"skipped", skipped}, {"augment", augment}}
                     .dump()
              << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "loader_bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
