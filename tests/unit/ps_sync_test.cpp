// The consistency models of the PS (ps/sync.h): the step barrier on its own, then BSP,
// backup workers and SSP through real shards and clients over loopback TCP. Every value
// is computed by hand in the comments: gradients and learning rates are small dyadic
// numbers, so that float arithmetic is exact and results compare with ==.
#include <chrono>
#include <cstdint>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "ps/sync.h"
#include "support/ps_shards.h"
#include "support/wait.h"

using namespace dltrain;
using namespace dltrain::ps;
using dltrain::testing::PsShards;
using namespace std::chrono_literals;

namespace {

SyncOptions ssp(std::uint32_t s, std::chrono::milliseconds timeout = 30000ms) {
  SyncOptions o;
  o.mode = SyncMode::kSsp;
  o.staleness = s;
  o.barrier_timeout = timeout;
  return o;
}

SyncOptions bsp(std::uint32_t backup = 0, std::chrono::milliseconds timeout = 30000ms) {
  SyncOptions o;
  o.mode = SyncMode::kBsp;
  o.backup_workers = backup;
  o.barrier_timeout = timeout;
  return o;
}

// A dense push of `g` (length 4) to partition 0 of a barrier's shard.
StepBarrier::PushOutcome push(StepBarrier& b, std::uint32_t rank, std::vector<float> g, float lr = 0.5f) {
  return b.push(rank, 0, {}, g, false, lr);
}

std::vector<float> values(ShardState& st) {
  std::vector<float> x(4);
  st.pull(0, x);
  return x;
}

// Polls `cond` every millisecond for at most 10 s.
bool eventually(const std::function<bool()>& cond) { return dltrain::testing::wait_until(cond, 10s, 1ms); }

}  // namespace

TEST(SyncMode, JobFileNamesParseAndPrint) {
  EXPECT_EQ(parse_enum<SyncMode>("async", "sync"), SyncMode::kAsync);
  EXPECT_EQ(parse_enum<SyncMode>("ssp", "sync"), SyncMode::kSsp);
  EXPECT_EQ(parse_enum<SyncMode>("sync", "sync"), SyncMode::kBsp);
  EXPECT_EQ(enum_name(SyncMode::kBsp), "sync");
  EXPECT_THROW(parse_enum<SyncMode>("bsp", "sync"), ConfigError);
}

// SSP with s = 2, two workers: worker 0 may push twice more than worker 1 and still read;
// its pull at clock 3 (worker 1 at 0) waits until worker 1's first push.
TEST(StepBarrier, SspHoldsAWorkerThatIsMoreThanStalenessStepsAhead) {
  ShardState st(0.0);
  st.init(0, std::vector<float>{0, 0, 0, 0});
  StepBarrier b(ssp(2), st);
  b.join(0, 2);
  b.join(1, 2);
  int released = 0;
  for (int step = 1; step <= 2; ++step) {
    EXPECT_EQ(push(b, 0, {1, 1, 1, 1}), StepBarrier::PushOutcome::kApplied);
    EXPECT_TRUE(b.pull(0, 0, [&] { ++released; })) << "step " << step << ": lead " << step << " <= 2";
  }
  push(b, 0, {1, 1, 1, 1});
  EXPECT_FALSE(b.pull(0, 0, [&] { ++released; })) << "lead 3 > 2";
  EXPECT_TRUE(b.waiting());
  // Applied as they came: x = −0.5·3.
  EXPECT_EQ(values(st), (std::vector<float>{-1.5f, -1.5f, -1.5f, -1.5f}));
  EXPECT_EQ(released, 0);
  push(b, 1, {2, 2, 2, 2});  // worker 1 at 1: lead 2, released; x −= 0.5·2
  EXPECT_EQ(released, 1);
  EXPECT_FALSE(b.waiting());
  EXPECT_EQ(values(st), (std::vector<float>{-2.5f, -2.5f, -2.5f, -2.5f}));
  const auto s = b.stats();
  EXPECT_EQ(s.waits, 1u);
  EXPECT_EQ(s.max_lead, 2u);
  EXPECT_EQ(b.clock(0, 0), 3);
  EXPECT_EQ(b.clock(1, 0), 1);
}

