// Models, the learning-rate schedule and the worker step (LibTorch).
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "compress/fp16.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "data/idx.h"
#include "train/models.h"
#include "train/tensors.h"
#include "train/trainer.h"

using namespace dltrain;
using namespace dltrain::train;

namespace {

// One worker (spec.workers = 1) trained against a real PS shard on loopback: the shard's
// final state, the worker's events and the shard's barrier record.
struct OneWorkerRun {
  ps::ShardSnapshot snap;
  std::vector<nlohmann::json> events;
  ps::SyncStats sync;
  double accuracy = -1;  ///< run_worker's result
};

OneWorkerRun run_against_one_shard(const JobSpec& spec, double shard_momentum, std::uint64_t job,
                                   ps::SyncMode mode = ps::SyncMode::kAsync) {
  const std::vector<std::uint8_t> secret(32, static_cast<std::uint8_t>(0x50 + job));
  auto state = std::make_shared<ps::ShardState>(shard_momentum);
  ps::PsServerOptions so;
  so.bind_address = "127.0.0.1";
  so.job = job;
  so.generation = 1;
  so.secret = secret;
  so.sync.mode = mode;
  ps::PsServer server(so, state);
  server.start();
  WorkerConfig cfg;
  cfg.spec = spec;
  cfg.job = job;
  cfg.generation = 1;
  cfg.secret = secret;
  cfg.shards = {{"127.0.0.1", server.port()}};
  cfg.ps_timeout = std::chrono::seconds(20);
  cfg.finish_timeout = std::chrono::seconds(30);
  cfg.progress_interval_s = 1e9;
  OneWorkerRun r;
  r.accuracy = run_worker(cfg, [&](const nlohmann::json& e) { r.events.push_back(e); });
  server.stop();
  r.snap = state->snapshot();
  r.sync = server.sync_stats();
  return r;
}

// What a worker of `spec` starts from, rebuilt by hand as dltrain-worker seeds it, to
// replay its steps: the training images and labels, the model initialised from the
// job's seed (in training mode) and the first epoch's order of the images.
struct HandReplica {
  torch::Tensor x, y;
  Model model;
  torch::Tensor order;
};
HandReplica hand_replica(const JobSpec& spec) {
  data::Split train = data::load_split(spec.data_dir, "train", spec.train_samples);
  auto [x, y] = to_tensors(train, spec.dataset);
  torch::manual_seed(static_cast<std::uint64_t>(spec.seed));
  Model model = make_model(spec.model);
  model.module->train(true);
  auto gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(spec.seed) * 1000003ULL);
  auto order = torch::randperm(x.size(0), gen, torch::kInt64);
  return HandReplica{x, y, std::move(model), order};
}

