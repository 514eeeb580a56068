// Sharded data sets (docs/data.md): the tar format against GNU tar (an independent reader
// and writer), samples and their errors, the manifest's checks, the deal of shards to
// workers and its windows against hand-worked cases, pack against the source files it
// read, fetches over a real TCP connection (refused: retried, logged, then failed), the
// agent's shard cache (bound, LRU, holds, checksums, restarts, one fetch per shard) and its
// Unix-socket server with the worker's client.
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/shard_cache.h"
#include "agent/shard_cache_server.h"
#include "common/errors.h"
#include "common/file_transfer.h"
#include "data/export.h"
#include "data/fetch.h"
#include "data/image.h"
#include "data/imagefolder.h"
#include "data/pack.h"
#include "data/shard_client.h"
#include "data/shard_reader.h"
#include "data/shards.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace dltrain;
using dltrain::testing::TempDir;

namespace {

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A shard file with `n` samples (key i, a 1×1 PNG of value i, label i % classes) written by
// TarWriter; returns its ShardInfo.
data::ShardInfo write_shard(const fs::path& dir, const std::string& name, int n, int classes, int first = 0) {
  data::TarWriter w((dir / name).string());
  for (int i = first; i < first + n; ++i) {
    data::Image img{1, 1, 1, {static_cast<std::uint8_t>(i)}};
    char key[16];
    std::snprintf(key, sizeof key, "%06d", i);
    w.add(std::string(key) + ".png", data::encode_png(img));
    w.add(std::string(key) + ".cls", bytes_of(std::to_string(i % classes)));
  }
  data::ShardInfo info;
  info.name = name;
  info.samples = n;
  info.bytes = w.finish(info.sha256);
  return info;
}

}  // namespace

// ---------------------------------------------------------------- tar

TEST(Tar, WhatTarWriterWritesGnuTarLists) {
  TempDir dir;
  const auto path = (dir.path / "a.tar").string();
  data::TarWriter w(path);
  w.add("000001.png", bytes_of("hello"));
  w.add("000001.cls", bytes_of("7"));
  w.add("empty.txt", {});
  std::string sha;
  const auto size = w.finish(sha);
  EXPECT_EQ(size, static_cast<std::int64_t>(fs::file_size(path)));
  // 3 headers, 2 data blocks (the empty member has none), 2 end blocks = 7 × 512 bytes.
  EXPECT_EQ(size, 7 * 512);
  EXPECT_EQ(sha, sha256_file_hex(path));
  EXPECT_EQ(run("tar -tf " + path), "000001.png\n000001.cls\nempty.txt\n");
  EXPECT_EQ(run("tar -xOf " + path + " 000001.png"), "hello");
  EXPECT_EQ(run("tar -xOf " + path + " 000001.cls"), "7");
}

TEST(Tar, ReadsWhatGnuTarWrites) {
  TempDir dir;
  fs::create_directories(dir.path / "src" / "sub");
  std::ofstream(dir.path / "src" / "x.cls") << "3";
  std::string big(70000, 'z');  // several blocks
  std::ofstream(dir.path / "src" / "sub" / "long-name-0123456789-0123456789-0123456789-0123456789-0123456789-0123456789-xyz.bin")
      << big;
  const auto tar = (dir.path / "g.tar").string();
  ASSERT_EQ(std::system(("tar -C " + (dir.path / "src").string() + " --format=gnu -cf " + tar + " x.cls sub").c_str()), 0);
  const auto bytes = data::read_file_bytes(tar);
  const auto members = data::read_tar(bytes, tar);
  std::map<std::string, std::string> got;
  for (const auto& m : members) got[m.name] = std::string(m.bytes.begin(), m.bytes.end());
  EXPECT_EQ(got["x.cls"], "3");
  // The GNU long-name header (type 'L') is skipped, not interpreted: the member's data is
  // still found (under the truncated name GNU tar puts in the header).
  bool found_big = false;
  for (const auto& [name, data] : got) found_big = found_big || data == big;
  EXPECT_TRUE(found_big);
}

