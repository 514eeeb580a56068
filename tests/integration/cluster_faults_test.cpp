// Faults in a standalone cluster of real processes on loopback: workers and PS shards
// killed, stopped, corrupted or diverging, under async, BSP and SSP; each test checks its
// premise (the victim runs and has work left) right before it acts.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cluster_fixture.h"
#include "support/cluster.h"
#include "support/process.h"
#include "support/wait.h"
#include "support/jobs.h"
#include "support/names.h"

namespace {

// The step barrier's record from the log line a PS shard writes when it stops in ssp or
// sync mode (daemon/ps_main.cpp): the shard's own count, not the test's inference.
struct SyncRecord {
  long steps = -1, late = -1, waits = -1, dropped = -1, departures = -1, rejoins = -1, max_lead = -1;
  std::string line;  ///< the matched text
};
SyncRecord sync_record(const std::string& log) {
  static const std::regex re(
      R"(sync \w+: (\d+) steps applied, (\d+) late pushes dropped, (\d+) pulls waited \([\d.]+ s in all\), (\d+) )"
      R"(workers dropped by the barrier timeout, (\d+) connections closed mid-step, (\d+) rejoins, max lead (\d+) steps)");
  std::smatch m;
  SyncRecord r;
  if (!std::regex_search(log, m, re)) return r;
  long* f[] = {&r.steps, &r.late, &r.waits, &r.dropped, &r.departures, &r.rejoins, &r.max_lead};
  for (std::size_t i = 0; i < 7; ++i) *f[i] = std::stol(m[i + 1].str());
  r.line = m[0].str();
  return r;
}

// The sync record of `job`'s PS shard 0, from its log (`dltrain logs`); steps = -1 (and a
// failed expectation) when the log has none.
SyncRecord ps0_sync_record(const std::string& client, const std::string& job) {
  const auto log = run(client + " logs " + job + " --task ps-0", 30);
  EXPECT_EQ(log.code, 0) << log.out;
  auto rec = sync_record(log.out);
  EXPECT_GE(rec.steps, 0) << "no sync record in the shard's log:\n" << log.out;
  std::cout << "ps-0's sync record: " << rec.line << std::endl;
  return rec;
}

}  // namespace

TEST_F(Cluster, AKilledWorkerIsRestartedAndTheJobSucceeds) {
  const std::string job = submit_running("to-kill", kShortCnn + "epochs = 3\n" + kShortOptimizer);
  ASSERT_FALSE(job.empty());
  // Find worker 1's process through its task directory, once it trains.
  int victim = -1;
  wait_until(
      [&] {
        const auto st = status(job);  // kept: the loop below reads into it
        bool training = false;
        for (const auto& t : st["tasks"]) training |= t["task"] == "worker-1" && t["state"] == "running";
        const auto pids = training ? task_pids(job, "worker-1-g1") : std::vector<int>{};
        if (!pids.empty()) victim = pids.front();
        return victim > 0;
      },
      60s, 100ms);
  ASSERT_GT(victim, 0) << "worker-1 never started";
  // Mid-training: once worker-1 has reported progress (it reports every few seconds; a
  // follower sees the events from its subscription on).
  Background follower = follow_in_background(job);
  ASSERT_TRUE(wait_until(
      [&] { return dltrain::testing::progress_steps(dltrain::testing::follower_events(follower), "worker-1") > 0; },
      120s, 50ms))
      << "worker-1 reported no progress within 120 s; " << status(job).dump();
  // The premise, right before the act: worker 1 runs and has most of its work left.
  ASSERT_TRUE(dltrain::testing::has_work_left(status(job), "worker-1", 0.4));
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  // Its agent restarts it; it resumes from the PS's parameters and the job ends well.
  const auto s = succeeded_summary(job);
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.6) << s.dump();
  auto st = status(job);
  int restarts = 0;
  for (const auto& t : st["tasks"]) {
    if (t["task"] == "worker-1") restarts = t.value("restarts", 0);
  }
  EXPECT_EQ(restarts, 1) << st.dump();
}

