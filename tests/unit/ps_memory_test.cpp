// The PS shard memory the leader computes from a job (planner/ps_memory.h), against
// hand-computed parameter counts and the documented formula.
#include <numeric>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "planner/ps_memory.h"

using namespace dltrain;
using namespace dltrain::planner;

namespace {

std::int64_t total(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

JobSpec sparse_job(ModelKind model, int workers) {
  JobSpec s;
  s.model = model;
  s.channels = 1;
  s.image_size = 28;
  s.workers = workers;
  s.ps_shards = 1;
  s.compression.method = compress::Method::kDgc;
  s.compression.ratio = 0.01;
  s.compression.downlink_ratio = 0.01;
  return s;
}

constexpr std::uint64_t kGiB = 1ull << 30;

}  // namespace

TEST(PsMemory, ModelSizesMatchTheHandCountsOfTrainModels) {
  // The same figures tests/unit/train_test.cpp checks on the LibTorch models.
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kCnn, 1, 10, 28)), 60986);
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kMlp, 1, 10, 28)), 235146);
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kMlpLarge, 1, 10, 28)), 702602);
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kResnet20, 3, 10, 32)), 269722);  // He et al. 2016, Table 6: 0.27M
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kResnet20, 1, 10, 32)), 269722 - 288);
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kResnet18, 3, 1000, 224)), 11689512);  // torchvision's figure
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kResnet18, 3, 10, 64)), 11689512 - 507870);
  EXPECT_EQ(total(model_tensor_sizes(ModelKind::kCnn, 3, 10, 32)), 60986 - 144 + 432 - 36928 + 65600);
  // Order of parameters(): the cnn's first conv (16·1·3·3), then BN γ and β.
  const auto cnn = model_tensor_sizes(ModelKind::kCnn, 1, 10, 28);
  ASSERT_GE(cnn.size(), 3u);
  EXPECT_EQ(cnn[0], 144);
  EXPECT_EQ(cnn[1], 16);
  EXPECT_EQ(cnn[2], 16);
  EXPECT_THROW(model_tensor_sizes(ModelKind::kTorchScript, 1, 10, 28), ConfigError);
  EXPECT_THROW(model_tensor_sizes(ModelKind::kCnn, 1, 10, 7), ConfigError);
}

TEST(PsMemory, ShardStateIsParametersMomentumAndOneXSeenPerSparseWorker) {
  // mlp-large, one shard, dgc (PS momentum 0), sparse pulls, 4 workers:
  // 4 · 702602 · (1 + 4) = 14,052,040 bytes of state, plus the 4·n pull_diff scratch.
  auto m = ps_shard_memory(sparse_job(ModelKind::kMlpLarge, 4), 10);
  EXPECT_EQ(m.model_floats, 702602);
  EXPECT_EQ(m.shard_floats, 702602);
  EXPECT_FALSE(m.momentum_buffer);
  EXPECT_EQ(m.sparse_workers, 4);
  EXPECT_EQ(m.state_bytes, 14052040u);
  // l1's 784·768 = 602,112 weights are cut into 3 partitions of 200,704 floats, the
  // largest; each worker's connection holds two buffers of 4·200,704 bytes.
  EXPECT_EQ(m.largest_partition, 200704);
  EXPECT_EQ(m.connection_bytes, 4u * 8u * 200704u);
  EXPECT_EQ(m.total_bytes, 14052040u + 4u * 702602u + 4u * 8u * 200704u);
  // Dense ASGD with momentum 0.9: parameters and momentum buffer, no x_seen.
  JobSpec dense = sparse_job(ModelKind::kMlpLarge, 64);
  dense.compression = {};
  dense.optimizer.momentum = 0.9;
  m = ps_shard_memory(dense, 10);
  EXPECT_TRUE(m.momentum_buffer);
  EXPECT_EQ(m.sparse_workers, 0);
  EXPECT_EQ(m.state_bytes, 2u * 4u * 702602u);
  EXPECT_EQ(m.total_bytes, m.state_bytes + 64u * 8u * 200704u);
  // BSP through the PS (sync = "sync") stages a step's pushes in one more copy.
  dense.sync = ps::SyncMode::kBsp;
  m = ps_shard_memory(dense, 10);
  EXPECT_TRUE(m.step_accumulator);
  EXPECT_EQ(m.state_bytes, 3u * 4u * 702602u);
  // Method fp16's binary16 downlink sends differences: one x_seen per worker again, the
  // scratch, and each connection's binary16 reply values: 4·n·(1 + 1 + 1 + 64) + 4·n +
  // 64·(8 + 2)·largest partition.
  dense.compression.method = compress::Method::kFp16;
  dense.compression.downlink_ratio = 0;  // "auto", fp16's default
  m = ps_shard_memory(dense, 10);
  EXPECT_EQ(m.sparse_workers, 64);
  EXPECT_EQ(m.state_bytes, 67u * 4u * 702602u);
  EXPECT_EQ(m.connection_bytes, 64u * 10u * 200704u);
  EXPECT_EQ(m.total_bytes, m.state_bytes + 4u * 702602u + 64u * 10u * 200704u);
  // Refused below that, the way out named for fp16.
  const auto why = ps_memory_refusal(dense, m, m.total_bytes - 1);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("method fp16's binary16 downlink"), std::string::npos) << *why;
  EXPECT_NE(why->find("compression.downlink_ratio = 1"), std::string::npos) << *why;
}