TEST(Tar, RejectsCorruptAndTruncatedArchives) {
  TempDir dir;
  const auto info = write_shard(dir.path, "s.tar", 2, 10);
  auto bytes = data::read_file_bytes((dir.path / "s.tar").string());
  auto bad = bytes;
  bad[10] ^= 0xFF;  // inside the first header's name: its checksum no longer matches
  EXPECT_THROW(data::read_tar(bad, "s.tar"), ProtocolError);
  try {
    data::read_tar(bad, "s.tar");
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("bad checksum"), std::string::npos) << e.what();
  }
  std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + 512 + 20);  // a member (a ~67-byte PNG) cut short
  EXPECT_THROW(data::read_tar(cut, "s.tar"), ProtocolError);
  std::vector<std::uint8_t> partial_header(bytes.begin(), bytes.begin() + 300);
  EXPECT_THROW(data::read_tar(partial_header, "s.tar"), ProtocolError);
  EXPECT_EQ(info.samples, 2);
}

TEST(Tar, MemberNamesAreChecked) {
  TempDir dir;
  data::TarWriter w((dir.path / "n.tar").string());
  EXPECT_THROW(w.add("a/b.png", bytes_of("x")), InvalidArgument);
  EXPECT_THROW(w.add(std::string(100, 'a'), bytes_of("x")), InvalidArgument);
  EXPECT_THROW(w.add("", bytes_of("x")), InvalidArgument);
}

// ---------------------------------------------------------------- samples

TEST(ShardSamples, GroupsMembersByKeyWithTheirLabels) {
  TempDir dir;
  write_shard(dir.path, "s.tar", 5, 3);
  const auto bytes = data::read_file_bytes((dir.path / "s.tar").string());
  const auto samples = data::read_shard_samples(bytes, 3, "s.tar");
  ASSERT_EQ(samples.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(samples[static_cast<std::size_t>(i)].label, i % 3);
    const auto img = data::decode_image(samples[static_cast<std::size_t>(i)].image, 1, "x");
    EXPECT_EQ(img.pixels.at(0), i);
  }
}

TEST(ShardSamples, NamesTheSampleAndTheProblem) {
  TempDir dir;
  const auto make = [&](const std::vector<std::pair<std::string, std::string>>& members) {
    data::TarWriter w((dir.path / "t.tar").string());
    for (const auto& [n, b] : members) w.add(n, bytes_of(b));
    std::string sha;
    w.finish(sha);
    return data::read_file_bytes((dir.path / "t.tar").string());
  };
  const auto png = data::encode_png(data::Image{1, 1, 1, {0}});
  const std::string p(png.begin(), png.end());
  const auto message = [&](const std::vector<std::pair<std::string, std::string>>& members) {
    try {
      data::read_shard_samples(make(members), 10, "http://h/t.tar");
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"a.png", p}}).find("sample a has no label"), std::string::npos);
  EXPECT_NE(message({{"a.cls", "1"}}).find("sample a has no image"), std::string::npos);
  EXPECT_NE(message({{"a.png", p}, {"a.cls", "10"}}).find("not a class index in [0, 10)"), std::string::npos);
  EXPECT_NE(message({{"a.png", p}, {"a.cls", "x1"}}).find("http://h/t.tar: sample a"), std::string::npos);
  // Other members of a sample are ignored; a trailing newline in .cls is accepted.
  EXPECT_EQ(message({{"a.png", p}, {"a.cls", "4\n"}, {"a.json", "{}"}}), "no error");
}

// ---------------------------------------------------------------- manifest

