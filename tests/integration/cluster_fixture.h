// The standalone cluster the Cluster suites share (cluster_test.cpp: jobs, queue, secrets
// and refusals; cluster_faults_test.cpp: killed, stopped and failing tasks): 3 agents of
// one core, through support/standalone_suite.h.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/jobs.h"
#include "support/standalone_suite.h"

using dltrain::testing::kShortCnn;
using dltrain::testing::kShortOptimizer;

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
  /// `job`'s summary once it has ended (`dltrain follow --json`'s last line), expected to
  /// be "succeeded" with the client's exit code 0.
  static nlohmann::json succeeded_summary(const std::string& job) {
    const auto f = follow_to_end(job);
    EXPECT_EQ(f.code, 0) << f.out;
    auto s = nlohmann::json::parse(dltrain::testing::last_line(f.out));
    EXPECT_EQ(s["state"], "succeeded") << s.dump();
    return s;
  }

  /// The pid of `job`'s worker-1 (generation 1) once `follower` (follow_in_background)
  /// has seen it report progress (at most 180 s); -1 with a failed expectation when not.
  static int worker1_pid_once_it_trains(const std::string& job, const dltrain::testing::Background& follower) {
    using namespace std::chrono_literals;
    const bool trains = dltrain::testing::wait_until(
        [&] { return dltrain::testing::progress_steps(dltrain::testing::follower_events(follower), "worker-1") > 0; },
        180s, 50ms);
    EXPECT_TRUE(trains) << "worker-1 reported no progress within 180 s; " << status(job).dump();
    const auto pids = task_pids(job, "worker-1-g1");
    EXPECT_EQ(pids.size(), 1u) << "worker-1's process";
    return trains && pids.size() == 1 ? pids.front() : -1;
  }

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