// A straggler: one worker of an asynchronous job is stopped (SIGSTOP) mid-training for
// longer than twice the job's PS timeout. The other worker keeps pushing and pulling —
// its reported step count advances while the stopped one's stays frozen — and once the
// straggler is continued it picks up where it was (no restart: the PS timeout bounds the
// PS's silence, not the time a worker was not running) and the job succeeds.
TEST_F(Cluster, AStoppedWorkerDoesNotHoldUpTheOtherAndTheJobSucceeds) {
  // The CNN on 24,000 images for 8 epochs, so that worker 0 has plenty of steps left
  // while worker 1 is stopped (at least two PS timeouts and two progress events after the
  // stop: checked below from its own throughput before the stop), and a 5 s PS timeout.
  // (The MLP this test used once trains ~20x faster on OpenBLAS and finished first.)
  auto f = write_job("straggler", "epochs = 8\n" + kCnn24000 + R"(lr_schedule = "cosine"
warmup_epochs = 0.2
[ps]
partition_size = 65536
timeout = "5s"
)");
  constexpr auto kPsTimeout = 5s;
  const std::string job = submit(f);
  ASSERT_FALSE(job.empty());
  Background follower = follow_in_background(job);

  // The job's events so far (the follower's complete lines); per worker, the highest step
  // count its progress events reported from event `from` on (-1: none) and how many
  // events (of a kind) it sent from event `from` on.
  std::vector<json> events;
  auto read_events = [&] {
    events.clear();
    for (const auto& line : follower.lines()) {
      try {
        events.push_back(json::parse(line));
      } catch (const json::exception&) {
      }
    }
  };
  auto steps = [&](const std::string& task, std::size_t from = 0) {
    std::int64_t best = -1;
    for (std::size_t i = from; i < events.size(); ++i) {
      if (events[i].value("task", "") == task && events[i].value("event", "") == "progress") {
        best = std::max(best, events[i].value("global_step", std::int64_t{-1}));
      }
    }
    return best;
  };
  auto count = [&](const std::string& task, std::size_t from, const std::string& kind = "") {
    int n = 0;
    for (std::size_t i = from; i < events.size(); ++i) {
      n += events[i].value("task", "") == task && (kind.empty() || events[i].value("event", "") == kind);
    }
    return n;
  };
  auto dump = [&] {
    std::string s;
    for (const auto& e : events) s += e.dump() + "\n";
    return s;
  };

  // Worker 1 is training once it has reported progress.
  wait_until(
      [&] {
        read_events();
        return steps("worker-1") > 0 && steps("worker-0") > 0;  // both train (worker 0's pace is read below)
      },
      180s, 200ms);
  ASSERT_GT(steps("worker-1"), 0) << "worker-1 reported no progress within 180 s\n" << dump();
  const auto pids = task_pids(job, "worker-1-g1");
  ASSERT_EQ(pids.size(), 1u) << "worker-1's process";
  const int victim = pids.front();

  // The premise, right before the act: both workers run with most of their work left,
  // and worker 0's steps left take longer, at its own latest throughput, than the 3 PS
  // timeouts it must go on for while worker 1 is stopped (the stop, two timeouts).
  {
    const auto st = status(job);
    ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.6));
    ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.6));
    read_events();
    double ips = 0;
    for (const auto& e : events) {
      if (e.value("task", "") == "worker-0" && e.value("event", "") == "progress") ips = e.value("images_per_sec", 0.0);
    }
    ASSERT_GT(ips, 0.0) << "worker-0 reported no throughput yet\n" << dump();
    const auto w0 = dltrain::testing::task_of(st, "worker-0");
    const double left_s = 32.0 * static_cast<double>(w0.value("steps_total", 0) - w0.value("step", 0)) / ips;
    ASSERT_GT(left_s, 3.0 * std::chrono::duration<double>(kPsTimeout).count())
        << "worker 0 would finish before the test is done with it (" << ips << " images/s): the job is too short "
        << "for this machine\n" << dump();
  }
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  struct ContinueOnExit {  // a failed assertion must not leave the cluster a stopped task
    int pid;
    ~ContinueOnExit() {
      if (pid > 0) kill(pid, SIGCONT);
    }
  } continue_on_exit{victim};
  wait_until([&] { return process_state(victim) == 'T'; }, 10s, 100ms);
  ASSERT_EQ(process_state(victim), 'T') << "worker-1 did not stop";
  const auto stopped_at = std::chrono::steady_clock::now();

  // Events the workers wrote before the stop may still be on their way; after one PS
  // timeout they have arrived, and from then on nothing more may come from worker 1.
  std::this_thread::sleep_for(kPsTimeout);
  read_events();
  const std::size_t frozen_from = events.size();
  const std::int64_t w1_frozen = steps("worker-1");
  const std::int64_t w0_before = steps("worker-0");

  // Keep it stopped for two PS timeouts and until worker 0 reported progress twice more.
  wait_until(
      [&] {
        read_events();
        return std::chrono::steady_clock::now() - stopped_at >= 2 * kPsTimeout &&
               count("worker-0", frozen_from, "progress") >= 2;
      },
      180s, 200ms);
  read_events();
  ASSERT_GE(count("worker-0", frozen_from, "progress"), 2)
      << "worker-0 reported no progress within 180 s while worker-1 was stopped\n" << dump();
  EXPECT_GT(steps("worker-0", frozen_from), std::max<std::int64_t>(w0_before, 0))
      << "worker-0's steps did not advance while worker-1 was stopped\n" << dump();
  EXPECT_EQ(count("worker-1", frozen_from), 0) << "a stopped worker reported events\n" << dump();
  EXPECT_EQ(process_state(victim), 'T');
  EXPECT_EQ(status(job)["state"], "running");
  // Flagged as a straggler once worker 0 is more than twice as far (straggler_factor 2;
  // bounded: worker 0 has most of 8 epochs to go).
  json flagged;
  EXPECT_TRUE(wait_until(
      [&] {
        flagged = status(job);
        return dltrain::testing::task_of(flagged, "worker-1").value("straggler", false);
      },
      120s, 200ms))
      << "worker-1 was not flagged while stopped; " << flagged.dump();
  EXPECT_FALSE(dltrain::testing::task_of(flagged, "worker-0").value("straggler", false)) << flagged.dump();

  ASSERT_EQ(kill(victim, SIGCONT), 0);
  continue_on_exit.pid = 0;
  const auto end = dltrain::testing::wait_job_end(client_, job);
  ASSERT_EQ(end.value("state", ""), "succeeded") << "after worker-1's SIGCONT: " << end.dump() << "\n" << dump();
  ASSERT_EQ(follower.wait(60), 0) << "the follower did not end with the job\n" << dump();
  read_events();
  // Worker 1 went on from where it stopped, in the same process.
  EXPECT_GT(steps("worker-1", frozen_from), w1_frozen) << dump();
  EXPECT_EQ(count("worker-1", 0, "restarting"), 0) << dump();
  EXPECT_EQ(count("worker-1", 0, "done"), 1) << dump();
  const auto& s = events.back();
  EXPECT_EQ(s["event"], "summary");
  EXPECT_EQ(s["state"], "succeeded") << s.dump();
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.6) << s.dump();  // chance is 0.10
  const auto final_status = status(job);
  for (const auto& t : final_status["tasks"]) EXPECT_EQ(t.value("restarts", 0), 0) << t.dump();
}

