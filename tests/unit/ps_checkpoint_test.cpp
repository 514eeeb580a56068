// Checkpoints of a PS shard's state and of a worker's replica (ps/checkpoint.h), and the
// checkpoint a shard writes before it acknowledges a finished worker.
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "support/ps_shards.h"
#include "support/temp_dir.h"

using namespace dltrain;
using namespace dltrain::ps;
using dltrain::testing::kSecret;

namespace {

std::vector<std::byte> slurp_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// The reason a checkpoint file is refused ("" when it is accepted).
std::string refusal(const std::filesystem::path& p, std::uint64_t job = 42, std::uint32_t shard = 3) {
  try {
    read_checkpoint_file(p.string(), job, shard);
    return "";
  } catch (const ProtocolError& e) {
    return e.what();
  }
}

// A shard state with momentum 0.5: partition 7 = {1, 2} after one push of g = {1, -2}
// at lr 0.1 (v = {1, -2}, x = {0.9, 2.2}); partition 9 = {5, 6, 7} untouched; worker 1
// finished.
std::shared_ptr<ShardState> sample_state() {
  auto s = std::make_shared<ShardState>(0.5);
  const float a[] = {1.0f, 2.0f}, b[] = {5.0f, 6.0f, 7.0f}, g[] = {1.0f, -2.0f};
  s->init(7, a);
  s->init(9, b);
  s->push(7, g, 0.1f);
  s->mark_done(1);
  return s;
}

}  // namespace

TEST(Checkpoint, RoundTripRestoresParametersMomentumAndFinishedWorkers) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  ShardCheckpointer cp(path.string(), 42, 3, sample_state());
  ASSERT_TRUE(cp.save());
  EXPECT_EQ(cp.saves(), 1u);
  // Size by hand: 40-byte header, one finished rank (4), partition 7: 24 + 4·(2 + 2),
  // partition 9: 24 + 4·(3 + 3), CRC 4.
  const auto bytes = slurp_bytes(path);
  EXPECT_EQ(bytes.size(), 40u + 4 + (24 + 16) + (24 + 24) + 4);
  EXPECT_EQ(cp.last_bytes(), bytes.size());
  EXPECT_EQ(std::memcmp(bytes.data(), "DLCK", 4), 0);
  // The trailer is zlib's CRC-32 of everything before it.
  std::uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(crc, crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  // No temporary file is left behind.
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));

  auto snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  ShardState restored(0.5);
  restored.restore(std::move(*snap));
  EXPECT_EQ(restored.num_partitions(), 2u);
  EXPECT_EQ(restored.pushes(), 1u);
  EXPECT_EQ(restored.done_count(), 1u);
  EXPECT_EQ(restored.partition_pushes(7), 1u);  // what a resyncing replica is compared with
  EXPECT_EQ(restored.partition_pushes(9), 0u);
  EXPECT_EQ(restored.mark_done(1), 1u);  // the same worker again: still one
  float x7[2], x9[3];
  restored.pull(7, x7);
  restored.pull(9, x9);
  EXPECT_FLOAT_EQ(x7[0], 0.9f);
  EXPECT_FLOAT_EQ(x7[1], 2.2f);
  EXPECT_FLOAT_EQ(x9[0], 5.0f);
  EXPECT_FLOAT_EQ(x9[1], 6.0f);
  EXPECT_FLOAT_EQ(x9[2], 7.0f);
  // The momentum buffer came back too: g = {1, 0} at lr 0.1 gives v = 0.5·{1, -2} + {1, 0}
  // = {1.5, -1} and x = {0.9 − 0.15, 2.2 + 0.1} = {0.75, 2.3}.
  const float g2[] = {1.0f, 0.0f};
  restored.push(7, g2, 0.1f);
  restored.pull(7, x7);
  EXPECT_NEAR(x7[0], 0.75f, 1e-6);
  EXPECT_NEAR(x7[1], 2.3f, 1e-6);
  // A shard with another momentum setting refuses the state rather than misapply it.
  auto again = read_checkpoint_file(path.string(), 42, 3);
  ShardState no_momentum(0.0);
  EXPECT_THROW(no_momentum.restore(std::move(*again)), ProtocolError);
}