TEST(PsMemory, ShardsSplitTheModel) {
  JobSpec s = sparse_job(ModelKind::kMlpLarge, 8);
  s.ps_shards = 4;
  const auto m = ps_shard_memory(s, 10);
  EXPECT_EQ(m.model_floats, 702602);
  // Four shards hold at least a quarter each and the largest less than the whole.
  EXPECT_GE(m.shard_floats, (702602 + 3) / 4);
  EXPECT_LT(m.shard_floats, 702602);
  EXPECT_EQ(m.state_bytes, 4u * static_cast<std::uint64_t>(m.shard_floats) * 9u);
}

TEST(PsMemory, RefusesTheWorkerCountWhoseXSeenOutgrowsTheLimit) {
  // resnet18, 10 classes: n = 11,181,642 floats on one shard, 4n = 44,726,568 bytes per
  // x_seen; its 512·512·9 convolutions are cut into partitions of 262,144 floats, so
  // each worker's connection adds 8·262,144 = 2,097,152 bytes. 16 GiB = 17,179,869,184
  // holds 4n·(1 + 1 scratch) + W·(4n + 2,097,152) for W ≤ 364 (365: 17,180,110,936).
  JobSpec s = sparse_job(ModelKind::kResnet18, 364);
  s.channels = 3;
  s.image_size = 64;
  auto m = ps_shard_memory(s, 10);
  EXPECT_EQ(m.shard_floats, 11181642);
  EXPECT_EQ(m.largest_partition, 262144);
  EXPECT_EQ(m.total_bytes, 8ull * 11181642 + 364ull * (4ull * 11181642 + 2097152));  // 17,133,287,216
  EXPECT_EQ(ps_memory_refusal(s, m, 16 * kGiB), std::nullopt);
  s.workers = 365;
  m = ps_shard_memory(s, 10);
  const auto why = ps_memory_refusal(s, m, 16 * kGiB);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("at most 364 workers fit"), std::string::npos) << *why;
  EXPECT_NE(why->find("ps_shards"), std::string::npos) << *why;
  EXPECT_NE(why->find("compression.downlink_ratio"), std::string::npos) << *why;
  EXPECT_NE(why->find("memory_mb"), std::string::npos) << *why;
  // Dense pulls keep no x_seen: the same job fits.
  s.compression.downlink_ratio = 1.0;
  EXPECT_EQ(ps_memory_refusal(s, ps_shard_memory(s, 10), 16 * kGiB), std::nullopt);
}

TEST(PsMemory, ImageFolderClassesAreTheTrainFolders) {
  JobSpec s;
  s.dataset = DatasetKind::kFashionMnist;
  EXPECT_EQ(dataset_classes(s), 10);
  s.dataset = DatasetKind::kImageFolder;
  s.data_dir = "/nonexistent-dltrain-dir";
  EXPECT_THROW(dataset_classes(s), ConfigError);
}

TEST(PsMemory, ModelPartitionsBoundTheShardsThatHoldSome) {
  // mlp-large on 28x28x1: 784·768 = 602,112 weights, over the 262,144-float partitions,
  // are cut in ceil(602112 / 262144) = 3 pieces; the rest (768 + 768·128 + 128 + 128·10 +
  // 10 = 100,490) packs into one: 4 partitions.
  auto s = sparse_job(ModelKind::kMlpLarge, 4);
  EXPECT_EQ(model_partitions(s, 10), 4);
  // With partitions of 100,490 floats the rest is still one partition and the weights
  // are cut in ceil(602112 / 100490) = 6: 7.
  s.partition_size = 100490;
  EXPECT_EQ(model_partitions(s, 10), 7);
  s.model = ModelKind::kTorchScript;
  EXPECT_THROW(model_partitions(s, 10), ConfigError);
  // partition_size = "auto": the partitions of the least size the leader may choose,
  // 16,384 floats: the weights in ceil(602112 / 16384) = 37, the 768 biases alone, the
  // 98,304 weights in 6, the rest (128 + 1,280 + 10) in one: 45.
  s.model = ModelKind::kMlpLarge;
  s.partition_size = 262144;
  s.partition_size_auto = true;
  EXPECT_EQ(model_partitions(s, 10), 45);
}

