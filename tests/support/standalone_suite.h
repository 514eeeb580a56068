// One standalone cluster (support/cluster.h, Standalone) shared by every test of a
// GoogleTest suite, and the client calls those tests make. A suite derives from
// StandaloneSuite<Itself> and says how its cluster is made:
//
//   class Cluster : public dltrain::testing::StandaloneSuite<Cluster> {
//    public:
//     static constexpr const char* kRootPrefix = "dltrain-cluster";  // temp directory name
//     static constexpr int kAgents = 3;                               // agents of one core
//     static std::vector<std::string> agent_args() { return {"--progress-interval", "1"}; }
//     static void prepare(const std::filesystem::path& root) {}       // before the cluster
//   };
//
// A parametrised suite (TEST_P) passes its GoogleTest base as the second argument:
//   class Refusals : public StandaloneSuite<Refusals, ::testing::TestWithParam<Case>> {...};
//
// The cluster starts once before the suite's first test and stops after its last; the
// teardown checks that it stopped cleanly and left no process behind. Its root is
// removed unless a test failed (then its logs are there to read).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/process.h"
#include "support/wait.h"

namespace dltrain::testing {

template <typename Suite, typename Base = ::testing::Test>
class StandaloneSuite : public Base {
 protected:
  static void SetUpTestSuite() {
    root_ = make_temp_root(Suite::kRootPrefix);
    state_ = root_ / "state";
    Suite::prepare(root_);
    cluster_ = std::make_unique<Standalone>(state_, root_ / "xdg", Suite::kAgents, Suite::agent_args());
    client_ = cluster_->client;
    ASSERT_FALSE(client_.empty()) << "standalone cluster did not become ready";
  }

  static void TearDownTestSuite() {
    if (cluster_ && !cluster_->client.empty()) {
      EXPECT_EQ(cluster_->stop(), 0) << "standalone did not stop cleanly";
      // Nothing the cluster started may outlive it.
      EXPECT_TRUE(cluster_->leftover_processes().empty());
    }
    cluster_.reset();
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(root_);
  }

  /// Defaults a suite may hide.
  static std::vector<std::string> agent_args() { return {}; }
  static void prepare(const std::filesystem::path&) {}

  /// A job file in the suite's root reading the installed Fashion-MNIST, plus `body`.
  static std::filesystem::path write_job(const std::string& name, const std::string& body) {
    return write_job_file(root_, name, "data_dir = \"/usr/share/datasets/fashion-mnist\"\n" + body);
  }
  /// Submits a job file; its id ("" and a failed expectation when the submit failed).
  static std::string submit(const std::filesystem::path& path) { return submit_job(client_, path); }
  /// Writes job file `name` (write_job) and submits it.
  static std::string submit(const std::string& name, const std::string& body) { return submit(write_job(name, body)); }
  /// Submits job `name` and waits (at most `timeout_s`) until it runs: its id, or "" with
  /// a failed expectation saying why (not submitted, or in another state at the end).
  static std::string submit_running(const std::string& name, const std::string& body, int timeout_s = 60) {
    const std::string job = submit(name, body);
    if (job.empty()) return "";
    const std::string state = wait_state(job, {"running"}, timeout_s);
    EXPECT_EQ(state, "running") << job << " after " << timeout_s << " s";
    return state == "running" ? job : "";
  }
  /// `dltrain follow JOB --json` running beside the test, its lines in the suite's root.
  static Background follow_in_background(const std::string& job) {
    return Background(client_ + " follow " + job + " --json", (root_ / (job + "-events.jsonl")).string());
  }
  /// The first of the agents' copies of `file` in `job`'s task directory `task_dir`
  /// ("ps-0-g1"), or an empty path while no agent has one.
  static std::filesystem::path task_file(const std::string& job, const std::string& task_dir, const std::string& file) {
    for (const auto& agent : cluster_->agent_dirs()) {
      const auto p = agent / "tasks" / job / task_dir / file;
      if (std::filesystem::exists(p)) return p;
    }
    return {};
  }
  static nlohmann::json status(const std::string& job) { return job_status(client_, job, true); }
  static std::string wait_state(const std::string& job, const std::vector<std::string>& states, int timeout_s) {
    return testing::wait_state(client_, job, states, timeout_s).value("state", "");
  }
  /// `dltrain follow JOB --json` once the job has ended, waiting for as long as it moves
  /// (testing::follow_to_end).
  static Result follow_to_end(const std::string& job) { return testing::follow_to_end(client_, job); }
  static bool wait_all_tasks_running(const std::string& job, std::size_t tasks, int timeout_s) {
    return testing::wait_all_tasks_running(client_, job, tasks, timeout_s);
  }
  static std::vector<int> task_pids(const std::string& job, const std::string& task = "") {
    return cluster_->task_pids(job, task);
  }
  /// SIGKILLs the process of the task in directory `task_dir` ("ps-0-g1") of `job` 4
  /// times, each new incarnation once it appears (at most 60 s each): one more death than
  /// its agent restarts (task_max_restarts, 3 by default), so the last one fails the job.
  static void kill_until_restarts_run_out(const std::string& job, const std::string& task_dir) {
    using namespace std::chrono_literals;
    std::set<int> killed;
    for (int round = 0; round < 4; ++round) {
      int victim = -1;
      wait_until(
          [&] {
            for (int pid : task_pids(job, task_dir)) {
              if (!killed.count(pid)) victim = pid;
            }
            return victim > 0;
          },
          60s, 50ms);
      ASSERT_GT(victim, 0) << "no " << task_dir << " process in round " << round << "; " << status(job).dump();
      ASSERT_EQ(::kill(victim, SIGKILL), 0);
      killed.insert(victim);
    }
  }

  static inline std::filesystem::path root_, state_;
  static inline std::unique_ptr<Standalone> cluster_;
  static inline std::string client_;
};

}  // namespace dltrain::testing
