// The standalone cluster the Cluster suites share (cluster_test.cpp: jobs, queue, secrets
// and refusals; cluster_faults_test.cpp: killed, stopped and failing tasks): 3 agents of
// one core, through support/standalone_suite.h.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

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

 protected:
  /// SIGKILLs `job`'s PS shard 0 (generation 1) once the premise of a shard-loss test
  /// holds, checked right before the act: it is one process, all three tasks still run
  /// (no worker finished) and both workers have at least a quarter of their steps left.
  /// Fails the calling test (a fatal failure: wrap it in ASSERT_NO_FATAL_FAILURE) when not.
  static void kill_ps0_with_work_left(const std::string& job) {
    const auto pids = task_pids(job, "ps-0-g1");
    ASSERT_EQ(pids.size(), 1u);
    ASSERT_EQ(task_pids(job).size(), 3u) << "a worker finished before the shard was killed; " << status(job).dump();
    const auto st = status(job);
    ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.25));
    ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.25));
    ASSERT_EQ(::kill(pids.front(), SIGKILL), 0);
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