// The largest absolute difference between a shard's parameters and `params` (the model's
// tensors in order, cut into partitions of at most `partition_size` floats on one
// shard as the worker cuts them); infinity, with a failed expectation, when the
// partitions do not match.
double largest_difference(const ps::ShardSnapshot& snap, const std::vector<torch::Tensor>& params,
                          std::int64_t partition_size) {
  std::vector<float> expected;
  std::vector<std::int64_t> sizes;
  for (const auto& t : params) {
    auto c = t.contiguous();
    expected.insert(expected.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    sizes.push_back(t.numel());
  }
  const auto layout = ps::make_layout(sizes, partition_size, 1);
  EXPECT_EQ(snap.partitions.size(), layout.partitions.size());
  if (snap.partitions.size() != layout.partitions.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (const auto& part : snap.partitions) {
    const auto& lp = layout.partitions[part.key];
    for (std::int64_t i = 0; i < lp.length; ++i) {
      worst = std::max(worst, std::abs(double(part.x[i]) - double(expected[lp.offset + i])));
    }
  }
  return worst;
}

// The small job the worker-step tests run: the MLP on 256 training images (8 steps of 32
// per epoch), `steps` steps, one epoch, one worker and shard, constant learning rate.
JobSpec small_mlp_job(std::int64_t steps, std::int64_t seed) {
  JobSpec spec;
  spec.model = ModelKind::kMlp;
  spec.epochs = 1;
  spec.workers = 1;
  spec.ps_shards = 1;
  spec.batch_size = 32;
  spec.train_samples = 256;
  spec.test_samples = 200;
  spec.max_steps = steps;
  spec.seed = seed;
  spec.optimizer.lr_schedule = LrSchedule::kConstant;
  spec.optimizer.warmup_epochs = 0;
  return spec;
}

// small_mlp_job as plain SGD: lr 0.1, no momentum, no weight decay — the steps the
// worker-step tests replay by hand with LibTorch.
JobSpec plain_sgd_job(std::int64_t steps, std::int64_t seed) {
  JobSpec spec = small_mlp_job(steps, seed);
  spec.optimizer.lr = 0.1;
  spec.optimizer.momentum = 0;
  spec.optimizer.weight_decay = 0;
  return spec;
}

}  // namespace

TEST(Models, ParameterCountsMatchTheArchitecture) {
  // CNN: conv 1→16 (144), BN 16 (32), conv 16→32 (4608), BN (64), conv 32→64 (18432),
  // BN (128), FC 576→64 (36928), FC 64→10 (650) = 60986.
  auto cnn = make_model(ModelKind::kCnn);
  EXPECT_EQ(parameter_count(*cnn.module), 60986);
  // MLP: 784·256+256 + 256·128+128 + 128·10+10 = 235146.
  auto mlp = make_model(ModelKind::kMlp);
  EXPECT_EQ(parameter_count(*mlp.module), 235146);
  // Large MLP: 784·768+768 + 768·128+128 + 128·10+10 = 702602.
  EXPECT_EQ(parameter_count(*make_model(ModelKind::kMlpLarge).module), 702602);
  EXPECT_THROW(make_model(ModelKind::kTorchScript), ConfigError);  // loaded from its file, never built
  auto out = cnn.forward(torch::zeros({3, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<std::int64_t>{3, 10}));
}

TEST(Models, ResNetParameterCountsMatchThePublishedFigures) {
  // resnet20, option A shortcuts (no parameters): stem 3·16·9 = 432 + BN 32; stage 1:
  // 6 convs 16·16·9 = 13,824 + BN 192; stage 2: 16·32·9 + 5·32·32·9 = 50,688 + BN 384;
  // stage 3: 32·64·9 + 5·64·64·9 = 202,752 + BN 768; FC 64·10 + 10 = 650. Sum 269,722:
  // He et al. 2016, Table 6, "0.27M".
  auto r20 = make_model(ModelKind::kResnet20, 3, 10, 32);
  EXPECT_EQ(parameter_count(*r20.module), 269722);
  EXPECT_NEAR(parameter_count(*r20.module) / 1e6, 0.27, 0.005);
  // One input channel: the stem loses 2·16·9 = 288.
  EXPECT_EQ(parameter_count(*make_model(ModelKind::kResnet20, 1, 10, 32).module), 269722 - 288);
  // resnet18 for 3 channels and 1,000 classes: torchvision's published 11,689,512; for 10
  // classes the FC shrinks by 990·512 + 990 = 507,870.
  EXPECT_EQ(parameter_count(*make_model(ModelKind::kResnet18, 3, 1000, 224).module), 11689512);
  EXPECT_EQ(parameter_count(*make_model(ModelKind::kResnet18, 3, 10, 64).module), 11689512 - 507870);
  // The CNN on a 32×32 RGB input: conv1 3·16·9 = 432 and FC 64·4·4·64 + 64 = 65,600.
  EXPECT_EQ(parameter_count(*make_model(ModelKind::kCnn, 3, 10, 32).module), 60986 - 144 + 432 - 36928 + 65600);
}

TEST(Models, ResNetsForwardAndBackward) {
  torch::manual_seed(3);
  for (const auto& [name, size] : std::vector<std::pair<ModelKind, int>>{{ModelKind::kResnet20, 32}, {ModelKind::kResnet18, 64}}) {
    auto m = make_model(name, 3, 7, size);
    auto x = torch::randn({4, 3, size, size});
    auto y = torch::tensor({0, 1, 2, 6}, torch::kInt64);
    auto out = m.forward(x);
    ASSERT_EQ(out.sizes(), (std::vector<std::int64_t>{4, 7})) << enum_name(name);
    auto loss = torch::nn::functional::cross_entropy(out, y);
    // Random initial weights over 7 classes: the loss is near ln 7 = 1.95.
    EXPECT_GT(loss.item<double>(), 0.5) << enum_name(name);
    EXPECT_LT(loss.item<double>(), 6.0) << enum_name(name);
    loss.backward();
    for (const auto& p : m.module->parameters()) {
      ASSERT_TRUE(p.grad().defined()) << enum_name(name);
      EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << enum_name(name);
    }
    // The option-A shortcut carries the input: a stride-2 block's output depends on it.
    EXPECT_GT(m.module->parameters().front().grad().abs().sum().item<double>(), 0.0) << enum_name(name);
  }
}

TEST(Models, SameSeedGivesIdenticalReplicas) {
  torch::manual_seed(5);
  auto a = make_model(ModelKind::kCnn);
  torch::manual_seed(5);
  auto b = make_model(ModelKind::kCnn);
  auto pa = a.module->parameters(), pb = b.module->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

TEST(LearningRate, WarmupThenCosineAsHandComputed) {
  OptimizerSpec o;
  o.lr = 0.1;
  o.warmup_epochs = 1.0;
  o.lr_schedule = LrSchedule::kCosine;
  EXPECT_NEAR(learning_rate(o, 0.0, 5), 0.01, 1e-12);   // lr/10 at the start
  EXPECT_NEAR(learning_rate(o, 0.5, 5), 0.055, 1e-12);  // halfway through warm-up
  EXPECT_NEAR(learning_rate(o, 1.0, 5), 0.1, 1e-12);    // cosine starts at the peak
  EXPECT_NEAR(learning_rate(o, 3.0, 5), 0.05, 1e-12);   // half of the cosine span
  EXPECT_NEAR(learning_rate(o, 5.0, 5), 0.0, 1e-12);
  o.warmup_epochs = 0;
  o.lr_schedule = LrSchedule::kStep;
  EXPECT_NEAR(learning_rate(o, 2.4, 5), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 2.5, 5), 0.01, 1e-12);
  EXPECT_NEAR(learning_rate(o, 4.0, 5), 0.001, 1e-12);
  o.lr_schedule = LrSchedule::kConstant;
  EXPECT_NEAR(learning_rate(o, 4.0, 5), 0.1, 1e-12);
}

// The worker step on a tiny model against a real PS shard over loopback: one worker,
// dense ASGD, PS momentum 0, constant learning rate and no weight decay is plain SGD, so
// the shard's parameters after three steps must be those of three SGD steps computed here
// with LibTorch directly — the same seeded initialisation, the same seeded batch order.
TEST(WorkerStep, OneWorkerAgainstAPsShardTakesTheSgdStepsComputedWithLibTorch) {
  const JobSpec spec = plain_sgd_job(3, 7);
  const auto run = run_against_one_shard(spec, 0.0, 5);
  const auto& evs = run.events;
  const double acc = run.accuracy;
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs.front()["event"], "started");
  EXPECT_EQ(evs.front()["train_examples"], 256);
  EXPECT_EQ(evs.front()["steps_per_epoch"], 8);
  EXPECT_EQ(evs[evs.size() - 2]["event"], "epoch_end");
  EXPECT_EQ(evs.back()["event"], "done");
  EXPECT_EQ(evs.back()["steps"], 3);
  EXPECT_DOUBLE_EQ(evs.back()["test_accuracy"].get<double>(), acc);
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
  // Dense ASGD sends what a dense exchange costs: a compression ratio of 1 (to within
  // frame headers, which are a few dozen bytes per ~100k floats).
  EXPECT_NEAR(evs.back()["compression_ratio"].get<double>(), 1.0, 0.05);

  // The same three steps by hand.
  auto [x, y, ref, perm] = hand_replica(spec);
  for (int step = 0; step < 3; ++step) {
    auto idx = perm.slice(0, step * 32, step * 32 + 32);
    ref.module->zero_grad();
    torch::nn::functional::cross_entropy(ref.forward(x.index_select(0, idx)), y.index_select(0, idx)).backward();
    torch::NoGradGuard ng;
    for (auto& p : ref.module->parameters()) p.sub_(p.grad() * 0.1f);
  }
  EXPECT_EQ(run.snap.pushes, 3u);
  EXPECT_LT(largest_difference(run.snap, ref.module->parameters(), spec.partition_size), 1e-5)
      << "largest difference from the LibTorch SGD steps";
}

// Method fp16 both ways (docs/compression.md, "Downlink (PS)"): each step pushes binary16
// with error feedback and pulls the binary16 difference from what the worker holds, so
// against the same job in dense fp32 it moves 2 bytes a float less each way per step (the
// first pull and the evaluation's stay fp32), and the shard ends where the same three
// steps computed here with LibTorch and the binary16 rounding by hand end: uplink
// v += g, h = fp16(v), v −= h, x −= lr·h; downlink d = x − x_seen, x_seen and the
// replica += fp16(d), the next gradient taken at the replica.
TEST(WorkerStep, Fp16JobPushesAndPullsHalfTheBytesAndTakesTheStepsComputedByHand) {
  JobSpec spec = plain_sgd_job(3, 7);
  const auto dense = run_against_one_shard(spec, 0.0, 8);
  spec.compression.method = compress::Method::kFp16;
  spec.compression.downlink_ratio = 0;  // "auto", what a job file's method = "fp16" gets
  const auto half = run_against_one_shard(spec, 0.0, 9);
  const auto& d = dense.events.back();
  const auto& h = half.events.back();
  ASSERT_EQ(d["event"], "done");
  ASSERT_EQ(h["event"], "done");
  ASSERT_EQ(h["steps"], 3);
  const std::int64_t n = 235146;  // the MLP's floats, one partition
  EXPECT_EQ(d["bytes_pulled"].get<std::int64_t>() - h["bytes_pulled"].get<std::int64_t>(), 3 * 2 * n);
  EXPECT_EQ(d["bytes_pushed"].get<std::int64_t>() - h["bytes_pushed"].get<std::int64_t>(), 3 * 2 * n);

  auto [x, y, ref, perm] = hand_replica(spec);
  auto params = ref.module->parameters();
  const auto flat = [&](bool grad) {
    std::vector<float> out;
    for (const auto& p : params) {
      auto c = (grad ? p.grad() : p).contiguous();
      out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    return out;
  };
  std::vector<float> shard = flat(false), seen = shard, v(shard.size(), 0.0f);
  ASSERT_EQ(static_cast<std::int64_t>(shard.size()), n);
  for (int step = 0; step < 3; ++step) {
    auto idx = perm.slice(0, step * 32, step * 32 + 32);
    ref.module->zero_grad();
    torch::nn::functional::cross_entropy(ref.forward(x.index_select(0, idx)), y.index_select(0, idx)).backward();
    const auto g = flat(true);
    for (std::size_t i = 0; i < shard.size(); ++i) {
      v[i] += g[i];
      const float sent = compress::half_to_float(compress::float_to_half(v[i]));
      v[i] -= sent;
      shard[i] -= 0.1f * sent;
    }
    auto replica = flat(false);
    for (std::size_t i = 0; i < shard.size(); ++i) {
      const float got = compress::half_to_float(compress::float_to_half(shard[i] - seen[i]));
      seen[i] += got;
      replica[i] += got;
    }
    torch::NoGradGuard ng;
    std::size_t off = 0;
    for (auto& p : params) {
      std::memcpy(p.data_ptr<float>(), replica.data() + off, sizeof(float) * static_cast<std::size_t>(p.numel()));
      off += static_cast<std::size_t>(p.numel());
    }
  }
  ASSERT_EQ(half.snap.partitions.size(), 1u);
  double worst = 0, from_dense = 0;
  for (std::size_t i = 0; i < shard.size(); ++i) {
    worst = std::max(worst, std::abs(double(half.snap.partitions[0].x[i]) - double(shard[i])));
    from_dense = std::max(from_dense, std::abs(double(dense.snap.partitions[0].x[i]) - double(shard[i])));
  }
  EXPECT_LT(worst, 1e-5) << "largest difference from the steps computed by hand";
  // The premise: the tolerance tells the two apart. Gradients taken at the binary16
  // replica move some parameters of this ReLU net ~1e-4 off the fp32 run (measured:
  // 2.5e-4), far more than the rounding itself; a worker that pulled dense fp32 would
  // end there.
  EXPECT_GT(from_dense, 10 * 1e-5);
}

// Overlap (docs/training.md, "Overlap"): a deterministic single-worker BSP run with its
// partitions pushed from the backward pass puts the same bytes on the wire and ends with
// the same parameters, bit for bit, as the same run pushing after backward — and its
// pushes really were written from within backward.
TEST(WorkerStep, OverlapPushesTheSameBytesAndEndsWithTheSameParameters) {
  auto run_once = [](bool overlap, ps::ShardSnapshot& snap, nlohmann::json& done) {
    JobSpec spec = small_mlp_job(5, 3);
    spec.sync = ps::SyncMode::kBsp;
    spec.overlap = overlap;
    spec.partition_size = 8192;  // several partitions, pushed one by one
    auto r = run_against_one_shard(spec, spec.optimizer.momentum, 6, ps::SyncMode::kBsp);
    snap = r.snap;
    done = r.events.back();
    EXPECT_EQ(r.sync.steps, 5u * snap.partitions.size());
  };
  ps::ShardSnapshot off, on;
  nlohmann::json done_off, done_on;
  run_once(false, off, done_off);
  run_once(true, on, done_on);
  ASSERT_EQ(done_off["event"], "done");
  ASSERT_EQ(done_on["event"], "done");
  ASSERT_GT(off.partitions.size(), 2u);
  EXPECT_EQ(done_on["bytes_pushed"], done_off["bytes_pushed"]);
  EXPECT_EQ(done_on["bytes_pulled"], done_off["bytes_pulled"]);
  EXPECT_EQ(done_on["traffic"], done_off["traffic"]) << "the steps' traffic, as the summary's ratios count it";
  EXPECT_EQ(done_off["counters"]["overlapped_pushes"], 0);
  // Every partition of every step but the one holding the first layer (whose gradient
  // backward produces last, so that it completes when backward does) went from a hook.
  EXPECT_GE(done_on["counters"]["overlapped_pushes"].get<std::int64_t>(),
            5 * static_cast<std::int64_t>(off.partitions.size() - 1));
  ASSERT_EQ(on.partitions.size(), off.partitions.size());
  for (std::size_t i = 0; i < on.partitions.size(); ++i) {
    EXPECT_EQ(on.partitions[i].x, off.partitions[i].x) << "partition " << on.partitions[i].key;
    EXPECT_EQ(on.partitions[i].v, off.partitions[i].v) << "partition " << on.partitions[i].key;
  }
}

// Overlap in async mode pipelines the pull: step t's pull runs during step t+1's forward
// and its values reach the model after step t+1's backward, so step t's gradient is taken
// at the parameters of two pulls back — one step of additional staleness. One worker,
// dense, PS momentum 0, constant lr, no weight decay (plain SGD with a delayed gradient):
//   x1 = x0 − lr·g1(x0),  x2 = x1 − lr·g2(x0),  x3 = x2 − lr·g3(x1),  x4 = x3 − lr·g4(x2)
// computed here with LibTorch.
TEST(WorkerStep, OverlapInAsyncModeTakesEachGradientOneStepStaler) {
  JobSpec spec = plain_sgd_job(4, 11);
  spec.overlap = true;
  const auto run = run_against_one_shard(spec, 0.0, 7);
  const auto& evs = run.events;
  ASSERT_EQ(evs.back()["event"], "done");
  EXPECT_EQ(evs.back()["steps"], 4);
  // The pipelined pulls' replies count in the steps' traffic: dense both ways, ratio 1.
  EXPECT_NEAR(evs.back()["compression_ratio"].get<double>(), 1.0, 0.05);

  auto [x, y, ref, perm] = hand_replica(spec);
  auto params = ref.module->parameters();
  auto copy = [&] {
    std::vector<torch::Tensor> c;
    for (const auto& p : params) c.push_back(p.detach().clone());
    return c;
  };
  auto load = [&](const std::vector<torch::Tensor>& from) {
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(from[i]);
  };
  std::vector<std::vector<torch::Tensor>> xs{copy()};  // x0, x1, ...
  for (int step = 0; step < 4; ++step) {
    load(xs[static_cast<std::size_t>(std::max(0, step - 1))]);  // gradient at x_{t-2} (x0 for the first two)
    auto idx = perm.slice(0, step * 32, step * 32 + 32);
    ref.module->zero_grad();
    torch::nn::functional::cross_entropy(ref.forward(x.index_select(0, idx)), y.index_select(0, idx)).backward();
    std::vector<torch::Tensor> next;
    for (std::size_t i = 0; i < params.size(); ++i) next.push_back(xs.back()[i] - params[i].grad() * 0.1f);
    xs.push_back(next);
  }
  EXPECT_LT(largest_difference(run.snap, xs.back(), spec.partition_size), 1e-5)
      << "largest difference from SGD with the gradient one step staler";
}