// A pull that waits longer than the barrier timeout drops the worker it waits for; that
// worker's next push rejoins it at the slowest other worker's clock.
TEST(StepBarrier, SspTimeoutDropsTheLaggardWhichRejoinsWithItsNextPush) {
  ShardState st(0.0);
  st.init(0, std::vector<float>{0, 0, 0, 0});
  StepBarrier b(ssp(0, 50ms), st);
  b.join(0, 2);
  b.join(1, 2);
  int released = 0;
  push(b, 0, {1, 1, 1, 1});
  ASSERT_FALSE(b.pull(0, 0, [&] { ++released; }));
  EXPECT_TRUE(b.expire(std::chrono::steady_clock::now()).empty()) << "not yet 50 ms";
  const auto gone = b.expire(std::chrono::steady_clock::now() + 100ms);
  EXPECT_EQ(gone, (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(released, 1);
  EXPECT_EQ(b.stats().dropped, 1u);
  // Worker 0 goes on alone.
  push(b, 0, {1, 1, 1, 1});
  EXPECT_TRUE(b.pull(0, 0, [] {}));
  // Worker 1 comes back: it joins at worker 0's clock (2) and its push counts from there.
  push(b, 1, {1, 1, 1, 1});
  EXPECT_EQ(b.stats().rejoins, 1u);
  EXPECT_EQ(b.clock(1, 0), 3);
  // Now worker 1 (3) is ahead of worker 0 (2): with s = 0 it waits for worker 0's push.
  int released1 = 0;
  EXPECT_FALSE(b.pull(1, 0, [&] { ++released1; }));
  EXPECT_TRUE(b.pull(0, 0, [] {}));
  push(b, 0, {1, 1, 1, 1});
  EXPECT_EQ(released1, 1);
}

// BSP on the barrier alone: the step applies Σ g with the first push's learning rate
// once both workers pushed, with momentum m = 0.5: v = m·v + G, x = x − lr·v.
TEST(StepBarrier, BspAppliesTheSumOfTheStepOnceEveryWorkerPushed) {
  ShardState st(0.5);
  st.init(0, std::vector<float>{8, 8, 8, 8});
  StepBarrier b(bsp(), st);
  b.join(0, 2);
  b.join(1, 2);
  int released = 0;
  EXPECT_EQ(push(b, 0, {1, 2, 3, 4}), StepBarrier::PushOutcome::kStaged);
  EXPECT_FALSE(b.pull(0, 0, [&] { ++released; }));
  EXPECT_EQ(values(st), (std::vector<float>{8, 8, 8, 8})) << "nothing applied before the step is complete";
  EXPECT_EQ(push(b, 1, {3, 2, 1, 0}), StepBarrier::PushOutcome::kStaged);
  EXPECT_EQ(released, 1);
  // G = {4, 4, 4, 4}, v = G, x = 8 − 0.5·4 = 6.
  EXPECT_EQ(values(st), (std::vector<float>{6, 6, 6, 6}));
  EXPECT_TRUE(b.pull(1, 0, [] {}));
  // Step 2: G = {0, 0, 2, 2}: v = {2, 2, 4, 4}, x = {5, 5, 4, 4}.
  push(b, 1, {0, 0, 1, 1});
  push(b, 0, {0, 0, 1, 1});
  EXPECT_EQ(values(st), (std::vector<float>{5, 5, 4, 4}));
  EXPECT_EQ(b.stats().steps, 2u);
  EXPECT_EQ(st.partition_pushes(0), 4u);
  // A second push for the open step before its application is dropped (late).
  push(b, 0, {1, 1, 1, 1});
  EXPECT_EQ(push(b, 0, {1, 1, 1, 1}), StepBarrier::PushOutcome::kLate);
  EXPECT_EQ(b.stats().late_pushes, 1u);
}

// The first hello fixes the worker count; backup_workers must be below it.
TEST(StepBarrier, HellosMustAgreeOnTheWorkerCount) {
  ShardState st(0.0);
  StepBarrier b(bsp(1), st);
  EXPECT_THROW(b.join(0, 1), ProtocolError);  // 1 backup worker of 1
  b.join(0, 3);
  EXPECT_THROW(b.join(1, 4), ProtocolError);
}

// Three workers, two shards, dense pushes, shard momentum 0.5, lr 0.25. Every worker's
// parameters after each of its push/pulls equal the synchronous update:
//   step 1: g = 1, 2, 3 → G = 6, v = 6, x = x0 − 1.5
//   step 2: g = −1, 0.5, 0.5 → G = 0, v = 3, x = x0 − 2.25
TEST(Bsp, ThreeWorkersSeeTheHandComputedSynchronousUpdateAfterEveryStep) {
  PsShards shards(2, 0.5, make_layout({4, 4}, 4, 2), bsp());
  std::vector<float> x0(8);
  std::iota(x0.begin(), x0.end(), 1.0f);
  const std::vector<std::vector<float>> g1{{1}, {2}, {3}}, g2{{-1}, {0.5f}, {0.5f}};
  std::vector<std::vector<std::vector<float>>> seen(3);
  shards.run_workers(3, x0, [&](std::uint32_t r, PsClient& w, std::vector<float>& params) {
    for (const auto* g : {&g1, &g2}) {
      w.push_pull(std::vector<float>(8, (*g)[r][0]), 0.25f, params);
      seen[r].push_back(params);
    }
    w.done();
  });
  std::vector<float> after1(8), after2(8);
  for (int i = 0; i < 8; ++i) {
    after1[i] = x0[i] - 1.5f;
    after2[i] = x0[i] - 2.25f;
  }
  for (std::uint32_t r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[r].size(), 2u) << "worker " << r;
    EXPECT_EQ(seen[r][0], after1) << "worker " << r << " after step 1";
    EXPECT_EQ(seen[r][1], after2) << "worker " << r << " after step 2";
  }
  for (const auto& s : shards.servers) {
    EXPECT_EQ(s->sync_stats().steps, 2u);
    EXPECT_EQ(s->sync_stats().late_pushes, 0u);
  }
  for (const auto& st : shards.states) EXPECT_EQ(st->pushes(), 6u);
}

// The same with sparse pushes (top-k as DGC sends them; shard momentum 0): worker r
// pushes value r+1 at coordinate r of each partition and 1 at coordinate 3, lr 0.5.
//   step 1: G = {1, 2, 3, 3} per partition, x = x0 − 0.5·G
TEST(Bsp, SparsePushesAreSummedIntoTheStep) {
  PsShards shards(1, 0.0, make_layout({4, 4}, 4, 1), bsp());
  std::vector<float> x0(8, 10.0f);
  std::vector<std::vector<float>> seen(3);
  shards.run_workers(3, x0, [&](std::uint32_t r, PsClient& w, std::vector<float>& params) {
    const std::vector<std::uint32_t> idx{r, 3};
    const std::vector<float> val{static_cast<float>(r + 1), 1.0f};
    std::vector<PartitionPush> pushes(2);
    for (auto& pp : pushes) {
      pp.codec = wire::Codec::kSparseF32;
      pp.count = 2;
      pp.first = std::as_bytes(std::span(idx));
      pp.second = std::as_bytes(std::span(val));
    }
    w.push_pull(pushes, 0.5f, 1.0, params);
    seen[r] = params;
  });
  const std::vector<float> want{9.5f, 9.0f, 8.5f, 8.5f, 9.5f, 9.0f, 8.5f, 8.5f};
  for (std::uint32_t r = 0; r < 3; ++r) EXPECT_EQ(seen[r], want) << "worker " << r;
  EXPECT_EQ(shards.servers[0]->sync_stats().steps, 2u);  // one per partition
}

// Backup workers (b = 1 of 3, shard momentum 0, lr 0.5, one shard, partitions {4, 4}):
// a step is applied with the first two pushes, rescaled by 3/2; the third is dropped as
// late and its worker reads the step it missed.
//   step 1: w0 g = 1, w1 g = 3 → G = 1.5·4 = 6, x = 10 − 3 = 7; w2's push (100) late
//   step 2: w2 g = 2, w0 g = 2 → G = 1.5·4 = 6, x = 7 − 3 = 4; w1's push (100) late
TEST(Bsp, BackupWorkersDropExactlyTheLatePushes) {
  PsShards shards(1, 0.0, make_layout({4, 4}, 4, 1), bsp(1));
  const std::vector<float> x0(8, 10.0f);
  auto w0 = shards.client(PsShards::client_options(0, 3));
  auto w1 = shards.client(PsShards::client_options(1, 3));
  auto w2 = shards.client(PsShards::client_options(2, 3));
  std::vector<float> p0(8), p1(8), p2(8);
  for (auto* w : {&w0, &w1, &w2}) w->connect();
  w0.init(x0);
  w0.pull(p0);
  w1.pull(p1);
  w2.pull(p2);
  const auto& server = *shards.servers[0];
  std::thread t0([&] { w0.push_pull(std::vector<float>(8, 1.0f), 0.5f, p0); });
  w1.push_pull(std::vector<float>(8, 3.0f), 0.5f, p1);
  t0.join();
  EXPECT_EQ(p0, std::vector<float>(8, 7.0f));
  EXPECT_EQ(p1, std::vector<float>(8, 7.0f));
  w2.push_pull(std::vector<float>(8, 100.0f), 0.5f, p2);  // late: dropped, reads step 1
  EXPECT_EQ(p2, std::vector<float>(8, 7.0f));
  EXPECT_EQ(server.sync_stats().late_pushes, 2u);  // one per partition

  const auto waits = server.sync_stats().waits;
  std::thread t2([&] { w2.push_pull(std::vector<float>(8, 2.0f), 0.5f, p2); });
  ASSERT_TRUE(eventually([&] { return server.sync_stats().waits > waits; })) << "w2's pull never waited";
  w0.push_pull(std::vector<float>(8, 2.0f), 0.5f, p0);
  t2.join();
  EXPECT_EQ(p0, std::vector<float>(8, 4.0f));
  EXPECT_EQ(p2, std::vector<float>(8, 4.0f));
  w1.push_pull(std::vector<float>(8, 100.0f), 0.5f, p1);
  EXPECT_EQ(p1, std::vector<float>(8, 4.0f));
  const auto s = server.sync_stats();
  EXPECT_EQ(s.late_pushes, 4u);
  EXPECT_EQ(s.steps, 4u);
  EXPECT_EQ(shards.states[0]->pushes(), 8u) << "2 pushes in each of 2 steps of 2 partitions";
}

// A worker whose connection closes is not waited for: the other two finish the step
// without it; a replacement of the same rank joins at the current step and takes part
// in the next. Shard momentum 0, lr 0.5, partitions {4}.
//   step 1: 1 + 1 + 1 = 3 → x = 10 − 1.5 = 8.5
//   step 2 (w2 gone): 1 + 1 = 2 → x = 7.5
//   step 3 (w2's replacement back): 1 + 1 + 2 = 4 → x = 5.5
TEST(Bsp, AWorkerThatDisconnectsIsDroppedAndItsReplacementJoinsAtTheCurrentStep) {
  PsShards shards(1, 0.0, make_layout({4}, 4, 1), bsp());
  const std::vector<float> x0(4, 10.0f);
  auto w0 = shards.client(PsShards::client_options(0, 3));
  auto w1 = shards.client(PsShards::client_options(1, 3));
  std::vector<float> p0(4), p1(4), p2(4);
  w0.connect();
  w1.connect();
  w0.init(x0);
  const auto& server = *shards.servers[0];
  {
    auto w2 = shards.client(PsShards::client_options(2, 3));
    w2.connect();
    std::thread a([&] { w0.push_pull(std::vector<float>(4, 1.0f), 0.5f, p0); });
    std::thread b([&] { w1.push_pull(std::vector<float>(4, 1.0f), 0.5f, p1); });
    w2.push_pull(std::vector<float>(4, 1.0f), 0.5f, p2);
    a.join();
    b.join();
    EXPECT_EQ(p2, std::vector<float>(4, 8.5f));
  }  // w2's connection closes
  std::thread a([&] { w0.push_pull(std::vector<float>(4, 1.0f), 0.5f, p0); });
  w1.push_pull(std::vector<float>(4, 1.0f), 0.5f, p1);
  a.join();
  EXPECT_EQ(p0, std::vector<float>(4, 7.5f));
  EXPECT_EQ(p1, std::vector<float>(4, 7.5f));
  EXPECT_EQ(server.sync_stats().departures, 1u);
  auto w2b = shards.client(PsShards::client_options(2, 3));
  w2b.connect();
  w2b.pull(p2);  // answered at once: it joined at step 2
  EXPECT_EQ(p2, std::vector<float>(4, 7.5f));
  std::thread c([&] { w0.push_pull(std::vector<float>(4, 1.0f), 0.5f, p0); });
  std::thread d([&] { w1.push_pull(std::vector<float>(4, 1.0f), 0.5f, p1); });
  w2b.push_pull(std::vector<float>(4, 2.0f), 0.5f, p2);
  c.join();
  d.join();
  for (const auto* p : {&p0, &p1, &p2}) EXPECT_EQ(*p, std::vector<float>(4, 5.5f));
  EXPECT_EQ(server.sync_stats().rejoins, 1u);
  EXPECT_EQ(server.sync_stats().steps, 3u);
}

// A worker that stays silent (hung, or suspended) past the barrier timeout is dropped and
// the step goes on without it. 200 ms timeout; two workers, w1 never pushes.
TEST(Bsp, ASilentWorkerIsDroppedAfterTheBarrierTimeout) {
  PsShards shards(1, 0.0, make_layout({4}, 4, 1), bsp(0, 200ms));
  auto w0 = shards.client(PsShards::client_options(0, 2));
  auto w1 = shards.client(PsShards::client_options(1, 2));
  w0.connect();
  w1.connect();
  std::vector<float> p0(4), p1(4);
  w0.init(std::vector<float>(4, 1.0f));
  w0.push_pull(std::vector<float>(4, 1.0f), 0.5f, p0);  // waits ~200 ms, then applies alone
  EXPECT_EQ(p0, std::vector<float>(4, 0.5f));
  const auto s = shards.servers[0]->sync_stats();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.waits, 1u);
  EXPECT_GT(s.wait_seconds, 0.0);
  // w1's first push was for the step it missed: dropped; it reads the current values.
  w1.push_pull(std::vector<float>(4, 50.0f), 0.5f, p1);
  EXPECT_EQ(p1, std::vector<float>(4, 0.5f));
  EXPECT_EQ(shards.servers[0]->sync_stats().late_pushes, 1u);
}