TEST(Manifest, RoundTripsAndNamesWhatIsWrong) {
  data::Manifest m;
  m.classes = {"a", "b"};
  m.train.shards = {{"train-0.tar", 3, 4096, std::string(64, 'a')}, {"train-1.tar", 2, 2048, std::string(64, 'b')}};
  m.train.samples = 5;
  m.test.shards = {{"test-0.tar", 1, 1024, std::string(64, 'c')}};
  m.test.samples = 1;
  m.channels = 1;
  m.image_size = 28;
  m.mean = {0.5f};
  m.std = {0.25f};
  const auto j = data::manifest_json(m);
  const auto back = data::parse_manifest(j.dump(), "m");
  EXPECT_EQ(back.classes, m.classes);
  EXPECT_EQ(back.train.samples, 5);
  EXPECT_EQ(back.train.bytes, 6144);
  EXPECT_EQ(back.test.shards.at(0).sha256, std::string(64, 'c'));
  const auto error = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto k = j;
    edit(k);
    try {
      data::parse_manifest(k.dump(), "URL/manifest.json");
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "data");
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error([](auto& k) { k["format"] = "other/1"; }).find("format"), std::string::npos);
  EXPECT_NE(error([](auto& k) { k["splits"]["train"]["samples"] = 6; }).find("splits.train.samples: 6 is not the sum"),
            std::string::npos);
  EXPECT_NE(error([](auto& k) { k["splits"]["train"]["shards"][1]["name"] = "train-0.tar"; }).find("listed twice"),
            std::string::npos);
  EXPECT_NE(error([](auto& k) { k["splits"]["train"]["shards"][0]["name"] = "../x.tar"; }).find("not a plain file name"),
            std::string::npos);
  EXPECT_NE(error([](auto& k) { k["splits"]["test"]["shards"][0]["sha256"] = "abc"; }).find("splits.test.shards[0].sha256"),
            std::string::npos);
  EXPECT_NE(error([](auto& k) { k["stats"]["std"] = {0.0}; }).find("stats.std"), std::string::npos);
  EXPECT_NE(error([](auto& k) { k["stats"]["mean"] = {0.1, 0.2}; }).find("2 values for 1 channels"), std::string::npos);
  EXPECT_NE(error([](auto& k) { k.erase("classes"); }).find("classes"), std::string::npos);
  EXPECT_NE(error([](auto& k) { k["splits"]["test"]["shards"] = nlohmann::json::array(); }).find("empty"), std::string::npos);
  try {
    data::parse_manifest("{\"format\": ", "URL/manifest.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("URL/manifest.json: not JSON"), std::string::npos);
  }
}

// ---------------------------------------------------------------- the deal

TEST(DealShards, EverySampleOnceRunsOfShardSizeTheSameShardsEveryEpoch) {
  // Shards of 3, 2 and 4 samples (n = 9), 2 workers: runs of ⌈9/2⌉ = 5 and 4 samples.
  const std::vector<std::int64_t> counts{3, 2, 4};
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<std::pair<std::int64_t, std::int64_t>> seen;  // (shard, sample)
    for (int rank = 0; rank < 2; ++rank) {
      const auto slices = data::deal_shards(counts, rank, 2, 11, epoch);
      std::int64_t n = 0;
      for (const auto& s : slices) {
        ASSERT_LT(s.begin, s.end);
        ASSERT_LE(s.end, counts[static_cast<std::size_t>(s.shard)]);
        for (auto k = s.begin; k < s.end; ++k) seen.insert({s.shard, k});
        n += s.end - s.begin;
      }
      EXPECT_EQ(n, rank == 0 ? 5 : 4);
      // The same slices every epoch (the order may differ).
      auto sorted = [](std::vector<data::ShardSlice> v) {
        std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> t;
        for (const auto& s : v) t.emplace_back(s.shard, s.begin, s.end);
        std::sort(t.begin(), t.end());
        return t;
      };
      EXPECT_EQ(sorted(slices), sorted(data::deal_shards(counts, rank, 2, 11, 0)));
    }
    EXPECT_EQ(seen.size(), 9u);
    const std::set<std::pair<std::int64_t, std::int64_t>> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), 9u);
  }
  EXPECT_THROW(data::deal_shards(counts, 2, 2, 0, 0), InvalidArgument);
  EXPECT_THROW(data::deal_shards({3, 0}, 0, 1, 0, 0), InvalidArgument);
  // More workers than shards: a shard is split between workers.
  std::int64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    for (const auto& s : data::deal_shards({6}, r, 4, 1, 0)) total += s.end - s.begin;
  }
  EXPECT_EQ(total, 6);
}

TEST(DealShards, EachEpochShufflesTheOrderOfManySlices) {
  std::vector<std::int64_t> counts(40, 10);
  const auto a = data::deal_shards(counts, 0, 2, 3, 0), b = data::deal_shards(counts, 0, 2, 3, 1);
  ASSERT_EQ(a.size(), b.size());
  bool differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) differs = differs || a[i].shard != b[i].shard;
  EXPECT_TRUE(differs);
}