TEST_F(Cluster, AKilledPsShardRestartsFromItsCheckpointAndTheJobSucceeds) {
  // Long enough that both workers still train when the first checkpoint is written.
  const std::string job = submit_running("kill-ps", kShortCnn + "epochs = 10\n" + kShortOptimizer);
  ASSERT_FALSE(job.empty());
  // Training is under way once the shard has written a checkpoint (every 3 s; it writes
  // none while it holds no parameters).
  fs::path checkpoint;
  wait_until(
      [&] {
        checkpoint = task_file(job, "ps-0-g1", "shard.ckpt");
        return !checkpoint.empty();
      },
      120s, 100ms);
  ASSERT_FALSE(checkpoint.empty()) << "ps-0 wrote no checkpoint; " << status(job).dump();
  ASSERT_EQ(status(job)["state"], "running");
  ASSERT_NO_FATAL_FAILURE(kill_ps0_with_work_left(job));

  // Its agent restarts it on the same port from the checkpoint; the workers reconnect,
  // resync and the job ends well.
  const auto s = succeeded_summary(job);
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.6) << s.dump();  // chance is 0.10
  auto st = status(job);
  json ps, workers = json::array();
  for (const auto& t : st["tasks"]) {
    if (t["task"] == "ps-0") ps = t;
    if (t["task"].get<std::string>().rfind("worker-", 0) == 0) workers.push_back(t);
  }
  EXPECT_EQ(ps.value("restarts", 0), 1) << st.dump();
  EXPECT_NE(ps.value("recovery", "").find("restored from its checkpoint"), std::string::npos) << st.dump();
  // The workers recovered by reconnecting and resyncing, not by being restarted.
  ASSERT_EQ(workers.size(), 2u) << st.dump();
  for (const auto& w : workers) {
    EXPECT_EQ(w.value("restarts", 0), 0) << st.dump();
    EXPECT_GE(w.value("resyncs", 0), 1) << st.dump();
  }
  std::cout << "[ figures  ] PS shard killed: job " << s["state"] << ", test accuracy " << s["test_accuracy"]
            << ", wall " << s["wall_seconds"] << " s; " << ps.value("recovery", "") << std::endl;
  // The text form of `dltrain status` shows it too.
  auto text = run(client_ + " status " + job, 30);
  EXPECT_NE(text.out.find("restarts 1  restored from its checkpoint"), std::string::npos) << text.out;
  // The shard's last checkpoint (written when it was stopped) is in its task directory.
  EXPECT_TRUE(fs::exists(checkpoint));
  EXPECT_GT(fs::file_size(checkpoint), 44u);
}

