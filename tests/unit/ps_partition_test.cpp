// Partitioning of the flat parameter vector (ps/partition.h) and the SGD a PS shard
// applies (ps/shard_state.h), without sockets.
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/partition.h"
#include "ps/shard_state.h"

using namespace dltrain;
using namespace dltrain::ps;

TEST(Partition, PacksWholeTensorsAndSplitsLargeOnes) {
  // Hand-worked: sizes {3,5,2,10}, P = 6 → [0,3) [3,8) [8,10) [10,15) [15,20).
  auto l = make_layout({3, 5, 2, 10}, 6, 2);
  ASSERT_EQ(l.partitions.size(), 5u);
  const std::int64_t off[] = {0, 3, 8, 10, 15}, len[] = {3, 5, 2, 5, 5};
  for (std::size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(l.partitions[k].key, k);
    EXPECT_EQ(l.partitions[k].offset, off[k]);
    EXPECT_EQ(l.partitions[k].length, len[k]);
  }
  // LPT: keys 1,3,4 (5 each) then 0 (3) then 2 (2) onto the least-loaded shard.
  const int shard[] = {1, 0, 1, 1, 0};
  for (std::size_t k = 0; k < 5; ++k) EXPECT_EQ(l.partitions[k].shard, shard[k]) << "key " << k;
  EXPECT_EQ(l.shard_floats(0), 10);
  EXPECT_EQ(l.shard_floats(1), 10);
  EXPECT_EQ(l.total_floats, 20);
}

TEST(Partition, PacksConsecutiveSmallTensorsTogether) {
  auto l = make_layout({2, 2, 2, 7}, 6, 1);
  ASSERT_EQ(l.partitions.size(), 3u);  // [0,6) [6,10) [10,13) — 7 > 6 splits into 4 + 3
  EXPECT_EQ(l.partitions[0].length, 6);
  EXPECT_EQ(l.partitions[1].length, 4);
  EXPECT_EQ(l.partitions[2].length, 3);
  EXPECT_THROW(make_layout({2, 0}, 6, 1), ConfigError);
  EXPECT_THROW(make_layout({2}, 0, 1), ConfigError);
  EXPECT_THROW(make_layout({2}, 6, 0), ConfigError);
}

TEST(ShardState, AppliesMomentumSgdAsHandComputed) {
  ShardState s(0.5);
  const float x0[] = {1.0f, 2.0f};
  ASSERT_EQ(s.init(3, x0), InitOutcome::kCreated);
  EXPECT_EQ(s.init(3, x0), InitOutcome::kIgnored);  // first init wins
  const float g1[] = {1.0f, -2.0f};
  s.push(3, g1, 0.1f);  // v = [1, -2]; x = [0.9, 2.2]
  const float g2[] = {1.0f, 0.0f};
  s.push(3, g2, 0.1f);  // v = [1.5, -1]; x = [0.75, 2.3]
  float out[2];
  s.pull(3, out);
  EXPECT_NEAR(out[0], 0.75f, 1e-6);
  EXPECT_NEAR(out[1], 2.3f, 1e-6);
  EXPECT_EQ(s.pushes(), 2u);
  const float wrong[] = {1.0f};
  EXPECT_THROW(s.push(3, wrong, 0.1f), ProtocolError);
  EXPECT_THROW(s.push(4, g1, 0.1f), ProtocolError);
  EXPECT_THROW(s.init(3, wrong), ProtocolError);
}

TEST(ShardState, AnOfferThatHasSeenMorePushesRebuildsThePartitionKeepingItsMomentum) {
  ShardState s(0.5);
  const float x0[] = {1.0f, 2.0f};
  ASSERT_EQ(s.init(3, x0), InitOutcome::kCreated);
  EXPECT_EQ(s.partition_pushes(3), 0u);
  const float g1[] = {1.0f, -2.0f};
  s.push(3, g1, 0.1f);  // v = [1, -2]; x = [0.9, 2.2]
  float out[2];
  EXPECT_EQ(s.pull(3, out), 1u);  // the reply says the values have seen 1 push
  // Offers with no more pushes than the partition's 1 change nothing.
  const float stale[] = {7.0f, 7.0f};
  EXPECT_EQ(s.init(3, stale, 0), InitOutcome::kIgnored);
  EXPECT_EQ(s.init(3, stale, 1), InitOutcome::kIgnored);
  s.pull(3, out);
  EXPECT_FLOAT_EQ(out[0], 0.9f);
  // A replica that has seen 5 pushes replaces x; v stays [1, -2], so the next push of
  // g = [0, 0] moves x by −lr·m·v = [−0.05, 0.1]: x = [3.95, 4.1].
  const float fresher[] = {4.0f, 4.0f};
  EXPECT_EQ(s.init(3, fresher, 5), InitOutcome::kRebuilt);
  EXPECT_EQ(s.partition_pushes(3), 5u);
  EXPECT_EQ(s.rebuilds(), 1u);
  const float zero[] = {0.0f, 0.0f};
  s.push(3, zero, 0.1f);
  EXPECT_EQ(s.pull(3, out), 6u);
  EXPECT_NEAR(out[0], 3.95f, 1e-6);
  EXPECT_NEAR(out[1], 4.1f, 1e-6);
  EXPECT_EQ(s.pushes(), 2u);  // pushes applied here; the replica's are not re-counted
  // A NaN is refused like in a push, and the partition is untouched.
  const float nan[] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(s.init(3, nan, 100), ProtocolError);
  EXPECT_EQ(s.partition_pushes(3), 6u);
  EXPECT_THROW(s.partition_pushes(4), ProtocolError);
}

TEST(ShardState, SparsePullsReportThePartitionsPushCount) {
  ShardState s(0.0);
  const float x0[] = {0.0f, 0.0f, 0.0f};
  s.init(1, x0, 10);  // created from a replica that had seen 10 pushes
  float out[3];
  EXPECT_EQ(s.pull(1, out, 0), 10u);
  const std::uint32_t idx[] = {2};
  const float val[] = {1.0f};
  s.push_sparse(1, idx, val, 1.0f);
  std::vector<std::uint32_t> i;
  std::vector<float> v;
  EXPECT_EQ(s.pull_diff(1, 0, 1, i, v), 11u);
  ASSERT_EQ(i, std::vector<std::uint32_t>{2});
  EXPECT_FLOAT_EQ(v[0], -1.0f);
}