// SSP with s = 0 ends where BSP ends (shard momentum 0: both apply x −= lr·g for every
// push; SSP one by one, BSP summed per step). Three workers, three steps, lr 0.25,
// worker r pushes r + step: Σ = (1+2+3) + (2+3+4) + (3+4+5) = 27 → x = 10 − 6.75.
TEST(Ssp, StalenessZeroEndsWithBspsParameters) {
  for (const auto& opt : {ssp(0), bsp()}) {
    PsShards shards(2, 0.0, make_layout({4, 4}, 4, 2), opt);
    const std::vector<float> x0(8, 10.0f);
    std::vector<std::vector<float>> final(3, std::vector<float>(8));
    shards.run_workers(3, x0, [&](std::uint32_t r, PsClient& w, std::vector<float>& params) {
      for (int step = 1; step <= 3; ++step) {
        w.push_pull(std::vector<float>(8, static_cast<float>(r + step)), 0.25f, params);
      }
      w.done();
      // Every worker's pushes are in once all are done.
      dltrain::testing::wait_until([&] { return w.workers_done() >= 3; }, 10s, 1ms);
      w.pull(final[r]);
    });
    for (std::uint32_t r = 0; r < 3; ++r) {
      EXPECT_EQ(final[r], std::vector<float>(8, 3.25f)) << enum_name(opt.mode) << ", worker " << r;
    }
    for (const auto& s : shards.servers) EXPECT_EQ(s->sync_stats().max_lead, 0u) << enum_name(opt.mode);
  }
}