TEST_F(Cluster, ACorruptedCheckpointIsRefusedAndTheShardIsRebuiltFromTheWorkers) {
  // Long enough that no worker has finished by the second checkpoint, ~6 s in, even on
  // an idle machine (a shard restarted without its state cannot learn that a worker that
  // already exited had finished).
  const std::string job = submit_running("corrupt-ckpt", kShortCnn + "epochs = 16\n" + kShortOptimizer);
  ASSERT_FALSE(job.empty());
  // Wait for a checkpoint to be replaced by a newer one (a new inode: written to the
  // temporary file and renamed), so that the next one is ~3 s away: corrupting this one
  // and killing the shard cannot race with a save.
  fs::path checkpoint;
  ino_t first = 0;
  bool replaced = false;
  wait_until(
      [&] {
        if (checkpoint.empty()) checkpoint = task_file(job, "ps-0-g1", "shard.ckpt");
        struct stat st {};
        if (!checkpoint.empty() && ::stat(checkpoint.c_str(), &st) == 0) {
          if (first == 0) first = st.st_ino;
          replaced = st.st_ino != first;
        }
        return replaced;
      },
      120s, 20ms);
  ASSERT_TRUE(replaced) << "ps-0 did not write two checkpoints; " << status(job).dump();
  {
    std::fstream f(checkpoint, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(checkpoint) / 2));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(fs::file_size(checkpoint) / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  ASSERT_NO_FATAL_FAILURE(kill_ps0_with_work_left(job));

  // The restarted shard refuses the file, starts empty and takes the first worker's
  // replica; the job still ends well.
  const auto s = succeeded_summary(job);
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.6) << s.dump();
  auto st = status(job);
  std::string recovery;
  for (const auto& t : st["tasks"]) {
    if (t["task"] == "ps-0") recovery = t.value("recovery", "");
  }
  EXPECT_NE(recovery.find("checkpoint refused"), std::string::npos) << st.dump();
  EXPECT_NE(recovery.find("checksum mismatch"), std::string::npos) << st.dump();
  EXPECT_NE(recovery.find("rebuilt from the workers' replicas"), std::string::npos) << st.dump();
  EXPECT_TRUE(fs::exists(checkpoint.string() + ".refused"));
  std::cout << "[ figures  ] corrupted checkpoint: job " << s["state"] << ", test accuracy " << s["test_accuracy"]
            << ", wall " << s["wall_seconds"] << " s" << std::endl;
}