TEST(PsMemory, BalancedPartitionSizeKeepsTheDefaultWhenItIsEvenAndCutsWhenItIsNot) {
  const std::vector<std::int64_t> mlp_large = model_tensor_sizes(ModelKind::kMlpLarge, 1, 10, 28);
  // 4 shards: the default's partitions (3 × 200,704 and 100,490, above) put 200,704 on
  // the busiest shard, within 1.15 × 702602 / 4 = 201,998.1 of even: kept.
  EXPECT_EQ(balanced_partition_size(mlp_large, 4, 262144), 262144);
  // 8 shards: 200,704 against 1.15 × 87,825.25 = 100,999.0: not even. ceil(702602 / 8) =
  // 87,826 cuts the weights in 7 × 86,016, leaves the 768 biases alone, cuts 98,304 in
  // 2 × 49,152, and packs 1,418; LPT: seven shards get 86,016, the eighth both 49,152s
  // (98,304, the busiest), 1,418 and 768 go to two of the seven: within the bound.
  EXPECT_EQ(balanced_partition_size(mlp_large, 8, 262144), 87826);
  // The cnn (60,986 floats, one default partition) on 2 shards: 60,986 > 1.15 × 30,493.
  // ceil(60986 / 2) = 30,493 packs 144 + 16 + 16 + 4,608 + 32 + 32 + 18,432 + 64 + 64 =
  // 23,408, cuts 36,864 in 2 × 18,432, packs 64 + 640 + 10 = 714; LPT puts both 18,432s
  // on one shard: 36,864 > 35,066.95. ceil(60986 / 4) = 15,247, raised to the floor
  // 16,384: 4,848 | 18,432 in 2 × 9,216 | 64 + 64 | 36,864 in 3 × 12,288 | 714, LPT over
  // 2 shards: 30,266 and 30,720: even.
  const std::vector<std::int64_t> cnn = model_tensor_sizes(ModelKind::kCnn, 1, 10, 28);
  EXPECT_EQ(balanced_partition_size(cnn, 2, 262144), 16384);
  // Only the third cut is even: three tensors of 100,000 on 2 shards (even: 150,000,
  // bound 172,500). 262,144 packs 200,000 | 100,000; 150,000 gives 100,000 × 3: both put
  // 200,000 on a shard. 75,000 cuts each in 2 × 50,000: 150,000 a shard.
  EXPECT_EQ(balanced_partition_size({100000, 100000, 100000}, 2, 262144), 75000);
  // Even enough but a shard left empty: seven tensors of 200,000 on 8 shards. 262,144
  // gives 7 partitions (busiest 200,000 <= 1.15 × 175,000) and an empty eighth shard;
  // ceil(1400000 / 8) = 175,000 cuts each in 2 × 100,000: 14 partitions, two shards
  // with one (100,000), six with two (200,000): every shard holds some, within the bound.
  EXPECT_EQ(balanced_partition_size(std::vector<std::int64_t>(7, 200000), 8, 262144), 175000);
  // Nothing is even (one tensor of 1,000 floats on 4 shards): every candidate leaves it
  // whole on one shard; the larger, the default, is kept.
  EXPECT_EQ(balanced_partition_size({1000}, 4, 262144), 262144);
  // A job's own partition_size is where the candidates start: none is larger.
  EXPECT_EQ(balanced_partition_size({60000}, 4, 20000), 16384);  // 60,000 in 4 × 15,000
  EXPECT_EQ(balanced_partition_size({60000}, 1, 262144), 262144);
  EXPECT_THROW(balanced_partition_size({60000}, 0, 262144), ConfigError);
  // auto_partition_size reads the job: the cnn on its ps_shards.
  auto s = sparse_job(ModelKind::kCnn, 2);
  s.ps_shards = 2;
  EXPECT_EQ(auto_partition_size(s, 10), 16384);
  s.model = ModelKind::kTorchScript;
  EXPECT_THROW(auto_partition_size(s, 10), ConfigError);
}