TEST(ShardWindows, OneShardFirstThenWindows) {
  EXPECT_EQ(data::shard_windows(7, 3), (std::vector<std::int64_t>{1, 3, 3}));
  EXPECT_EQ(data::shard_windows(6, 3), (std::vector<std::int64_t>{1, 3, 2}));
  EXPECT_EQ(data::shard_windows(1, 4), (std::vector<std::int64_t>{1}));
  EXPECT_TRUE(data::shard_windows(0, 4).empty());
}

// ---------------------------------------------------------------- pack

TEST(Pack, ByteSizes) {
  EXPECT_EQ(data::parse_byte_size("256MB"), 256000000);
  EXPECT_EQ(data::parse_byte_size("64MiB"), 64 << 20);
  EXPECT_EQ(data::parse_byte_size("1gib"), std::int64_t{1} << 30);
  EXPECT_EQ(data::parse_byte_size("4096"), 4096);
  EXPECT_THROW(data::parse_byte_size("1.5G"), ConfigError);
  EXPECT_THROW(data::parse_byte_size("12 parsecs"), ConfigError);
}

TEST(Pack, AnImageFolderWithABadFileIntoShardsThatHoldEveryGoodFile) {
  const std::string fmnist = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(fmnist)) GTEST_SKIP() << "needs " << fmnist;
  TempDir dir;
  const auto src = dir.path / "src", dest = dir.path / "packed";
  data::IdxExportOptions eo;
  eo.train = 300;
  eo.test = 40;
  data::export_idx_as_image_folder(fmnist, src.string(), eo);
  const auto folder = data::scan_image_folder(src.string());
  const auto bad = fs::path(folder.train.at(7).path);
  std::ofstream(bad, std::ios::trunc) << "not an image";
  data::PackOptions po;
  po.shard_bytes = 64 << 10;
  const auto report = data::pack_dataset(src.string(), dest.string(), po);
  ASSERT_EQ(report["skipped"].size(), 1u);
  EXPECT_EQ(report["skipped"][0]["path"], bad.string());
  const auto m = data::parse_manifest(read_text(dest / data::kManifestName), "manifest");
  EXPECT_EQ(m.classes, folder.classes);
  EXPECT_EQ(m.train.samples, 299);
  EXPECT_EQ(m.test.samples, 40);
  EXPECT_GT(m.train.shards.size(), 1u);
  EXPECT_EQ(m.channels, 1);
  EXPECT_EQ(m.image_size, 28);
  // Every shard as the manifest says; every good file's bytes and label in exactly one.
  std::map<std::string, int> wanted;  // file bytes → label
  for (const auto& f : folder.train) {
    if (f.path == bad.string()) continue;
    const auto b = data::read_file_bytes(f.path);
    wanted[std::string(b.begin(), b.end())] = f.label;
  }
  double sum = 0, sumsq = 0, pixels = 0;
  std::size_t found = 0;
  for (const auto& s : m.train.shards) {
    const auto path = (dest / s.name).string();
    EXPECT_EQ(static_cast<std::int64_t>(fs::file_size(path)), s.bytes);
    EXPECT_EQ(sha256_file_hex(path), s.sha256);
    const auto samples = data::read_shard_samples(data::read_file_bytes(path), static_cast<int>(m.classes.size()), path);
    EXPECT_EQ(static_cast<std::int64_t>(samples.size()), s.samples);
    for (const auto& x : samples) {
      const auto it = wanted.find(std::string(x.image.begin(), x.image.end()));
      ASSERT_NE(it, wanted.end());
      EXPECT_EQ(it->second, x.label);
      wanted.erase(it);
      ++found;
      for (const auto v : data::decode_image(x.image, 1, "x").pixels) {
        sum += v / 255.0;
        sumsq += (v / 255.0) * (v / 255.0);
        ++pixels;
      }
    }
  }
  EXPECT_EQ(found, 299u);
  EXPECT_TRUE(wanted.empty());
  const double mean = sum / pixels;
  EXPECT_NEAR(m.mean.at(0), mean, 1e-5);
  EXPECT_NEAR(m.std.at(0), std::sqrt(sumsq / pixels - mean * mean), 1e-5);
  // Python's tarfile (another reader) lists the same members.
  const auto listed = run("python3 -c \"import tarfile,sys; print(len(tarfile.open(sys.argv[1]).getnames()))\" " +
                          (dest / m.train.shards.at(0).name).string());
  EXPECT_EQ(std::stoll(listed), 2 * m.train.shards.at(0).samples);
}