TEST(Checkpoint, AVersion1FileIsReadWithTheShardsPushCountForEveryPartition) {
  // Version 1 by hand: header (magic, version 1, flags 0, job 42, shard 3, 1 partition,
  // 0 finished, reserved 0, 9 pushes), partition 5 with a 16-byte header (key, 2 values,
  // no momentum, reserved 0), the values {1.5, -2}, then zlib's CRC-32.
  std::vector<std::byte> b;
  auto put = [&b](auto v) {
    const auto at = b.size();
    b.resize(at + sizeof v);
    std::memcpy(b.data() + at, &v, sizeof v);
  };
  put(kCheckpointMagic);
  put(std::uint16_t{1});
  put(std::uint16_t{0});
  put(std::uint64_t{42});
  put(std::uint32_t{3});
  put(std::uint32_t{1});
  put(std::uint32_t{0});
  put(std::uint32_t{0});
  put(std::uint64_t{9});
  put(std::uint32_t{5});
  put(std::uint32_t{2});
  put(std::uint32_t{0});
  put(std::uint32_t{0});
  put(1.5f);
  put(-2.0f);
  put(static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(b.size()))));
  const auto snap = decode_checkpoint(b, 42, 3);
  ASSERT_EQ(snap.partitions.size(), 1u);
  EXPECT_EQ(snap.pushes, 9u);
  EXPECT_EQ(snap.partitions[0].key, 5u);
  EXPECT_EQ(snap.partitions[0].x, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(snap.partitions[0].pushes, 9u);  // the shard's total: an upper bound
  // A version this build does not know is refused with both numbers.
  b[4] = std::byte{3};
  try {
    decode_checkpoint(b, 42, 3);
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("format version 3, this build reads 1 to 2"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, NoFileMeansNoCheckpointAndAnEmptyStateIsNotWritten) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  EXPECT_FALSE(read_checkpoint_file(path.string(), 42, 3).has_value());
  ShardCheckpointer cp(path.string(), 42, 3, std::make_shared<ShardState>(0.9));
  EXPECT_FALSE(cp.save());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Checkpoint, TruncatedAndCorruptedFilesAreRefusedWithTheReason) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  ShardCheckpointer cp(path.string(), 42, 3, sample_state());
  ASSERT_TRUE(cp.save());
  const auto good = slurp_bytes(path);
  EXPECT_EQ(refusal(path), "");

  auto cut = good;
  cut.resize(good.size() - 1);  // the last byte of the CRC missing
  write_bytes(path, cut);
  EXPECT_NE(refusal(path).find("checksum mismatch"), std::string::npos) << refusal(path);
  cut.resize(20);  // not even a header
  write_bytes(path, cut);
  EXPECT_NE(refusal(path).find("(truncated)"), std::string::npos) << refusal(path);
  write_bytes(path, {});
  EXPECT_NE(refusal(path).find("(truncated)"), std::string::npos) << refusal(path);

  auto flipped = good;
  flipped[40 + 4 + 24 + 1] ^= std::byte{0x01};  // one bit of partition 7's first value
  write_bytes(path, flipped);
  EXPECT_NE(refusal(path).find("checksum mismatch"), std::string::npos) << refusal(path);
  flipped = good;
  flipped[0] ^= std::byte{0xFF};
  write_bytes(path, flipped);
  EXPECT_NE(refusal(path).find("not a dltrain PS checkpoint"), std::string::npos) << refusal(path);

  write_bytes(path, good);
  EXPECT_NE(refusal(path, 43, 3).find("written by shard 3 of job 42, this is shard 3 of job 43"), std::string::npos)
      << refusal(path, 43, 3);
  EXPECT_NE(refusal(path, 42, 0).find("this is shard 0 of job 42"), std::string::npos);
}

TEST(Checkpoint, LengthsAreCheckedAgainstTheFileBeforeAnyAllocation) {
  // A file whose checksum is right but whose lengths lie: a partition of 2^26 values in
  // a 100-byte file, and 2^31 partitions. Each is refused with the reason, nothing huge
  // is allocated.
  auto with_crc = [](std::vector<std::byte> b) {
    const auto crc = static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data()),
                                                      static_cast<uInt>(b.size())));
    b.resize(b.size() + 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  auto bytes = encode_checkpoint(ShardSnapshot{{{5, {1.0f, 2.0f}, {}}}, {}, 0}, 42, 3);
  bytes.resize(bytes.size() - 4);  // without its CRC
  auto huge = bytes;
  const std::uint32_t n = 1u << 26;
  std::memcpy(huge.data() + 40 + 4, &n, 4);  // partition length
  try {
    decode_checkpoint(with_crc(huge), 42, 3);
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("partition 5: 268435456 bytes of values, only 8 left"), std::string::npos)
        << e.what();
  }
  auto many = bytes;
  const std::uint32_t parts = 1u << 31;
  std::memcpy(many.data() + 20, &parts, 4);
  try {
    decode_checkpoint(with_crc(many), 42, 3);
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("2147483648 partitions do not fit in the 32 bytes left"), std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, AStaleTemporaryFileDoesNotBreakLoadingOrTheNextSave) {
  // A crash between writing the temporary file and renaming it leaves "<path>.tmp"
  // behind, possibly half written; the checkpoint at <path> is the previous one.
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  auto state = sample_state();
  ShardCheckpointer cp(path.string(), 42, 3, state);
  ASSERT_TRUE(cp.save());
  write_bytes(path.string() + ".tmp", std::vector<std::byte>(1000, std::byte{0xAB}));
  auto snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->partitions.size(), 2u);
  // The next save overwrites the stale file and renames it into place.
  state->mark_done(0);
  ASSERT_TRUE(cp.save());
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  snap = read_checkpoint_file(path.string(), 42, 3);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->done, (std::vector<std::uint32_t>{0, 1}));
}

