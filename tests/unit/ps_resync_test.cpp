// A worker's recovery after a PS shard restarts (PsClient::resync): from the shard's
// checkpoint or the freshest replica offered, whichever has seen more pushes, or a clear
// error when it does not come back.
#include <chrono>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"
#include "support/ps_shards.h"
#include "support/temp_dir.h"

using namespace dltrain;
using namespace dltrain::ps;
using dltrain::testing::kSecret;

namespace {

// One shard whose process can "die" (the server is destroyed, closing every
// connection) and "restart" on the same port with a given state.
struct RestartableShard {
  PsServerOptions opt;
  std::unique_ptr<PsServer> server;
  std::uint16_t port = 0;
  RestartableShard() {
    opt.bind_address = "127.0.0.1";
    opt.job = 42;
    opt.generation = 1;
    opt.secret = kSecret;
  }
  void start(std::shared_ptr<ShardState> st) {
    opt.port = port;
    server = std::make_unique<PsServer>(opt, std::move(st));
    server->start();
    port = server->port();
  }
  void kill() { server.reset(); }
};

PsClientOptions resync_options(std::uint32_t rank) {
  PsClientOptions o;
  o.job = 42;
  o.generation = 1;
  o.secret = kSecret;
  o.rank = rank;
  o.num_workers = 2;
  o.timeout = std::chrono::milliseconds(5000);
  o.reconnect_timeout = std::chrono::milliseconds(5000);
  return o;
}

// Worker `rank`'s client of `shard` for a model of 4 floats in one partition, connected.
std::unique_ptr<PsClient> connect_worker(const RestartableShard& shard, std::uint32_t rank) {
  auto w = std::make_unique<PsClient>(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, make_layout({4}, 4, 1),
                                      resync_options(rank));
  w->connect();
  return w;
}

// A shard on a fresh state and two connected workers of a 4-float model, worker 0
// having offered p0 = {1, 2, 3, 4} as the initial parameters; p1 is worker 1's replica.
class ResyncOfTwo : public ::testing::Test {
 protected:
  ResyncOfTwo() {
    shard.start(st);
    c0 = connect_worker(shard, 0);
    c1 = connect_worker(shard, 1);
    c0->init(p0);
  }
  RestartableShard shard;
  std::shared_ptr<ShardState> st = std::make_shared<ShardState>(0.0);
  std::unique_ptr<PsClient> c0, c1;
  std::vector<float> p0{1, 2, 3, 4}, p1 = std::vector<float>(4);
};

}  // namespace

