// lib/data: decoding against the real Fashion-MNIST pixels, the ImageFolder layout rules,
// the CIFAR-10 reader on hand-made records, sharding, augmentation and the streaming loader.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "job/job_spec.h"
#include "data/augment.h"
#include "data/cifar10.h"
#include "data/image.h"
#include "data/imagefolder.h"
#include "data/inspect.h"
#include "data/loader.h"
#include "data/sharding.h"
#include "support/image_folder.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "data/idx.h"

using namespace dltrain;
using namespace dltrain::data;
namespace fs = std::filesystem;
using dltrain::testing::TempDir;
using dltrain::testing::error_of;
namespace tst = dltrain::testing;

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

// The loader's transform without augmentation: (pixel/255 − mean) / std on every channel.
Transform plain_transform(int size, int channels, float mean = 0.0f, float stdv = 1.0f) {
  Transform t;
  t.image_size = size;
  t.channels = channels;
  t.mean.assign(static_cast<std::size_t>(channels), mean);
  t.std.assign(static_cast<std::size_t>(channels), stdv);
  return t;
}



Image gray(int h, int w, std::vector<std::uint8_t> px) {
  Image img;
  img.height = h;
  img.width = w;
  img.channels = 1;
  img.pixels = std::move(px);
  return img;
}

// train/: IDX training images 0..239, test/: IDX test images 0..99 (even PNG, odd JPEG).
struct FashionFolder {
  TempDir dir{"dltrain-imagefolder"};
  data::Split train_src = data::load_split(kFashion, "train", 240);
  data::Split test_src = data::load_split(kFashion, "test", 100);
  FashionFolder() {
    tst::write_fashion_mnist_folder(dir.path, 240, 100, "mixed");
  }
};

}  // namespace

TEST(ImageDecode, PngOfFashionMnistIsExactAndJpegWithinTolerance) {
  const auto src = data::load_split(kFashion, "test", 200);
  // JPEG at quality 95 (4:4:4, accurate DCT) of 28×28 gray images: every pixel within 16
  // grey levels of the source and a mean absolute error under 1.5 (measured on these 200:
  // at most 9 levels, mean 0.92).
  constexpr int kJpegMaxError = 16;
  constexpr double kJpegMeanError = 1.5;
  double abs_sum = 0;
  int worst = 0;
  for (std::int64_t i = 0; i < 200; ++i) {
    const auto img = tst::idx_image(src, i);
    const auto png = decode_image(encode_png(img), 0, "png");
    ASSERT_EQ(png.channels, 1);
    ASSERT_EQ(png.height, 28);
    ASSERT_EQ(png.width, 28);
    EXPECT_EQ(png.pixels, img.pixels) << "image " << i;
    const auto jpg = decode_image(encode_jpeg(img, 95), 0, "jpg");
    ASSERT_EQ(jpg.pixels.size(), img.pixels.size());
    for (std::size_t p = 0; p < img.pixels.size(); ++p) {
      const int d = std::abs(int{jpg.pixels[p]} - int{img.pixels[p]});
      worst = std::max(worst, d);
      abs_sum += d;
    }
  }
  const double mean = abs_sum / (200.0 * 784.0);
  EXPECT_LE(worst, kJpegMaxError);
  EXPECT_LT(mean, kJpegMeanError);
  RecordProperty("jpeg_max_error", worst);
  RecordProperty("jpeg_mean_error", std::to_string(mean));
}

TEST(ImageDecode, ChannelsAreConvertedWithBt601Luma) {
  Image rgb;
  rgb.height = 1;
  rgb.width = 2;
  rgb.channels = 3;
  rgb.pixels = {10, 20, 30, 255, 0, 0};
  const auto png = decode_image(encode_png(rgb), 0, "rgb.png");
  EXPECT_EQ(png.channels, 3);
  EXPECT_EQ(png.pixels, rgb.pixels);
  const auto g = decode_image(encode_png(rgb), 1, "rgb.png");
  // (299·10 + 587·20 + 114·30 + 500) / 1000 = 18; (299·255 + 500) / 1000 = 76.
  EXPECT_EQ(g.pixels, (std::vector<std::uint8_t>{18, 76}));
  const auto back = decode_image(encode_png(g), 3, "g.png");
  EXPECT_EQ(back.pixels, (std::vector<std::uint8_t>{18, 18, 18, 76, 76, 76}));
}