// ---------------------------------------------------------------- fetch

TEST(Fetch, ARefusedConnectionIsRetriedWithLoggedBackOffThenFails) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);  // nothing listens there now: connections are refused
  data::FetchOptions o;
  o.attempts = 3;
  o.first_backoff_s = 0.01;
  std::vector<std::string> lines;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  TempDir dir;
  const auto url = "http://127.0.0.1:" + std::to_string(port) + "/x.tar";
  try {
    data::fetch_to_file(url, (dir.path / "x").string(), 1 << 20, o);
    FAIL();
  } catch (const data::FetchError& e) {
    EXPECT_FALSE(e.permanent());
    EXPECT_NE(std::string(e.what()).find(url), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gave up after 3 tries"), std::string::npos) << e.what();
  }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("retry 2 of 3 in 0.0 s"), std::string::npos) << lines[0];
  EXPECT_FALSE(fs::exists(dir.path / "x"));
}

TEST(Fetch, S3WithoutCredentialsNamesTheSettings) {
  data::FetchOptions o;
  o.s3.endpoint = "http://127.0.0.1:1";
  o.s3.credentials_file = "/nonexistent/credentials";
  try {
    data::fetch_text("s3://bucket/p/manifest.json", 1024, o);
    FAIL();
  } catch (const data::FetchError& e) {
    EXPECT_TRUE(e.permanent());
    EXPECT_NE(std::string(e.what()).find("s3_credentials_file"), std::string::npos) << e.what();
  }
}

TEST(Fetch, DataUrlsAreChecked) {
  EXPECT_NO_THROW(data::check_data_url("s3://bucket/prefix"));
  EXPECT_NO_THROW(data::check_data_url("https://host/x"));
  EXPECT_NO_THROW(data::check_data_url("/srv/data"));
  EXPECT_NO_THROW(data::check_data_url("file:///srv/data"));
  EXPECT_THROW(data::check_data_url("s3:///prefix"), ConfigError);
  EXPECT_THROW(data::check_data_url("ftp://host/x"), ConfigError);
  EXPECT_THROW(data::check_data_url("relative/path"), ConfigError);
  EXPECT_THROW(data::check_data_url("file://relative"), ConfigError);
  EXPECT_EQ(data::join_url("s3://b/p", "m.json"), "s3://b/p/m.json");
  EXPECT_EQ(data::join_url("http://h/p/", "m.json"), "http://h/p/m.json");
}

// ---------------------------------------------------------------- the cache

namespace {
struct Store {
  TempDir src{"dltrain-store"};
  std::vector<data::ShardInfo> shards;
  agent::ShardRef ref(std::size_t i) const {
    return {(src.path / shards[i].name).string(), shards[i].sha256, shards[i].bytes};
  }
};
agent::ShardCache::Options cache_options(const fs::path& dir, std::int64_t capacity) {
  agent::ShardCache::Options o;
  o.dir = dir.string();
  o.capacity_bytes = capacity;
  o.fetch.attempts = 1;
  return o;
}
}  // namespace