TEST(Resync, AShardRestartedFromAnOlderCheckpointIsRebuiltFromTheFresherReplica) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  RestartableShard shard;
  auto st = std::make_shared<ShardState>(0.0);
  shard.start(st);
  auto c = connect_worker(shard, 0);
  PsClient& w = *c;
  std::vector<float> params{1, 2, 3, 4};
  w.init(params);
  EXPECT_EQ(w.seen_pushes(0), 0u);
  std::vector<float> g(4, 1.0f);
  w.push_pull(g, 0.5f, params);  // x = {0.5, 1.5, 2.5, 3.5}, 1 push
  ShardCheckpointer(path.string(), 42, 0, st).save();
  w.push_pull(g, 0.5f, params);  // x = {0, 1, 2, 3}, 2 pushes: after the checkpoint
  EXPECT_EQ(w.seen_pushes(0), 2u);
  shard.kill();

  // The restarted shard loads the checkpoint (1 push) before it listens, on the same port.
  auto restored = std::make_shared<ShardState>(0.0);
  restored->restore(std::move(*read_checkpoint_file(path.string(), 42, 0)));
  ASSERT_EQ(restored->partition_pushes(0), 1u);
  shard.start(restored);
  EXPECT_THROW(w.push_pull(g, 0.5f, params), PsConnectionLost);
  w.resync(params);
  // The worker's replica {0, 1, 2, 3} has seen 2 pushes, the checkpoint 1: the shard is
  // rebuilt from the replica, and the push after the checkpoint is not lost.
  EXPECT_EQ(params, (std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(restored->rebuilds(), 1u);
  EXPECT_EQ(restored->partition_pushes(0), 2u);
  w.push_pull(g, 0.5f, params);
  EXPECT_EQ(params, (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(w.seen_pushes(0), 3u);
}

TEST_F(ResyncOfTwo, ACheckpointFresherThanTheReplicaIsKept) {
  dltrain::testing::TempDir dir;
  const auto path = dir.path / "shard.ckpt";
  PsClient &w0 = *c0, &w1 = *c1;
  std::vector<float> g(4, 1.0f);
  w0.push_pull(g, 0.5f, p0);  // x = {0.5, 1.5, 2.5, 3.5}, 1 push
  w1.pull(p1);                // worker 1's replica: 1 push
  w0.push_pull(g, 0.5f, p0);  // 2 pushes
  w0.push_pull(g, 0.5f, p0);  // x = {-0.5, 0.5, 1.5, 2.5}, 3 pushes
  ShardCheckpointer(path.string(), 42, 0, st).save();
  shard.kill();
  auto restored = std::make_shared<ShardState>(0.0);
  restored->restore(std::move(*read_checkpoint_file(path.string(), 42, 0)));
  shard.start(restored);
  EXPECT_THROW(w1.pull(p1), PsConnectionLost);
  w1.resync(p1);
  // Worker 1's replica (1 push) is older than the checkpoint (3): the checkpoint stays.
  EXPECT_EQ(p1, (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(restored->rebuilds(), 0u);
  EXPECT_EQ(w1.seen_pushes(0), 3u);
}

TEST_F(ResyncOfTwo, OfSeveralReplicasTheFreshestRebuildsTheShard) {
  PsClient &w0 = *c0, &w1 = *c1;
  std::vector<float> g(4, 1.0f);
  w0.push_pull(g, 0.5f, p0);  // worker 0: {0.5, 1.5, 2.5, 3.5} at 1 push
  w1.push_pull(g, 0.5f, p1);  // worker 1: {0, 1, 2, 3} at 2 pushes
  shard.kill();
  auto fresh = std::make_shared<ShardState>(0.0);  // no checkpoint
  shard.start(fresh);
  // Worker 0 comes back first: the empty shard takes its replica (1 push).
  EXPECT_THROW(w0.pull(p0), PsConnectionLost);
  w0.resync(p0);
  EXPECT_EQ(p0, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  // Worker 1's replica has seen 2: it replaces worker 0's, and worker 0's next pull
  // brings it there.
  EXPECT_THROW(w1.pull(p1), PsConnectionLost);
  w1.resync(p1);
  EXPECT_EQ(p1, (std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(fresh->rebuilds(), 1u);
  w0.pull(p0);
  EXPECT_EQ(p0, p1);
}

TEST_F(ResyncOfTwo, AShardRestartedWithoutACheckpointIsRebuiltFromTheFirstReplicaOffered) {
  PsClient &w0 = *c0, &w1 = *c1;
  w0.pull(p0);  // init has no reply: the pull on the same connection orders it
  w1.pull(p1);
  EXPECT_EQ(p1, p0);
  w0.done();
  shard.kill();
  auto fresh = std::make_shared<ShardState>(0.0);
  shard.start(fresh);
  EXPECT_THROW(w0.workers_done(), PsConnectionLost);
  p0 = {9, 8, 7, 6};  // this worker's replica moved on
  w0.resync(p0);
  EXPECT_EQ(p0, (std::vector<float>{9, 8, 7, 6}));
  // The second worker finds its connection gone too and gets the first replica.
  p1 = {0, 0, 0, 0};
  EXPECT_THROW(w1.pull(p1), PsConnectionLost);
  w1.resync(p1);
  EXPECT_EQ(p1, (std::vector<float>{9, 8, 7, 6}));
  EXPECT_EQ(fresh->num_partitions(), 1u);
}

TEST(Resync, GivesUpWithAClearErrorWhenTheShardDoesNotComeBack) {
  RestartableShard shard;
  shard.start(std::make_shared<ShardState>(0.0));
  auto o = resync_options(0);
  o.reconnect_timeout = std::chrono::milliseconds(700);
  PsClient w(std::vector<PsEndpoint>{{"127.0.0.1", shard.port}}, make_layout({4}, 4, 1), o);
  w.connect();
  std::vector<float> p{1, 2, 3, 4};
  w.init(p);
  shard.kill();
  try {
    w.pull(p);
    ADD_FAILURE() << "the pull succeeded without a shard";
  } catch (const PsConnectionLost& e) {
    EXPECT_EQ(e.shard(), 0u);
    EXPECT_NE(std::string(e.what()).find("connection lost"), std::string::npos) << e.what();
  }
  try {
    w.resync(p);
    ADD_FAILURE() << "resynced without a shard";
  } catch (const PsConnectionLost&) {
    ADD_FAILURE() << "resync must end with a plain IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reconnect to the PS shards within 700 ms"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
  }
}

// A pull started with start_pull hands its values, or its error, to the handle's wait();
// the handle is inactive afterwards, and waiting on an inactive one returns at once.
TEST_F(ResyncOfTwo, APullInFlightHandsItsValuesOrItsErrorToWait) {
  std::vector<float> got(4);
  auto pending = c0->start_pull(got, 1.0);
  EXPECT_TRUE(pending.active());
  pending.wait();
  EXPECT_FALSE(pending.active());
  EXPECT_EQ(got, p0);  // what worker 0 offered: the shard's first init
  pending.wait();
  shard.kill();
  auto lost = c0->start_pull(got, 1.0);
  EXPECT_THROW(lost.wait(), PsConnectionLost);
  EXPECT_FALSE(lost.active());
}