TEST(Checkpoint, AFinishedWorkerIsCheckpointedBeforeItsDoneIsAcknowledged) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  auto state = std::make_shared<ShardState>(0.9);
  auto cp = std::make_shared<ShardCheckpointer>(path.string(), 42, 0, state);
  PsServerOptions o;
  o.bind_address = "127.0.0.1";
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  o.on_done = [cp] { cp->save(); };
  PsServer server(o, state);
  server.start();
  PsClientOptions co;
  co.job = 42;
  co.generation = 1;
  co.secret = kSecret;
  co.rank = 1;
  co.num_workers = 2;
  co.timeout = std::chrono::milliseconds(5000);
  PsClient c(std::vector<PsEndpoint>{{"127.0.0.1", server.port()}}, make_layout({4}, 4, 1), co);
  c.connect();
  c.init(std::vector<float>{1, 2, 3, 4});
  EXPECT_EQ(c.done(), 1u);
  // By the time the acknowledgement arrived, the file said so.
  auto snap = read_checkpoint_file(path.string(), 42, 0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->done, std::vector<std::uint32_t>{1});
}

// A worker's replica: every partition of the layout in the checkpoint format (shard
// kWorkerReplicaShard, no momentum), read back into the same places of the flat vector.
TEST(WorkerReplica, RoundTripPutsEveryPartitionBackAtItsOffset) {
  dltrain::testing::TempDir dir;
  const auto path = (dir.path / "replica.ckpt").string();
  // Tensors of 3, 2 and 5 floats, partitions of at most 4 floats over 2 shards:
  // {3}, {2}, and the 5 cut into 3 + 2.
  const auto layout = make_layout({3, 2, 5}, 4, 2);
  ASSERT_EQ(layout.total_floats, 10);
  ASSERT_EQ(layout.partitions.size(), 4u);
  std::vector<float> params(10);
  for (int i = 0; i < 10; ++i) params[i] = 0.5f * static_cast<float>(i) - 1.0f;
  write_replica_file(path, params, layout, 42, 1234);
  // Size by hand: 40-byte header, 4 partitions of 24 + 4·length, CRC 4.
  EXPECT_EQ(std::filesystem::file_size(path), 40u + 4 * 24 + 4 * 10 + 4);
  std::vector<float> back(10, -7.0f);
  EXPECT_EQ(read_replica_file(path, back, layout, 42), 1234u);
  EXPECT_EQ(back, params);
}

TEST(WorkerReplica, AnotherJobOrModelOrAMissingFileIsRefusedWithTheReason) {
  dltrain::testing::TempDir dir;
  const auto path = (dir.path / "replica.ckpt").string();
  const auto layout = make_layout({3, 2, 5}, 4, 2);
  std::vector<float> params(10, 1.0f);
  write_replica_file(path, params, layout, 42, 7);
  try {
    read_replica_file(path, params, layout, 43);
    FAIL() << "another job's replica was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("of job 42, this is shard 4294967295 of job 43"), std::string::npos)
        << e.what();
  }
  const auto other = make_layout({3, 2, 5}, 8, 1);  // the same floats, other partitions
  std::vector<float> into(10);
  try {
    read_replica_file(path, into, other, 42);
    FAIL() << "a replica of another partitioning was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("partitions, the job's model has"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_replica_file((dir.path / "none").string(), into, layout, 42), IoError);
  std::vector<float> wrong(9);
  EXPECT_THROW(write_replica_file(path, wrong, layout, 42, 0), ConfigError);
}

// replica_into, the check of a replica against the job's layout that tests/fuzz/
// fuzz_checkpoint.cpp drives: it copies nothing unless every partition fits (it used to
// copy partition by partition while checking).
TEST(WorkerReplica, AReplicaThatDoesNotFitTheLayoutCopiesNothing) {
  const auto layout = make_layout({3, 2}, 4, 1);  // partitions 0 = {3}, 1 = {2}
  ShardSnapshot snap;
  snap.pushes = 5;
  snap.partitions = {{0, {1, 2, 3}, {}}, {1, {4, 5, 6}, {}}};  // partition 1 has 3 values, not 2
  std::vector<float> params(5, -1.0f);
  EXPECT_THROW(replica_into(snap, params, layout), ProtocolError);
  EXPECT_EQ(params, std::vector<float>(5, -1.0f));
  snap.partitions = {{0, {1, 2, 3}, {}}, {0, {4, 5}, {}}};  // key 0 twice, 1 missing
  EXPECT_THROW(replica_into(snap, params, layout), ProtocolError);
  EXPECT_EQ(params, std::vector<float>(5, -1.0f));
  snap.partitions = {{0, {1, 2, 3}, {}}, {1, {4, 5}, {}}};
  EXPECT_EQ(replica_into(snap, params, layout), 5u);
  EXPECT_EQ(params, (std::vector<float>{1, 2, 3, 4, 5}));
}