TEST_F(Cluster, APsShardThatKeepsDyingFailsTheJobWithTheReason) {
  const std::string job = submit_running("kill-ps-often", kShortCnn + "epochs = 20\n" + kShortOptimizer);
  ASSERT_FALSE(job.empty());
  // The agent restarts it 3 times (task_max_restarts); the 4th death ends the job.
  kill_until_restarts_run_out(job, "ps-0-g1");
  if (HasFatalFailure()) return;
  EXPECT_EQ(wait_state(job, {"failed", "succeeded", "cancelled"}, 90), "failed");
  auto st = status(job);
  EXPECT_NE(st.value("error", "").find("ps-0 on agent"), std::string::npos) << st.dump();
  EXPECT_NE(st.value("error", "").find("killed by signal 9"), std::string::npos) << st.dump();
  std::string agent;
  for (const auto& t : st["tasks"]) {
    if (t["task"] == "ps-0") EXPECT_EQ(t.value("restarts", 0), 3) << st.dump();
    if (t["task"] == "ps-0") agent = t.value("agent", "");
  }
  // The failure names the task, its agent and how it ended.
  ASSERT_TRUE(st.contains("failure")) << st.dump();
  EXPECT_EQ(st["failure"]["task"], "ps-0");
  EXPECT_EQ(st["failure"]["agent"], agent);
  EXPECT_EQ(st["failure"]["cause"], "signal");
  EXPECT_EQ(st["failure"]["signal"], SIGKILL);
  // Nothing of the job is left running.
  EXPECT_TRUE(task_pids(job).empty()) << task_pids(job).size() << " task processes outlived the failed job";
}