// ------------------------------------------------------------------ elastic jobs

namespace {
SyncOptions elastic(SyncOptions o, std::uint32_t initial) {
  o.elastic = true;
  o.initial_workers = initial;
  return o;
}
}  // namespace

// BSP, momentum 0, lr 0.5, max 3 workers, 1 at the start (x = 8):
//   steps 1, 2: worker 0 alone, G = 2 each: x = 7, then 6 (rank 1 is no member yet)
//   worker 1 joins at the applied step; step 3 waits for both: G = 2 + 4, x = 6 − 3 = 3
//   step 4: worker 1 pushes 2 and leaves before worker 0's push: its push counts,
//           G = 2 + 2, x = 3 − 2 = 1
//   step 5: worker 0 alone again, answered at once: x = 1 − 1 = 0.
TEST(StepBarrier, ElasticBspMembersJoinMidStepAndNoStepWaitsForOneThatLeft) {
  ShardState st(0.0);
  st.init(0, std::vector<float>{8, 8, 8, 8});
  StepBarrier b(elastic(bsp(), 1), st);
  b.join(0, 3);
  EXPECT_EQ(b.members_training(), 1u);
  EXPECT_EQ(push(b, 0, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);
  EXPECT_EQ(values(st), (std::vector<float>{7, 7, 7, 7})) << "step 1 does not wait for ranks that never joined";
  EXPECT_TRUE(b.pull(0, 0, [] {}));
  EXPECT_EQ(push(b, 0, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);  // step 2, applied at once
  EXPECT_EQ(values(st), (std::vector<float>{6, 6, 6, 6}));
  b.join(1, 3);
  EXPECT_EQ(b.members_training(), 2u);
  EXPECT_EQ(b.stats().joins, 1u);
  // Step 3 needs both: worker 0's push alone is staged.
  int released = 0;
  EXPECT_EQ(push(b, 0, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);
  EXPECT_FALSE(b.pull(0, 0, [&] { ++released; }));
  EXPECT_EQ(values(st), (std::vector<float>{6, 6, 6, 6}));
  EXPECT_TRUE(b.pull(1, 0, [] {})) << "the new member reads the applied step";
  EXPECT_EQ(push(b, 1, {4, 4, 4, 4}), StepBarrier::PushOutcome::kStaged);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(values(st), (std::vector<float>{3, 3, 3, 3}));
  // Step 4: worker 1 pushes, then leaves before worker 0 pushes; its push counts.
  EXPECT_EQ(push(b, 1, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);
  EXPECT_EQ(b.leave_job(1), 1u);
  EXPECT_EQ(push(b, 0, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);
  EXPECT_EQ(values(st), (std::vector<float>{1, 1, 1, 1}));
  // Step 5: worker 0 alone, answered at once.
  EXPECT_EQ(push(b, 0, {2, 2, 2, 2}), StepBarrier::PushOutcome::kStaged);
  EXPECT_TRUE(b.pull(0, 0, [] {}));
  EXPECT_EQ(values(st), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(b.stats().leaves, 1u);
  EXPECT_EQ(b.stats().dropped, 0u);
  EXPECT_EQ(b.members_training(), 1u);
}

// A pull held up by a member is released the moment that member leaves (leave_job), not
// by the barrier timeout; SSP likewise.
TEST(StepBarrier, ElasticLeaveReleasesThePullsTheLeaverHeldUp) {
  for (const auto& o : {bsp(), ssp(0)}) {
    ShardState st(0.0);
    st.init(0, std::vector<float>{0, 0, 0, 0});
    StepBarrier b(elastic(o, 2), st);
    b.join(0, 3);
    b.join(1, 3);
    int released = 0;
    push(b, 0, {1, 1, 1, 1});
    EXPECT_FALSE(b.pull(0, 0, [&] { ++released; }));
    EXPECT_EQ(b.leave_job(1), 1u);
    EXPECT_EQ(released, 1);
    EXPECT_EQ(b.stats().dropped, 0u);
    EXPECT_EQ(b.stats().leaves, 1u);
  }
}

// Members are counted in async mode too (rank 0's end waits for them), a finished worker
// is no member, and leave needs an elastic job.
TEST(StepBarrier, ElasticMembersAreCountedInEveryMode) {
  ShardState st(0.0);
  SyncOptions async;
  StepBarrier b(elastic(async, 2), st);
  EXPECT_EQ(b.members_training(), 2u) << "before any hello: the starting members";
  b.join(0, 4);
  b.join(3, 4);
  EXPECT_EQ(b.members_training(), 3u);
  st.mark_done(0);
  b.done(0);
  EXPECT_EQ(b.members_training(), 2u);
  b.leave_job(3);
  EXPECT_EQ(b.members_training(), 1u);  // rank 1, which has not said hello yet
  ShardState st2(0.0);
  StepBarrier fixed(bsp(), st2);
  fixed.join(0, 2);
  EXPECT_THROW(fixed.leave_job(0), ProtocolError);
  EXPECT_EQ(fixed.members_training(), 0u);
}

// A member whose connection closed without a leave or done (its machine died) is a member
// for member_grace, then gone; reconnecting in time keeps it a member.
TEST(StepBarrier, ElasticMemberAwayLongerThanTheGraceIsGone) {
  ShardState st(0.0);
  SyncOptions o;
  o.member_grace = 50ms;
  StepBarrier b(elastic(o, 2), st);
  const auto t0 = b.join(0, 3);
  const auto t1 = b.join(1, 3);
  (void)t0;
  b.leave(1, t1);  // connection closed
  EXPECT_EQ(b.members_training(), 2u) << "within the grace";
  EXPECT_TRUE(b.gone().empty());
  b.join(1, 3);  // a resync
  EXPECT_EQ(b.members_training(), 2u);
  const auto t1b = b.join(1, 3);
  b.leave(1, t1b);
  EXPECT_TRUE(eventually([&] { return b.members_training() == 1u; }));
  EXPECT_EQ(b.gone(), (std::vector<std::uint32_t>{1}));
}
