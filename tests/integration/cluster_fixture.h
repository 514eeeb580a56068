// The standalone cluster the Cluster suites share (cluster_test.cpp: jobs, queue, secrets
// and refusals; cluster_faults_test.cpp: killed, stopped and failing tasks): 3 agents of
// one core, through support/standalone_suite.h.
#pragma once

#include <string>
#include <vector>

#include "support/standalone_suite.h"

// PS shards checkpoint every 3 s (not the default 10 s) and workers report progress every
// second (not 5 s), so that a shard has written its checkpoint and a worker has reported
// progress long before its job ends: the tests that wait for those before killing or
// stopping a task find the order of events forced, not raced.
class Cluster : public dltrain::testing::StandaloneSuite<Cluster> {
 public:
  static constexpr const char* kRootPrefix = "dltrain-cluster";
  static constexpr int kAgents = 3;
  static std::vector<std::string> agent_args() {
    return {"--ps-checkpoint-interval", "3", "--progress-interval", "1"};
  }
};

// A short CNN job on 8,000 training images: 2 workers + 1 PS shard (3 cores).
inline const std::string kShortCnn = R"(model = "cnn"
workers = 2
ps_shards = 1
batch_size = 32
train_samples = 8000
test_samples = 2000
)";
inline const std::string kShortOptimizer = R"(
[optimizer]
lr = 0.05
warmup_epochs = 0.2
)";