TEST(ShardCache, BoundedLeastRecentlyUsedOutFirstHeldNeverEvicted) {
  Store store;
  for (int i = 0; i < 4; ++i) store.shards.push_back(write_shard(store.src.path, "s" + std::to_string(i) + ".tar", 4, 2, i * 4));
  const std::int64_t one = store.shards[0].bytes;
  for (const auto& s : store.shards) ASSERT_EQ(s.bytes, one);  // equal sizes: the bound counts shards
  TempDir dir;
  agent::ShardCache cache(cache_options(dir.path, 2 * one));
  const auto p0 = cache.acquire(store.ref(0), 1);
  EXPECT_EQ(sha256_file_hex(p0), store.shards[0].sha256);
  cache.release(store.shards[0].sha256, 1);
  cache.acquire(store.ref(1), 1);
  cache.release(store.shards[1].sha256, 1);
  cache.acquire(store.ref(0), 1);  // 0 used after 1: 1 is the least recently used
  cache.release(store.shards[0].sha256, 1);
  cache.acquire(store.ref(2), 1);  // evicts 1
  auto held = cache.held();
  EXPECT_EQ(std::set<std::string>(held.begin(), held.end()),
            (std::set<std::string>{store.shards[0].sha256, store.shards[2].sha256}));
  auto st = cache.stats();
  EXPECT_EQ(st.evictions, 1);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.misses, 3);
  EXPECT_EQ(st.fetches, 3);
  EXPECT_EQ(st.bytes_fetched, 3 * one);
  EXPECT_LE(st.bytes, 2 * one);
  // 2 is still held (by owner 1), 0 is held by owner 2: no room for 3.
  cache.acquire(store.ref(0), 2);
  try {
    cache.acquire(store.ref(3), 3);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("raise cache_bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.stats().shards, 2);
  cache.release_owner(2);  // owner 2 went away: 0 may go
  cache.acquire(store.ref(3), 3);
  held = cache.held();
  EXPECT_EQ(std::set<std::string>(held.begin(), held.end()),
            (std::set<std::string>{store.shards[2].sha256, store.shards[3].sha256}));
  // A shard larger than the whole cache.
  agent::ShardCache tiny(cache_options(dir.path / "tiny", one - 1));
  EXPECT_THROW(tiny.acquire(store.ref(0), 1), IoError);
}

TEST(ShardCache, AMismatchIsFetchedAgainOnceThenFailsNamingTheShard) {
  Store store;
  store.shards.push_back(write_shard(store.src.path, "s.tar", 3, 2));
  auto ref = store.ref(0);
  ref.sha256 = std::string(64, 'f');  // what the manifest says; not what the file is
  TempDir dir;
  agent::ShardCache cache(cache_options(dir.path, 1 << 20));
  try {
    cache.acquire(ref, 1);
    FAIL();
  } catch (const data::FetchError& e) {
    EXPECT_NE(std::string(e.what()).find("does not match its manifest twice"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(ref.url), std::string::npos);
  }
  EXPECT_EQ(cache.stats().failures, 1);
  EXPECT_EQ(cache.stats().shards, 0);
  // Nothing partial is left behind, and the cache still serves.
  for (const auto& e : fs::directory_iterator(dir.path)) EXPECT_NE(e.path().extension(), ".part");
  EXPECT_NO_THROW(cache.acquire(store.ref(0), 1));
}

TEST(ShardCache, KeptAcrossARestartWithItsOrder) {
  Store store;
  for (int i = 0; i < 3; ++i) store.shards.push_back(write_shard(store.src.path, "s" + std::to_string(i) + ".tar", 4, 2, i * 4));
  const std::int64_t one = store.shards[0].bytes;
  TempDir dir;
  {
    agent::ShardCache cache(cache_options(dir.path, 3 * one));
    for (std::size_t i = 0; i < 3; ++i) {
      cache.acquire(store.ref(i), 1);
      cache.release(store.shards[i].sha256, 1);
    }
  }
  // The last uses as file times (what a restart reads): 1 oldest, then 2, then 0.
  const auto now = fs::file_time_type::clock::now();
  for (const auto& [i, age] : {std::pair<std::size_t, int>{1, 30}, {2, 20}, {0, 10}}) {
    fs::last_write_time(dir.path / (store.shards[i].sha256 + ".tar"), now - std::chrono::seconds(age));
  }
  std::ofstream(dir.path / (std::string(64, 'e') + ".part")) << "an unfinished download";
  // Restarted with room for two: the least recently used (1) goes; the .part is removed.
  agent::ShardCache again(cache_options(dir.path, 2 * one));
  auto held = again.held();
  EXPECT_EQ(std::set<std::string>(held.begin(), held.end()),
            (std::set<std::string>{store.shards[0].sha256, store.shards[2].sha256}));
  EXPECT_FALSE(fs::exists(dir.path / (std::string(64, 'e') + ".part")));
  again.acquire(store.ref(2), 1);
  EXPECT_EQ(again.stats().hits, 1);
  EXPECT_EQ(again.stats().fetches, 0);
}

TEST(ShardCache, ManyWorkersAskingAtOnceFetchOnce) {
  Store store;
  store.shards.push_back(write_shard(store.src.path, "s.tar", 50, 2));
  TempDir dir;
  agent::ShardCache cache(cache_options(dir.path, 1 << 20));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back([&, t] { cache.acquire(store.ref(0), t); });
  for (auto& t : threads) t.join();
  const auto st = cache.stats();
  EXPECT_EQ(st.fetches, 1);
  EXPECT_EQ(st.hits + st.misses, 8);
}

TEST(ShardCacheServer, TheWorkersClientOverTheUnixSocket) {
  Store store;
  for (int i = 0; i < 3; ++i) store.shards.push_back(write_shard(store.src.path, "s" + std::to_string(i) + ".tar", 4, 2, i * 4));
  data::Manifest m;
  m.classes = {"even", "odd"};
  m.train.shards = {store.shards[0], store.shards[1]};
  m.train.samples = 8;
  m.test.shards = {store.shards[2]};
  m.test.samples = 4;
  m.channels = 1;
  m.image_size = 1;
  m.mean = {0.5f};
  m.std = {0.5f};
  std::ofstream(store.src.path / data::kManifestName) << data::manifest_json(m).dump();
  TempDir dir;
  agent::ShardCache cache(cache_options(dir.path / "cache", 1 << 20));
  agent::ShardCacheServer server((dir.path / "cache.sock").string(), cache);
  EXPECT_EQ(fs::status(server.path()).permissions() & fs::perms::others_all, fs::perms::none);
  {
    auto client = std::make_shared<data::ShardCacheClient>(server.path());
    // A whole epoch through the reader: worker 1 of 2 reads shard 0 or 1 (4 samples).
    data::ShardReaderOptions o;
    o.data = store.src.path.string();
    o.rank = 1;
    o.workers = 2;
    o.seed = 9;
    data::ShardReader reader(client, o);
    EXPECT_EQ(reader.epoch_samples(), 4);
    reader.start_epoch(0);
    std::shared_ptr<const data::ExampleSource> window;
    std::vector<std::int64_t> order;
    std::int64_t seen = 0;
    while (reader.next_window(window, order)) seen += static_cast<std::int64_t>(order.size());
    EXPECT_EQ(seen, 4);
    EXPECT_EQ(reader.test_set()->size(), 4);
    // One worker, batches of 3: the first window (one shard, 4 samples) hands out 3 and
    // carries 1; the last hands out the other 5. Every sample once.
    data::ShardReaderOptions one = o;
    one.rank = 0;
    one.workers = 1;
    one.batch = 3;
    data::ShardReader whole(client, one);
    whole.start_epoch(1);
    std::vector<std::int64_t> sizes;
    std::multiset<int> labels;
    while (whole.next_window(window, order)) {
      sizes.push_back(static_cast<std::int64_t>(order.size()));
      for (const auto i : order) labels.insert(window->label(i));
    }
    EXPECT_EQ(sizes, (std::vector<std::int64_t>{3, 5}));
    EXPECT_EQ(labels.count(0), 4u);  // samples 0..7, label i % 2
    EXPECT_EQ(labels.count(1), 4u);
    // An unknown shard: the agent's message comes back.
    try {
      client->acquire({(store.src.path / "missing.tar").string(), std::string(64, 'a'), 2048});
      FAIL();
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("missing.tar"), std::string::npos) << e.what();
    }
    bool hit = false;
    client->acquire({(store.src.path / store.shards[2].name).string(), store.shards[2].sha256, store.shards[2].bytes}, &hit);
    EXPECT_TRUE(hit);  // the test split was read
    EXPECT_EQ(cache.stats().pinned, 1);
  }  // the client's connection closes: its holds are dropped
  for (int i = 0; i < 100 && cache.stats().pinned != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(cache.stats().pinned, 0);
  EXPECT_THROW(data::ShardCacheClient((dir.path / "nobody.sock").string()), IoError);
}
