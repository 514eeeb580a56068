// Job file bodies several integration tests submit (each adds its data_dir line, an
// epochs line and what is its own). TOML: a body that ends inside a [table] leaves what
// is appended to it in that table.
#pragma once

#include <string>

namespace dltrain::testing {

/// One MLP worker and one PS shard for one epoch of the first 3,000 training images:
/// seconds to train. Append test_samples.
inline const std::string kOneWorkerMlp = R"(model = "mlp"
epochs = 1
workers = 1
ps_shards = 1
batch_size = 32
train_samples = 3000
)";

/// The CNN on 24,000 images, 2 workers and 1 PS shard, seeded, ending in its
/// [optimizer] table (lr 0.05, momentum 0.9): long enough per epoch that a test can act
/// on a worker while it trains. Append epochs before it, optimizer keys or tables after.
inline const std::string kCnn24000 = R"(model = "cnn"
workers = 2
ps_shards = 1
batch_size = 32
train_samples = 24000
test_samples = 2000
seed = 7
[optimizer]
lr = 0.05
momentum = 0.9
)";

/// Deep gradient compression as the tests run it: 0.1 % up, 1 % down, one warm-up epoch.
inline const std::string kDgcCompression = R"(
[compression]
method = "dgc"
ratio = 0.001
downlink_ratio = 0.01
warmup_epochs = 1
momentum = 0.9
)";

/// An automatic MLP job (workers and batch size "auto", the planner's choice among
/// batch sizes 32 and 64 and up to 2 workers) on 3,000 images, for 0.5 accuracy in 20 min.
inline const std::string kAutoMlp = R"(model = "mlp"
workers = "auto"
batch_size = "auto"
ps_shards = 1
epochs = 1
train_samples = 3000
test_samples = 1000
target_accuracy = 0.5
deadline = "20m"
[planner]
batch_sizes = [32, 64]
max_workers = 2
)";

}  // namespace dltrain::testing
