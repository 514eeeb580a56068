// Models and the learning-rate schedule (LibTorch).
#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "train/models.h"
#include "train/trainer.h"

using namespace dltrain;
using namespace dltrain::train;

TEST(Models, ParameterCountsMatchTheArchitecture) {
  // CNN: conv 1→16 (144), BN 16 (32), conv 16→32 (4608), BN (64), conv 32→64 (18432),
  // BN (128), FC 576→64 (36928), FC 64→10 (650) = 60986.
  auto cnn = make_model("cnn");
  EXPECT_EQ(parameter_count(*cnn.module), 60986);
  // MLP: 784·256+256 + 256·128+128 + 128·10+10 = 235146.
  auto mlp = make_model("mlp");
  EXPECT_EQ(parameter_count(*mlp.module), 235146);
  // Large MLP: 784·768+768 + 768·128+128 + 128·10+10 = 702602.
  EXPECT_EQ(parameter_count(*make_model("mlp-large").module), 702602);
  EXPECT_THROW(make_model("vgg"), ConfigError);
  auto out = cnn.forward(torch::zeros({3, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<std::int64_t>{3, 10}));
}

TEST(Models, SameSeedGivesIdenticalReplicas) {
  torch::manual_seed(5);
  auto a = make_model("cnn");
  torch::manual_seed(5);
  auto b = make_model("cnn");
  auto pa = a.module->parameters(), pb = b.module->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

TEST(LearningRate, WarmupThenCosineAsHandComputed) {
  OptimizerSpec o;
  o.lr = 0.1;
  o.warmup_epochs = 1.0;
  o.lr_schedule = "cosine";
  EXPECT_NEAR(learning_rate(o, 0.0, 5), 0.01, 1e-12);   // lr/10 at the start
  EXPECT_NEAR(learning_rate(o, 0.5, 5), 0.055, 1e-12);  // halfway through warm-up
  EXPECT_NEAR(learning_rate(o, 1.0, 5), 0.1, 1e-12);    // cosine starts at the peak
  EXPECT_NEAR(learning_rate(o, 3.0, 5), 0.05, 1e-12);   // half of the cosine span
  EXPECT_NEAR(learning_rate(o, 5.0, 5), 0.0, 1e-12);
  o.warmup_epochs = 0;
  o.lr_schedule = "step";
  EXPECT_NEAR(learning_rate(o, 2.4, 5), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 2.5, 5), 0.01, 1e-12);
  EXPECT_NEAR(learning_rate(o, 4.0, 5), 0.001, 1e-12);
  o.lr_schedule = "constant";
  EXPECT_NEAR(learning_rate(o, 4.0, 5), 0.1, 1e-12);
}