TEST_F(Cluster, ADivergingJobSkipsNaNStepsThenFailsWithTheReason) {
  // lr 10 with momentum 0.9 drives the MLP to NaN within a few dozen steps.
  auto d = write_job("diverge",  kOneWorkerMlp + R"(test_samples = 500
[optimizer]
lr = 10
momentum = 0.9
warmup_epochs = 0
lr_schedule = "constant"
)");
  auto r = run(client_ + " submit " + d.string() + " --follow --json", 120);
  EXPECT_EQ(r.code, 1) << r.out;
  auto s = json::parse(last_line(r.out));
  EXPECT_EQ(s["state"], "failed");
  EXPECT_NE(s["error"].get<std::string>().find("21 consecutive steps had a NaN/Inf loss or gradient"),
            std::string::npos)
      << s.dump();
  // Each skipped step was reported, and none was pushed: the PS refused nothing. The
  // agent restarted the worker (3 times by default) before giving up.
  EXPECT_NE(r.out.find("\"event\":\"skipped_step\""), std::string::npos);
  EXPECT_NE(r.out.find("\"event\":\"restarting\""), std::string::npos);
  // The summary names the failure's cause, and the end of the worker's log shows the
  // skipped steps that led to it.
  ASSERT_TRUE(s.contains("failure")) << s.dump();
  EXPECT_EQ(s["failure"]["task"], "worker-0");
  EXPECT_EQ(s["failure"]["cause"], "divergence");
  EXPECT_EQ(s["failure"]["exit_code"], 1);
  const auto lines = s["failure"]["last_lines"];
  ASSERT_FALSE(lines.empty()) << s.dump();
  EXPECT_NE(lines.back().get<std::string>().find("consecutive steps had a NaN/Inf loss"), std::string::npos)
      << s.dump();
  EXPECT_NE(lines.dump().find("skipped_step"), std::string::npos) << s.dump();
  // `dltrain status` says the same, in words.
  const auto text = run(client_ + " status " + s["job"].get<std::string>(), 30);
  EXPECT_NE(text.out.find("failed first: worker-0 on agent " + s["failure"]["agent"].get<std::string>() +
                          ", cause divergence (exit code 1)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("last lines of its log:"), std::string::npos) << text.out;
}

TEST_F(Cluster, AWorkerKilledUntilItsRestartsRunOutNamesItselfAsTheFailure) {
  auto k = write_job("kill-worker-often", kShortCnn + "epochs = 20\n" + kShortOptimizer);
  const std::string job = dltrain::testing::submit_job(client_, k);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(wait_state(job, {"running"}, 60), "running");
  // 3 restarts (task_max_restarts); the 4th SIGKILL ends the job.
  kill_until_restarts_run_out(job, "worker-1-g1");
  if (HasFatalFailure()) return;
  EXPECT_EQ(wait_state(job, {"failed", "succeeded", "cancelled"}, 120), "failed");
  auto st = status(job);
  ASSERT_TRUE(st.contains("failure")) << st.dump();
  const auto& f = st["failure"];
  EXPECT_EQ(f["task"], "worker-1");
  EXPECT_EQ(f["agent"], dltrain::testing::task_of(st, "worker-1").value("agent", "?"));
  EXPECT_EQ(f["cause"], "signal");
  EXPECT_EQ(f["signal"], SIGKILL);
  EXPECT_FALSE(f.contains("exit_code")) << st.dump();
  EXPECT_NE(f["message"].get<std::string>().find("killed by signal 9"), std::string::npos) << st.dump();
  EXPECT_TRUE(task_pids(job).empty()) << "task processes outlived the failed job";
}

TEST_F(Cluster, ABspJobGoesOnPastAKilledWorkerAndSucceeds) {
  const std::string job = submit("bsp-kill", kShortCnn + "epochs = 4\nsync = \"sync\"\n" + kShortOptimizer +
                                     "[ps]\nbarrier_timeout = \"20s\"\n");
  ASSERT_FALSE(job.empty());
  Background follower = follow_in_background(job);
  const int victim = worker1_pid_once_it_trains(job, follower);
  ASSERT_GT(victim, 0);
  // The premise, right before the act: worker 1 runs and has most of its work left.
  ASSERT_TRUE(dltrain::testing::has_work_left(status(job), "worker-1", 0.4));
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto summary = succeeded_summary(job);
  EXPECT_GE(summary.value("test_accuracy", 0.0), 0.6) << summary.dump();
  EXPECT_EQ(dltrain::testing::task_of(status(job), "worker-1").value("restarts", 0), 1);
  const auto rec = ps0_sync_record(client_, job);
  ASSERT_GE(rec.steps, 0);
  EXPECT_GE(rec.departures, 1) << "the killed worker's connection did not leave the barrier";
  EXPECT_GE(rec.rejoins, 1) << "its replacement did not rejoin";
  EXPECT_EQ(rec.dropped, 0) << "the barrier waited for the killed worker until its timeout";
  EXPECT_EQ(rec.max_lead, 0) << "BSP without backup workers: nobody is ever ahead";
  EXPECT_GT(rec.waits, 0);
}

// SSP (sync = "ssp", staleness = 2): worker 1 is SIGSTOPped twice for 3 s mid-training.
// Worker 0 runs at most 2 steps ahead of it — by the shard's own record of every pull it
// answered — so it waits, and reaches the bound; nobody is dropped (the barrier timeout is
// 30 s), and the job succeeds.
TEST_F(Cluster, AnSspWorkerIsNeverMoreThanStalenessStepsAheadOfAStoppedOne) {
  const std::string job = submit("ssp-stop", kShortCnn + "epochs = 6\nsync = \"ssp\"\nstaleness = 2\n" + kShortOptimizer);
  ASSERT_FALSE(job.empty());
  Background follower = follow_in_background(job);
  const int victim = worker1_pid_once_it_trains(job, follower);
  ASSERT_GT(victim, 0);
  struct ContinueOnExit {  // a failed assertion must not leave the cluster a stopped task
    int pid;
    ~ContinueOnExit() { kill(pid, SIGCONT); }
  } continue_on_exit{victim};
  const auto worker1_step = [&] {
    return dltrain::testing::task_of(status(job), "worker-1").value("step", std::int64_t{0});
  };
  for (int round = 0; round < 2; ++round) {
    // The premise, right before each stop: worker 1 runs and has work left after it.
    ASSERT_TRUE(dltrain::testing::has_work_left(status(job), "worker-1", 0.2)) << "round " << round;
    ASSERT_EQ(kill(victim, SIGSTOP), 0);
    // The suspension itself, not a synchronisation: long enough for worker 0 to reach
    // the bound (its steps take milliseconds), well below the barrier timeout.
    std::this_thread::sleep_for(3s);
    // Its reports from before the stop have arrived by now (progress comes every second).
    const std::int64_t stopped_at_step = worker1_step();
    ASSERT_EQ(kill(victim, SIGCONT), 0);
    // Worker 1 trains again before the next stop: its progress passes where it stopped.
    ASSERT_TRUE(wait_until([&] { return worker1_step() > stopped_at_step; }, 60s, 200ms))
        << "worker-1 made no progress after SIGCONT in round " << round << "; " << status(job).dump();
  }
  const auto summary = succeeded_summary(job);
  const auto rec = ps0_sync_record(client_, job);
  ASSERT_GE(rec.steps, 0);
  EXPECT_EQ(rec.max_lead, 2) << "a worker was served more than 2 steps ahead, or the stop never made it wait";
  EXPECT_GT(rec.waits, 0);
  EXPECT_EQ(rec.dropped, 0);
  EXPECT_EQ(rec.late, 0) << "SSP applies every push";
}