TEST(ImageDecode, CorruptTruncatedAndEmptyFilesThrowCorruptImageNamingTheFile) {
  const auto src = data::load_split(kFashion, "test", 1);
  const auto png = encode_png(tst::idx_image(src, 0));
  const auto jpg = encode_jpeg(tst::idx_image(src, 0));
  const std::vector<std::uint8_t> half_png(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  const std::vector<std::uint8_t> half_jpg(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  EXPECT_THROW(decode_image(half_png, 0, "a.png"), CorruptImage);
  EXPECT_THROW(decode_image(half_jpg, 0, "a.jpg"), CorruptImage);
  EXPECT_NE(error_of([] { decode_image({}, 0, "empty.png"); }).find("empty.png\": empty file"), std::string::npos);
  const std::vector<std::uint8_t> text{'h', 'e', 'l', 'l', 'o'};
  EXPECT_NE(error_of([&] { decode_image(text, 0, "x.jpg"); }).find("neither a JPEG nor a PNG"), std::string::npos);
  // A PNG header that claims more pixels than the limits is refused before allocation.
  Image big = gray(64, 64, std::vector<std::uint8_t>(64 * 64, 7));
  DecodeLimits small;
  small.max_side = 32;
  EXPECT_THROW(decode_image(encode_png(big), 0, "big.png", small), CorruptImage);
  const auto h = read_image_header(encode_jpeg(big), "big.jpg");
  EXPECT_EQ(h.format, "jpeg");
  EXPECT_EQ(h.width, 64);
  EXPECT_EQ(h.channels, 1);
}

TEST(ImageResize, BilinearMatchesHandComputedTriangleFilter) {
  // 4 → 2 (scale 2, support 2): output 0 is centred on 1.0 with weights 0.75, 0.75, 0.25
  // on pixels 0, 1, 2 → (0 + 75 + 50) / 1.75 = 71.43; output 1 on 3.0 with 0.25, 0.75,
  // 0.75 on pixels 1, 2, 3 → (25 + 150 + 191.25) / 1.75 = 209.29.
  const auto r = resize_bilinear(gray(1, 4, {0, 100, 200, 255}), 1, 2);
  EXPECT_EQ(r.pixels, (std::vector<std::uint8_t>{71, 209}));
  // Same size: the identity.
  const Image img = gray(2, 3, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(resize_bilinear(img, 2, 3).pixels, img.pixels);
  // A constant image stays constant at any size.
  const auto up = resize_bilinear(gray(2, 2, {9, 9, 9, 9}), 5, 7);
  EXPECT_TRUE(std::all_of(up.pixels.begin(), up.pixels.end(), [](std::uint8_t v) { return v == 9; }));
  // Shorter side to 2, then the centre 2×2: 2×4 → unchanged height, columns 1..2.
  const auto cc = resize_and_center_crop(gray(2, 4, {0, 1, 2, 3, 4, 5, 6, 7}), 2);
  EXPECT_EQ(cc.pixels, (std::vector<std::uint8_t>{1, 2, 5, 6}));
}

TEST(ImageFolder, ClassOrderCountsAndPixelsOfFashionMnist) {
  FashionFolder f;
  const auto idx = scan_image_folder(f.dir.path.string());
  auto sorted = tst::fashion_mnist_classes();
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(idx.classes, sorted);
  EXPECT_EQ(idx.test_split, "test");
  ASSERT_EQ(idx.train.size(), 240u);
  ASSERT_EQ(idx.test.size(), 100u);
  EXPECT_TRUE(idx.test[0].path.ends_with(".png") || idx.test[0].path.ends_with(".jpg"));
  // Per-class counts equal the IDX labels' counts; each file's label is its folder's index.
  std::vector<int> want(10, 0), got(10, 0);
  for (std::int64_t i = 0; i < 240; ++i) ++want[f.train_src.labels[static_cast<std::size_t>(i)]];
  for (const auto& file : idx.train) {
    const auto cls = fs::path(file.path).parent_path().filename().string();
    ASSERT_EQ(idx.classes[static_cast<std::size_t>(file.label)], cls);
    const auto label = std::find(tst::fashion_mnist_classes().begin(), tst::fashion_mnist_classes().end(), cls) -
                       tst::fashion_mnist_classes().begin();
    ++got[static_cast<std::size_t>(label)];
    // The decoded pixels equal the IDX source: PNG exactly, JPEG within 16 levels.
    const auto i = std::stoll(fs::path(file.path).stem().string());
    EXPECT_EQ(f.train_src.labels[static_cast<std::size_t>(i)], label);
    const auto img = decode_image(read_file_bytes(file.path), 1, file.path);
    const auto ref = tst::idx_image(f.train_src, i);
    if (file.path.ends_with(".png")) {
      EXPECT_EQ(img.pixels, ref.pixels) << file.path;
    } else {
      for (std::size_t p = 0; p < ref.pixels.size(); ++p) {
        ASSERT_LE(std::abs(int{img.pixels[p]} - int{ref.pixels[p]}), 16) << file.path << " pixel " << p;
      }
    }
  }
  EXPECT_EQ(got, want);
}

TEST(ImageFolder, CorruptAndZeroByteFilesAreSkippedAndCounted) {
  FashionFolder f;
  const auto cls = f.dir.path / "train" / "Bag";
  tst::write_bytes(cls / "zero.png", {});
  auto png = encode_png(tst::idx_image(f.train_src, 0));
  png.resize(png.size() / 2);
  tst::write_bytes(cls / "truncated.png", png);
  tst::write_bytes(cls / "garbage.jpg", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  tst::write_bytes(cls / "notes.txt", {'x'});
  const auto idx = scan_image_folder(f.dir.path.string());
  EXPECT_EQ(idx.train.size(), 243u);  // the three bad image files are listed, notes.txt is not
  EXPECT_EQ(idx.other_files.at("train"), 1);
  auto source = std::make_shared<ImageFileSource>(idx.train);
  std::vector<std::int64_t> all(idx.train.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  const Transform t = plain_transform(28, 1);
  LoaderOptions o;
  o.batch_size = 50;
  o.threads = 2;
  StreamingLoader loader(source, all, t, o);
  int kept = 0, skipped = 0;
  std::set<std::string> reasons;
  Batch b;
  while (loader.next(b)) {
    kept += b.size;
    skipped += b.skipped;
    for (const auto& m : b.skipped_messages) reasons.insert(m.substr(0, m.find("\": ")));
  }
  EXPECT_EQ(kept, 240);
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(reasons, (std::set<std::string>{"\"" + (cls / "garbage.jpg").string(), "\"" + (cls / "truncated.png").string(),
                                            "\"" + (cls / "zero.png").string()}));
}

TEST(ImageFolder, TheDecodedCacheKeepsImagesWithinItsBudgetAndServesThemWithoutTheirFiles) {
  FashionFolder f;
  auto files = scan_image_folder(f.dir.path.string()).train;
  files.resize(10);
  // 28×28 gray: 784 bytes each; a budget of 6.5 images keeps the first 6 loaded.
  ImageFileSource cached(files, 6 * 784 + 392);
  ImageFileSource uncached(files, 0);
  std::vector<Image> first;
  for (std::int64_t i = 0; i < 10; ++i) first.push_back(cached.load(i, 1));
  EXPECT_EQ(cached.cached_images(), 6);
  EXPECT_EQ(cached.cached_bytes(), 6 * 784);
  EXPECT_EQ(uncached.cached_images(), 0);
  // The files are gone: the kept images still load, with the same pixels; the others,
  // and every image of the uncached source, fail as unreadable files do.
  for (const auto& file : files) std::filesystem::remove(file.path);
  for (std::int64_t i = 0; i < 6; ++i) {
    const Image again = cached.load(i, 1);
    EXPECT_EQ(again.pixels, first[static_cast<std::size_t>(i)].pixels) << i;
    EXPECT_EQ(again.height, 28);
  }
  for (std::int64_t i = 6; i < 10; ++i) EXPECT_ANY_THROW(cached.load(i, 1)) << i;
  EXPECT_ANY_THROW(uncached.load(0, 1));
  // An image kept with one channel count is decoded again for another (here: fails).
  EXPECT_ANY_THROW(cached.load(0, 3));
}

TEST(ImageFolder, TheDecodedCacheIsFilledOnceUnderConcurrentLoadsAndNeverKeepsACorruptFile) {
  FashionFolder f;
  tst::write_bytes(f.dir.path / "train" / "Bag" / "zero.png", {});
  const auto files = scan_image_folder(f.dir.path.string()).train;  // 241, one unreadable
  ImageFileSource src(files, std::int64_t{1} << 20);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int pass = 0; pass < 2; ++pass) {
        for (std::int64_t i = 0; i < src.size(); ++i) {
          try {
            EXPECT_EQ(src.load(i, 1).pixels.size(), 784u);
          } catch (const CorruptImage&) {
            ++failures;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(src.cached_images(), 240);
  EXPECT_EQ(src.cached_bytes(), 240 * 784);
  EXPECT_EQ(failures.load(), 4 * 2);  // the zero-byte file fails on every load
}

TEST(ImageFolder, InspectCountsClassesSizesAndUnreadableFiles) {
  FashionFolder f;
  tst::write_bytes(f.dir.path / "train" / "Bag" / "zero.png", {});
  const auto r = inspect_dataset(f.dir.path.string(), 2);
  EXPECT_EQ(r["dataset"], "imagefolder");
  ASSERT_EQ(r["classes"].size(), 10u);
  std::vector<std::int64_t> want(10, 0);
  for (std::int64_t i = 0; i < 100; ++i) ++want[f.test_src.labels[static_cast<std::size_t>(i)]];
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(r["splits"]["test"]["per_class"][tst::fashion_mnist_classes()[static_cast<std::size_t>(c)]], want[static_cast<std::size_t>(c)]);
  }
  EXPECT_EQ(r["splits"]["train"]["images"], 241);
  ASSERT_EQ(r["sizes"].size(), 1u);
  EXPECT_EQ(r["sizes"][0], (nlohmann::json{{"width", 28}, {"height", 28}, {"channels", 1}, {"images", 340}}));
  ASSERT_EQ(r["unreadable"].size(), 1u);
  EXPECT_EQ(r["unreadable"][0]["path"], (f.dir.path / "train" / "Bag" / "zero.png").string());
}

TEST(ImageFolder, LayoutErrorsNameThePath) {
  FashionFolder f;
  const auto root = f.dir.path.string();
  // An empty class folder.
  fs::create_directories(f.dir.path / "train" / "Zebra");
  auto msg = error_of([&] { scan_image_folder(root); });
  EXPECT_NE(msg.find((f.dir.path / "train" / "Zebra").string() + "\" has no image files"), std::string::npos) << msg;
  fs::remove(f.dir.path / "train" / "Zebra");
  // A test class the training set lacks.
  tst::write_bytes(f.dir.path / "test" / "Zebra" / "1.png", encode_png(tst::idx_image(f.test_src, 0)));
  msg = error_of([&] { scan_image_folder(root); });
  EXPECT_NE(msg.find((f.dir.path / "test" / "Zebra").string() + "\" has no counterpart in the training set"),
            std::string::npos)
      << msg;
  // No test/, but val/: val is the evaluation split.
  fs::remove_all(f.dir.path / "test" / "Zebra");
  fs::rename(f.dir.path / "test", f.dir.path / "val");
  EXPECT_EQ(scan_image_folder(root).test_split, "val");
  EXPECT_EQ(scan_image_folder(root).test.size(), 100u);
  // Neither.
  fs::remove_all(f.dir.path / "val");
  EXPECT_NE(error_of([&] { scan_image_folder(root); }).find("neither a test/ nor a val/"), std::string::npos);
  // No train/ at all.
  TempDir empty;
  EXPECT_NE(error_of([&] { scan_image_folder(empty.path.string()); }).find("has no train/ folder"), std::string::npos);
}

TEST(ImageFolder, JobFileIsValidatedAtSubmitNamingTheField) {
  FashionFolder f;
  const std::string base = "dataset = \"imagefolder\"\nmodel = \"resnet20\"\nimage_size = 32\ndata_dir = \"" +
                           f.dir.path.string() + "\"\n";
  const auto spec = parse_job_toml(base + "[augment]\ncrop_padding = 4\nhorizontal_flip = true\n");
  EXPECT_EQ(spec.channels, 3);
  EXPECT_EQ(spec.image_size, 32);
  EXPECT_EQ(spec.augment.crop_padding, 4);
  EXPECT_TRUE(spec.augment.horizontal_flip);
  nlohmann::json j;
  to_json(j, spec);
  const auto back = job_from_json(j);
  EXPECT_EQ(back.augment.crop_padding, 4);
  EXPECT_EQ(back.dataset, DatasetKind::kImageFolder);
  EXPECT_EQ(parse_job_toml(base.substr(0, base.find("image_size")) + "data_dir = \"" + f.dir.path.string() + "\"\n").image_size,
            224);
  auto field_of = [&](const std::string& text) {
    try {
      parse_job_toml(text);
    } catch (const ConfigError& e) {
      return e.field();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(field_of(base + "mean = [0.5]\nstd = [0.5]\n"), "mean");  // 3 channels need 3 values
  EXPECT_EQ(field_of(base + "mean = [0.5, 0.5, 0.5]\n"), "std");      // std missing
  EXPECT_EQ(field_of(base + "channels = 2\n"), "channels");
  EXPECT_EQ(field_of(base + "std = [0.5, 0.0, 0.5]\nmean = [0.1, 0.1, 0.1]\n"), "std");
  EXPECT_EQ(field_of(base + "[augment]\nshear = 3\n"), "augment.shear");
  EXPECT_EQ(field_of(base + "[augment]\nscale = [0.9, 0.1]\n"), "augment.scale");
  EXPECT_EQ(field_of(base + "[augment]\ncrop_padding = 40\n"), "augment.crop_padding");
  fs::create_directories(f.dir.path / "train" / "Empty");
  EXPECT_EQ(field_of(base), "data_dir");
  TempDir cifar;
  EXPECT_EQ(field_of("dataset = \"cifar10\"\ndata_dir = \"" + cifar.path.string() + "\"\n"), "data_dir");
}

namespace {

// CIFAR-10 record r: label r % 10, red = (p + r) % 256, green = 2p % 256, blue = 255 − p % 256.
std::vector<std::uint8_t> cifar_records(int n) {
  std::vector<std::uint8_t> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(static_cast<std::uint8_t>(r % 10));
    for (int p = 0; p < 1024; ++p) b.push_back(static_cast<std::uint8_t>((p + r) % 256));
    for (int p = 0; p < 1024; ++p) b.push_back(static_cast<std::uint8_t>((2 * p) % 256));
    for (int p = 0; p < 1024; ++p) b.push_back(static_cast<std::uint8_t>(255 - p % 256));
  }
  return b;
}

}  // namespace

TEST(Cifar10, RecordsBecomeHwcImagesWithTheirLabels) {
  const auto m = parse_cifar10(cifar_records(3), "batch.bin");
  ASSERT_EQ(m.count, 3);
  EXPECT_EQ(m.height, 32);
  EXPECT_EQ(m.channels, 3);
  EXPECT_EQ(m.labels, (std::vector<std::int32_t>{0, 1, 2}));
  // Record 2, pixel (row 1, column 3) = p 35: R (35 + 2), G 70, B 255 − 35.
  const std::size_t at = 2 * 3072 + (1 * 32 + 3) * 3;
  EXPECT_EQ(m.pixels[at], 37);
  EXPECT_EQ(m.pixels[at + 1], 70);
  EXPECT_EQ(m.pixels[at + 2], 220);
  EXPECT_EQ(parse_cifar10(cifar_records(3), "b", 2).count, 2);
}

TEST(Cifar10, ShortFileBadRecordSizeAndBadLabelAreRefused) {
  auto b = cifar_records(2);
  b.resize(b.size() - 100);
  auto msg = error_of([&] { parse_cifar10(b, "short.bin"); });
  EXPECT_NE(msg.find("\"short.bin\": 6046 bytes is not a whole number of 3073-byte records (1 records and 2973"),
            std::string::npos)
      << msg;
  b = cifar_records(2);
  b.push_back(0);
  EXPECT_THROW(parse_cifar10(b, "long.bin"), ProtocolError);
  EXPECT_THROW(parse_cifar10({}, "empty.bin"), ProtocolError);
  b = cifar_records(2);
  b[kCifar10RecordBytes] = 10;
  msg = error_of([&] { parse_cifar10(b, "label.bin"); });
  EXPECT_NE(msg.find("record 1 has label 10, expected 0..9"), std::string::npos) << msg;
}

TEST(Cifar10, DirectoryWithThePublishedFileNames) {
  TempDir d;
  const auto sub = d.path / "cifar-10-batches-bin";
  for (int i = 1; i <= 5; ++i) tst::write_bytes(sub / ("data_batch_" + std::to_string(i) + ".bin"), cifar_records(2));
  tst::write_bytes(sub / "test_batch.bin", cifar_records(3));
  EXPECT_NO_THROW(check_cifar10_dir(d.path.string()));
  const auto train = load_cifar10(d.path.string(), "train");
  EXPECT_EQ(train.count, 10);
  EXPECT_EQ(train.labels[2], 0);  // file 2's first record
  EXPECT_EQ(load_cifar10(d.path.string(), "train", 3).count, 3);
  EXPECT_EQ(load_cifar10(d.path.string(), "test").count, 3);
  auto bad = cifar_records(1);
  bad.pop_back();
  tst::write_bytes(sub / "test_batch.bin", bad);
  try {
    check_cifar10_dir(d.path.string());
    FAIL() << "accepted a short test_batch.bin";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data_dir");
    EXPECT_NE(std::string(e.what()).find("test_batch.bin"), std::string::npos);
  }
  fs::remove(sub / "data_batch_3.bin");
  EXPECT_NE(error_of([&] { cifar10_files(d.path.string(), "train"); }).find("has no data_batch_3.bin"), std::string::npos);
}

TEST(Sharding, ThreeWorkersTwoEpochsCoverEveryImageExactlyOnce) {
  constexpr std::int64_t n = 1000;
  std::vector<std::vector<std::int64_t>> epoch_orders;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(n, 0);
    std::vector<std::int64_t> order;
    for (int rank = 0; rank < 3; ++rank) {
      const auto s = epoch_shard(n, rank, 3, 42, epoch);
      EXPECT_EQ(static_cast<std::int64_t>(s.size()), shard_size(n, rank, 3));
      EXPECT_EQ(s.size(), rank == 0 ? 334u : 333u);
      for (const auto i : s) ++seen[static_cast<std::size_t>(i)];
      order.insert(order.end(), s.begin(), s.end());
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "epoch " << epoch;
    epoch_orders.push_back(order);
  }
  EXPECT_NE(epoch_orders[0], epoch_orders[1]);                 // reshuffled every epoch
  EXPECT_NE(epoch_shard(n, 0, 3, 42, 0), epoch_shard(n, 0, 3, 43, 0));  // by the seed
  EXPECT_EQ(epoch_shard(n, 1, 3, 42, 1), epoch_shard(n, 1, 3, 42, 1));  // and only by it
  EXPECT_THROW(epoch_shard(n, 3, 3, 42, 0), ConfigError);
  EXPECT_EQ(shard_size(2, 2, 3), 0);
}

TEST(Augment, PaddedCropAndFlipFollowTheirDraws) {
  std::vector<std::uint8_t> px(16);
  for (int i = 0; i < 16; ++i) px[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i + 1);
  const Image img = gray(4, 4, px);
  AugmentSpec spec;
  spec.crop_padding = 2;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed), replay(seed);
    const auto out = train_transform(img, 4, spec, rng);
    const int dy = uniform_int(replay, 0, 4), dx = uniform_int(replay, 0, 4);
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 4; ++x) {
        const int sy = y + dy - 2, sx = x + dx - 2;
        const int want = (sy >= 0 && sy < 4 && sx >= 0 && sx < 4) ? sy * 4 + sx + 1 : 0;
        ASSERT_EQ(out.at(y, x, 0), want) << "seed " << seed;
      }
    }
  }
  AugmentSpec flip;
  flip.horizontal_flip = true;
  int flipped = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    std::mt19937_64 rng(seed);
    const auto out = train_transform(img, 4, flip, rng);
    if (out.at(0, 0, 0) == 4) {
      ++flipped;
      EXPECT_EQ(out.pixels, (std::vector<std::uint8_t>{4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13}));
    } else {
      EXPECT_EQ(out.pixels, img.pixels);
    }
  }
  EXPECT_GT(flipped, 70);  // p = 0.5 over 200 draws: 100 ± 7 (σ); far outside 70..130 is broken
  EXPECT_LT(flipped, 130);
}

TEST(Augment, RandomResizedCropBoxesRespectScaleAndRatio) {
  AugmentSpec spec;
  spec.random_resized_crop = true;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    const auto b = random_resized_crop_box(100, 120, spec, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 100);
    ASSERT_LE(b.left + b.width, 120);
    const double frac = static_cast<double>(b.height) * b.width / (100.0 * 120.0);
    // Rounding of the sides moves the area by a little; the fallback is the whole image.
    EXPECT_GE(frac, 0.08 * 0.8);
    EXPECT_LE(frac, 1.0);
  }
  std::mt19937_64 a(3), b(3);
  const Image img = gray(10, 10, std::vector<std::uint8_t>(100, 5));
  EXPECT_EQ(train_transform(img, 8, spec, a).pixels, train_transform(img, 8, spec, b).pixels);
  EXPECT_EQ(train_transform(img, 8, spec, a).height, 8);
}

namespace {

// In-memory source whose loads are counted (and optionally slowed), for the loader tests.
class CountingSource final : public ExampleSource {
 public:
  explicit CountingSource(std::int64_t n, int delay_ms = 0) : n_(n), delay_ms_(delay_ms) {}
  std::int64_t size() const override { return n_; }
  int label(std::int64_t i) const override { return static_cast<int>(i % 10); }
  Image load(std::int64_t i, int channels) const override {
    loads.fetch_add(1);
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    Image img;
    img.height = img.width = 6;
    img.channels = 1;
    img.pixels.resize(36);
    for (int p = 0; p < 36; ++p) img.pixels[static_cast<std::size_t>(p)] = static_cast<std::uint8_t>((i * 7 + p) % 256);
    return convert_channels(std::move(img), channels);
  }
  std::string name(std::int64_t i) const override { return "example " + std::to_string(i); }
  mutable std::atomic<int> loads{0};

 private:
  std::int64_t n_;
  int delay_ms_;
};

std::vector<Batch> drain(std::shared_ptr<const ExampleSource> src, int threads, const Transform& t, int batch = 8,
                         int queue = 0) {
  std::vector<std::int64_t> order = epoch_permutation(src->size(), 5, 0);
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = threads;
  o.queue_batches = queue;
  o.seed = 99;
  StreamingLoader loader(std::move(src), order, t, o);
  std::vector<Batch> out;
  Batch b;
  while (loader.next(b)) out.push_back(std::move(b));
  return out;
}

}  // namespace

TEST(Loader, BatchesAreNormalisedAndIdenticalForAnyThreadCount) {
  auto src = std::make_shared<CountingSource>(100);
  Transform t = plain_transform(6, 1, 0.5f, 0.25f);
  t.train = true;
  t.augment.crop_padding = 2;
  t.augment.horizontal_flip = true;
  const auto one = drain(src, 1, t), three = drain(src, 3, t);
  ASSERT_EQ(one.size(), 13u);  // ⌈100 / 8⌉
  ASSERT_EQ(three.size(), one.size());
  for (std::size_t b = 0; b < one.size(); ++b) {
    EXPECT_EQ(one[b].index, static_cast<std::int64_t>(b));
    EXPECT_EQ(one[b].labels, three[b].labels);
    EXPECT_EQ(one[b].images, three[b].images) << "batch " << b;
  }
  EXPECT_EQ(one.back().size, 4);
  // Without augmentation a value is (pixel/255 − 0.5) / 0.25 of the source pixel.
  t.train = false;
  const auto plain = drain(src, 2, t, 100);
  const auto order = epoch_permutation(100, 5, 0);
  ASSERT_EQ(plain.size(), 1u);
  for (int k = 0; k < 100; k += 17) {
    const auto e = order[static_cast<std::size_t>(k)];
    EXPECT_EQ(plain[0].labels[static_cast<std::size_t>(k)], e % 10);
    for (int p = 0; p < 36; p += 5) {
      const float want = (static_cast<float>((e * 7 + p) % 256) / 255.0f - 0.5f) / 0.25f;
      EXPECT_NEAR(plain[0].images[static_cast<std::size_t>(k) * 36 + p], want, 1e-5f);
    }
  }
}

// The examples 0 … n-1 in their own order.
std::vector<std::int64_t> identity_order(std::int64_t n) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

TEST(Loader, QueueNeverExceedsItsBound) {
  auto src = std::make_shared<CountingSource>(400);
  const Transform t = plain_transform(6, 1);
  const auto order = identity_order(400);
  LoaderOptions o;
  o.batch_size = 4;
  o.threads = 4;
  o.queue_batches = 3;
  StreamingLoader loader(src, order, t, o);
  EXPECT_EQ(loader.queue_bound(), 3);
  Batch b;
  int n = 0;
  while (loader.next(b)) {
    // A slow consumer: the threads fill the queue and must then wait.
    if (n++ < 20) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_LE(src->loads.load(), (n + 3) * 4);  // never more than 3 batches ahead
  }
  EXPECT_EQ(n, 100);
  EXPECT_LE(loader.max_in_flight(), 3);
  EXPECT_GE(loader.max_in_flight(), 2);
}

TEST(Loader, StopsPromptlyWhenAskedAndWhenDestroyed) {
  auto src = std::make_shared<CountingSource>(100000, 1);
  const Transform t = plain_transform(6, 3);
  const auto order = identity_order(100000);
  LoaderOptions o;
  o.batch_size = 32;
  o.threads = 2;
  {
    StreamingLoader loader(src, order, t, o);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.size, 32);
    EXPECT_EQ(b.images.size(), 32u * 3 * 36);
    loader.stop();
    EXPECT_FALSE(loader.next(b));
  }  // joined here
  // After the stop each thread finishes at most the example it was decoding: of the
  // 3,125 batches only the first few (the bound of 4 in flight) were ever started.
  // The threads are joined, so this count is final.
  EXPECT_LE(src->loads.load(), 5 * 32);
}

TEST(Loader, MeanAndStdOfASampleMatchTheDirectComputation) {
  auto src = std::make_shared<CountingSource>(50);
  const auto st = estimate_mean_std(src, 6, 1, 50, 1, 2);
  EXPECT_EQ(st.images, 50);
  double s = 0, sq = 0;
  for (int i = 0; i < 50; ++i) {
    for (int p = 0; p < 36; ++p) {
      const double v = ((i * 7 + p) % 256) / 255.0;
      s += v;
      sq += v * v;
    }
  }
  const double m = s / 1800, sd = std::sqrt(sq / 1800 - m * m);
  ASSERT_EQ(st.mean.size(), 1u);
  EXPECT_NEAR(st.mean[0], m, 1e-5);
  EXPECT_NEAR(st.std[0], sd, 1e-5);
}
