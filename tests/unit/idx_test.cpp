// IDX reader: hand-made files (plain and gzip), corrupt headers, and the real dataset.
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/temp_dir.h"
#include <zlib.h>

#include "common/errors.h"
#include "data/idx.h"

using namespace dltrain;
using namespace dltrain::data;
namespace fs = std::filesystem;
using dltrain::testing::TempDir;
using dltrain::testing::error_of;

namespace {

void be32(std::vector<unsigned char>& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

void write_plain(const fs::path& p, const std::vector<unsigned char>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const fs::path& p, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
  gzclose(f);
}

// Two 2×3 images: pixels 0..5 and 10..15.
std::vector<unsigned char> tiny_images(std::uint32_t magic = 0x00000803) {
  std::vector<unsigned char> b;
  be32(b, magic);
  be32(b, 2);
  be32(b, 2);
  be32(b, 3);
  for (int i = 0; i < 6; ++i) b.push_back(static_cast<unsigned char>(i));
  for (int i = 0; i < 6; ++i) b.push_back(static_cast<unsigned char>(10 + i));
  return b;
}


}  // namespace

TEST(Idx, ReadsHandMadeImagesPlainAndGzip) {
  TempDir d;
  write_plain(d.path / "a", tiny_images());
  write_gz(d.path / "a.gz", tiny_images());
  for (const char* name : {"a", "a.gz"}) {
    auto im = read_idx_images((d.path / name).string());
    EXPECT_EQ(im.count, 2);
    EXPECT_EQ(im.rows, 2);
    EXPECT_EQ(im.cols, 3);
    const std::vector<std::uint8_t> want{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
    EXPECT_EQ(im.pixels, want) << name;
  }
  auto first = read_idx_images((d.path / "a.gz").string(), 1);
  EXPECT_EQ(first.count, 1);
  EXPECT_EQ(first.pixels.size(), 6u);
}

TEST(Idx, ReadsHandMadeLabels) {
  TempDir d;
  std::vector<unsigned char> b;
  be32(b, 0x00000801);
  be32(b, 3);
  b.insert(b.end(), {7, 0, 9});
  write_gz(d.path / "l.gz", b);
  EXPECT_EQ(read_idx_labels((d.path / "l.gz").string()), (std::vector<std::uint8_t>{7, 0, 9}));
}

TEST(Idx, RejectsBadMagicShortFilesAndHugeHeaders) {
  TempDir d;
  write_plain(d.path / "labels-as-images", tiny_images(0x00000801));
  EXPECT_NE(error_of([&] { read_idx_images((d.path / "labels-as-images").string()); })
                .find("IDX magic number: expected 0x00000803 (ubyte, 3 dims), got 0x00000801"),
            std::string::npos);
  auto shortb = tiny_images();
  shortb.resize(shortb.size() - 4);
  write_gz(d.path / "short.gz", shortb);
  EXPECT_NE(error_of([&] { read_idx_images((d.path / "short.gz").string()); })
                .find("file is short: expected 12 bytes of the images, found 8"),
            std::string::npos);
  std::vector<unsigned char> huge;
  be32(huge, 0x00000803);
  be32(huge, 0xFFFFFFFF);
  be32(huge, 28);
  be32(huge, 28);
  write_plain(d.path / "huge", huge);
  EXPECT_NE(error_of([&] { read_idx_images((d.path / "huge").string()); }).find("implausible IDX dimensions"),
            std::string::npos);
  EXPECT_THROW(read_idx_images((d.path / "missing").string()), IoError);
  std::vector<unsigned char> tiny_header{0, 0, 8};
  write_plain(d.path / "tiny", tiny_header);
  EXPECT_THROW(read_idx_labels((d.path / "tiny").string()), IoError);
}

// Found while writing tests/fuzz/fuzz_idx.cpp: a 16-byte header claiming 2^24 images of
// 16×16 (4 GiB) made the reader allocate and zero all of it before it found the file short.
TEST(Idx, AHeaderThatClaimsGigabytesCostsOnlyTheBytesTheFileHolds) {
  TempDir d;
  std::vector<unsigned char> b;
  be32(b, 0x00000803);
  be32(b, 1u << 24);
  be32(b, 16);
  be32(b, 16);
  for (int i = 0; i < 100; ++i) b.push_back(1);
  write_plain(d.path / "claims-4GiB", b);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  EXPECT_NE(error_of([&] { read_idx_images((d.path / "claims-4GiB").string()); })
                .find("file is short: expected 4294967296 bytes of the images, found 100"),
            std::string::npos);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak memory grew";  // 16 MiB steps
  std::vector<unsigned char> labels;
  be32(labels, 0x00000801);
  be32(labels, 1u << 28);
  labels.push_back(3);
  write_plain(d.path / "claims-256MiB", labels);
  EXPECT_NE(error_of([&] { read_idx_labels((d.path / "claims-256MiB").string()); })
                .find("file is short: expected 268435456 bytes of the labels, found 1"),
            std::string::npos);
}

TEST(Idx, ShardsCoverTheSetExactlyOnce) {
  std::vector<int> seen(10, 0);
  std::size_t sizes[3];
  for (int r = 0; r < 3; ++r) {
    auto s = shard_indices(10, r, 3);
    sizes[r] = s.size();
    for (auto i : s) {
      EXPECT_EQ(i % 3, r);
      ++seen[static_cast<std::size_t>(i)];
    }
  }
  EXPECT_EQ(sizes[0], 4u);  // 0 3 6 9
  EXPECT_EQ(sizes[1], 3u);  // 1 4 7
  EXPECT_EQ(sizes[2], 3u);  // 2 5 8
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_THROW(shard_indices(10, 3, 3), ConfigError);
}

TEST(Idx, RealFashionMnistFiles) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " is missing: apt-get install dataset-fashion-mnist (scripts/setup does)";
  auto train = load_split(dir, "train");
  auto test = load_split(dir, "test");
  EXPECT_EQ(train.images.count, 60000);
  EXPECT_EQ(test.images.count, 10000);
  EXPECT_EQ(train.images.rows, 28);
  EXPECT_EQ(train.images.cols, 28);
  EXPECT_EQ(train.labels.size(), 60000u);
  // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
  std::vector<int> per_class(10, 0), test_class(10, 0);
  for (auto l : train.labels) ++per_class.at(l);
  for (auto l : test.labels) ++test_class.at(l);
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(per_class[c], 6000) << c;
    EXPECT_EQ(test_class[c], 1000) << c;
  }
  EXPECT_THROW(load_split("/nonexistent-dir", "train"), ConfigError);
}
