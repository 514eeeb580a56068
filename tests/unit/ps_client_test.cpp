// PsClient against a shard played by the test: the silence timeout, the stop flag (also
// during resync), a worker suspended past its timeout (a real child process,
// ps_client_child), a malformed pull reply, and the handle of a push or pull in flight (PsWork).
#include <signal.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/secret.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "support/process.h"
#include "support/ps_shards.h"
#include "support/temp_dir.h"
#include "support/wait.h"
#include "wire/auth.h"
#include "wire/frame.h"

using namespace dltrain;
using namespace dltrain::ps;
using namespace dltrain::testing;
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// A PS shard played by the test: it answers exactly when the test says so. Accepting and
// reading are bounded by `timeout` and report whether they completed.
struct ScriptedShard {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  tcp::socket sock{io};

  std::uint16_t port() const { return acceptor.local_endpoint().port(); }

  bool run(std::chrono::seconds timeout, const bool& done) {
    io.restart();
    io.run_for(timeout);
    return done;
  }
  bool accept(std::chrono::seconds timeout) {
    bool done = false;
    acceptor.async_accept(sock, [&](boost::system::error_code ec) { done = !ec; });
    return run(timeout, done);
  }
  // The shard's side of the authentication handshake for job 42, generation 1: sends a
  // challenge, reads the worker's answer and proves knowledge of kSecret.
  bool handshake(std::chrono::seconds timeout) {
    const auto nonce = wire::random_nonce();
    std::array<std::uint8_t, wire::kChallengeSize> c{};
    wire::encode_challenge(nonce, c);
    asio::write(sock, asio::buffer(c));
    std::array<std::uint8_t, wire::kAnswerSize> a{};
    bool done = false;
    asio::async_read(sock, asio::buffer(a), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
    if (!run(timeout, done)) return false;
    const auto answer = wire::decode_answer(a);
    if (!wire::macs_equal(answer.mac, wire::auth_mac(kSecret, nonce, 42, 1, wire::kWorkerContext))) return false;
    std::array<std::uint8_t, wire::kProofSize> proof{};
    wire::encode_proof(wire::auth_mac(kSecret, answer.nonce, 42, 1, wire::kShardContext), proof);
    asio::write(sock, asio::buffer(proof));
    return true;
  }
  // Reads one frame; its payload goes to `payload`.
  std::optional<wire::FrameHeader> read_frame(std::chrono::seconds timeout, std::vector<std::byte>* payload = nullptr) {
    std::array<std::byte, wire::kHeaderSize> hdr{};
    bool done = false;
    asio::async_read(sock, asio::buffer(hdr), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
    if (!run(timeout, done)) return std::nullopt;
    auto h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr));
    std::vector<std::byte> body(h.payload_bytes);
    done = body.empty();
    if (!done) {
      asio::async_read(sock, asio::buffer(body), [&](boost::system::error_code ec, std::size_t) { done = !ec; });
      if (!run(timeout, done)) return std::nullopt;
    }
    if (payload != nullptr) *payload = std::move(body);
    return h;
  }
  void write_frame(wire::FrameHeader h, const std::vector<float>& values = {}) {
    h.job = 42;
    h.generation = 1;
    auto b = header_bytes(h);
    append(b, values);
    asio::write(sock, asio::buffer(b));
  }
  /// Answers the pull numbered `seq` of partition 0 with `values` (dense).
  void reply_to_pull(std::uint64_t seq, const std::vector<float>& values) {
    wire::FrameHeader reply;
    reply.type = wire::MessageType::kPullReply;
    reply.seq = seq;
    reply.key = 0;
    reply.codec = wire::Codec::kDenseF32;
    reply.count = static_cast<std::uint32_t>(values.size());
    reply.payload_bytes = reply.count * 4;
    write_frame(reply, values);
  }
  /// Accepts the worker's connection, authenticates it, acknowledges its hello and reads
  /// its first pull; nullopt when any of it did not happen within `timeout` each.
  std::optional<wire::FrameHeader> first_pull(std::chrono::seconds timeout) {
    if (!accept(timeout) || !handshake(timeout)) return std::nullopt;
    auto hello = read_frame(timeout);
    if (!hello) return std::nullopt;
    ack_hello(hello->seq);
    return read_frame(timeout);
  }
  /// Accepts the hello numbered `seq` (a worker waits for this before it sends more).
  void ack_hello(std::uint64_t seq) {
    wire::FrameHeader ack;
    ack.type = wire::MessageType::kHelloAck;
    ack.seq = seq;
    ack.count = 1;
    write_frame(ack);
  }
};

}  // namespace

// The client's timeout bounds the shards' silence: a PS that never answers fails the
// call with TimeoutError naming it.
TEST(PsClientTimeout, AShardThatNeverAnswersFailsTheCall) {
  ScriptedShard shard;  // listens (the kernel completes the connection) but never replies
  auto o = PsShards::client_options(0, 1);
  o.timeout = std::chrono::milliseconds(300);
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  try {
    client.connect();
    FAIL() << "connect succeeded against a silent shard";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), "PS authentication handshake: no reply for 300 ms");
  }
}

// A worker asked to stop (its SIGTERM handler sets the flag) gives up a call on a silent
// shard at once, with StopRequested, not after its PS timeout: it must save its replica
// within its agent's stop grace.
TEST(PsClientStop, AStopRequestEndsACallOnASilentShardWellBeforeTheTimeout) {
  using namespace std::chrono_literals;
  ScriptedShard shard;  // accepts (the kernel does) but never answers
  std::atomic<bool> stop{false};
  auto o = PsShards::client_options(0, 1);
  o.timeout = std::chrono::milliseconds(60000);
  o.stop_requested = &stop;
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  // The stop comes while the call waits on the silent shard: once the shard has accepted
  // the client's connection (the client then waits for a challenge that never comes), and
  // no earlier than 300 ms into the call. The stop is set even if the accept fails, so the
  // test cannot hang for the 60 s timeout.
  const auto t0 = std::chrono::steady_clock::now();
  bool accepted = false;
  std::thread stopper([&] {
    accepted = shard.accept(30s);
    std::this_thread::sleep_until(t0 + 300ms);
    stop = true;
  });
  EXPECT_THROW(client.connect(), StopRequested);
  const auto waited = std::chrono::steady_clock::now() - t0;
  stopper.join();
  EXPECT_TRUE(accepted) << "the client never connected to the shard";
  // 300 ms until the flag, then one 100 ms slice at most; far below the 60 s timeout.
  EXPECT_LT(waited, 5s);
  EXPECT_GE(waited, 300ms);
}

// The same while resync() backs off against a shard that is gone (its port refuses).
TEST(PsClientStop, AStopRequestEndsResyncWhileTheShardIsGone) {
  using namespace std::chrono_literals;
  auto srv = std::make_unique<ScriptedShard>();
  const auto port = srv->port();
  srv.reset();  // nothing listens there any more
  std::atomic<bool> stop{true};
  auto o = PsShards::client_options(0, 1);
  o.timeout = 1000ms;
  o.reconnect_timeout = 60000ms;
  o.stop_requested = &stop;
  PsClient client({{"127.0.0.1", port}}, make_layout({4}, 4, 1), o);
  std::vector<float> params(4, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(client.resync(params), StopRequested);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// A worker suspended (SIGSTOP, as a straggler or a paused VM is) while it waits for a
// pull reply, and kept stopped past its PS timeout while the reply sits in its socket,
// takes that reply when it resumes: the time it did not run is not the PS's silence.
TEST(PsClientTimeout, AWorkerSuspendedPastItsTimeoutTakesTheReplyWaitingForIt) {
  using namespace std::chrono_literals;
  dltrain::testing::TempDir dir("dltrain-ps");
  ScriptedShard shard;
  const std::string out = (dir.path / "child.out").string();
  const std::string exe = std::string(DLTRAIN_BIN_DIR) + "/ps_client_child";
  const std::string secret_file = (dir.path / "job.secret").string();
  write_private_file(secret_file, to_hex(kSecret) + "\n");
  dltrain::testing::Background child(exe + " " + std::to_string(shard.port()) + " 500 " + secret_file, out);
  auto child_output = [&] {
    std::string s;
    for (const auto& l : child.lines()) s += l + "\n";
    return s;
  };

  ASSERT_TRUE(shard.accept(30s)) << "the child never connected: " << child_output();
  ASSERT_TRUE(shard.handshake(30s)) << "the child did not prove the secret: " << child_output();
  std::vector<std::byte> hello;
  auto h = shard.read_frame(30s, &hello);
  ASSERT_TRUE(h && h->type == wire::MessageType::kHello && hello.size() == 8) << child_output();
  std::uint32_t rank_of[2];
  std::memcpy(rank_of, hello.data(), 8);
  EXPECT_EQ(rank_of[0], 0u);  // worker 0
  EXPECT_EQ(rank_of[1], 1u);  // of 1
  shard.ack_hello(h->seq);
  auto pull = shard.read_frame(30s);
  ASSERT_TRUE(pull && pull->type == wire::MessageType::kPull && pull->key == 0) << child_output();

  // The child now waits in its pull. Stop it, answer, and keep it stopped for three
  // times its 500 ms timeout.
  const int pid = child.pid();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  wait_until([&] { return dltrain::testing::process_state(pid) == 'T'; }, 10s, 10ms);
  ASSERT_EQ(dltrain::testing::process_state(pid), 'T') << "the child did not stop";
  shard.reply_to_pull(pull->seq, {1.5f, -2.0f, 3.25f, 4.0f});
  // Not a synchronisation: the suspension itself, three times the child's timeout, so that
  // its deadline has passed when it runs again.
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(kill(pid, SIGCONT), 0);

  EXPECT_EQ(child.wait(30), 0) << child_output();
  const auto lines = child.lines();
  ASSERT_EQ(lines.size(), 1u) << child_output();
  EXPECT_EQ(lines[0], "1.5 -2 3.25 4");
}

// A pull reply that does not fit the partition it answers is refused by the client's one
// check of pull replies, with what it expected and what it got; the client is closed.
TEST(PsClientReplies, APullReplyOfTheWrongSizeIsRefusedWithWhatWasExpected) {
  using namespace std::chrono_literals;
  ScriptedShard shard;
  std::thread script([&] {
    const auto pull = shard.first_pull(30s);
    if (!pull) return;
    shard.reply_to_pull(pull->seq, {1.0f, 2.0f});  // partition 0 has 4 values; this reply carries 2
  });
  auto o = PsShards::client_options(0, 1);
  o.timeout = std::chrono::milliseconds(10000);
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  std::vector<float> params(4, -1.0f);
  try {
    client.connect();
    client.pull(params);
    ADD_FAILURE() << "a pull reply of 2 values for a partition of 4 was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(std::string(e.what()), "PS shard 0 (127.0.0.1:" + std::to_string(shard.port()) +
                                         "): pull-reply of partition 0: element count: expected 4, got 2");
  }
  script.join();
  EXPECT_EQ(params, std::vector<float>(4, -1.0f));  // nothing was written
  EXPECT_THROW(client.pull(params), IoError);     // closed after the error
}

// A pipelined pull's handle (c10d's Work): wait(timeout) gives up while the shard has not
// answered, leaving the pull in flight, and a later wait takes the reply the shard sends
// then. The premise: the shard has read the pull when the first wait starts.
TEST(PsWork, WaitWithATimeoutGivesUpAndThePullGoesOnToItsReply) {
  using namespace std::chrono_literals;
  ScriptedShard shard;
  std::atomic<bool> pull_read{false};
  std::promise<void> answer;
  auto answer_now = answer.get_future();
  std::thread script([&] {
    const auto pull = shard.first_pull(30s);
    if (!pull) return;
    pull_read = true;
    if (answer_now.wait_for(30s) != std::future_status::ready) return;
    shard.reply_to_pull(pull->seq, {1.5f, -2.0f, 3.25f, 4.0f});
  });
  auto o = PsShards::client_options(0, 1);
  o.timeout = std::chrono::milliseconds(30000);
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), o);
  std::vector<float> params(4, -1.0f);
  PsWork pending;
  bool answered = false;
  struct Joiner {  // a failed assertion returns early: the script still ends and is joined
    std::thread& t;
    std::promise<void>& answer;
    bool& answered;
    ~Joiner() {
      if (!answered) answer.set_value();
      if (t.joinable()) t.join();
    }
  } joiner{script, answer, answered};
  client.connect();
  pending = client.start_pull(params, 1.0);
  ASSERT_TRUE(wait_until([&] { return pull_read.load(); }, 30s, 10ms)) << "the shard never read the pull";
  try {
    pending.wait(100ms);
    ADD_FAILURE() << "wait(100 ms) returned although the shard had not answered";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), "pull still in flight after 100 ms");
  }
  EXPECT_TRUE(pending.active()) << "a wait that timed out must leave the pull in flight";
  answered = true;
  answer.set_value();
  pending.wait(30000ms);
  EXPECT_FALSE(pending.active());
  EXPECT_EQ(params, (std::vector<float>{1.5f, -2.0f, 3.25f, 4.0f}));
}

// An overlapped push's handle, the same type as a pull's: the frame the shard reads is
// the push as given (key, codec, count, the gradient's floats), and a push the client
// refuses (a partition outside the layout) fails in wait(), not when it is started.
TEST(PsWork, APushInFlightWritesItsFrameAndItsErrorComesFromWait) {
  using namespace std::chrono_literals;
  ScriptedShard shard;
  std::optional<wire::FrameHeader> got;
  std::vector<std::byte> payload;
  std::thread script([&] {
    if (!shard.accept(30s) || !shard.handshake(30s)) return;
    const auto hello = shard.read_frame(30s);
    if (!hello) return;
    shard.ack_hello(hello->seq);
    got = shard.read_frame(30s, &payload);
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{script};
  PsClient client({{"127.0.0.1", shard.port()}}, make_layout({4}, 4, 1), PsShards::client_options(0, 1));
  client.connect();
  const std::vector<float> g{0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<PartitionPush> pushes(1);
  pushes[0].codec = wire::Codec::kDenseF32;
  pushes[0].count = 4;
  pushes[0].first = std::as_bytes(std::span<const float>(g));
  const std::uint32_t keys[] = {0};
  PsWork work = client.start_push(pushes, keys, 0.1f);
  EXPECT_STREQ(work.what(), "push");
  work.wait(30000ms);
  EXPECT_FALSE(work.active());
  script.join();
  ASSERT_TRUE(got.has_value()) << "the shard read no frame after the hello";
  EXPECT_EQ(got->type, wire::MessageType::kPush);
  EXPECT_EQ(got->key, 0u);
  EXPECT_EQ(got->codec, wire::Codec::kDenseF32);
  EXPECT_EQ(got->count, 4u);
  ASSERT_EQ(payload.size(), 4 * sizeof(float));
  std::vector<float> sent(4);
  std::memcpy(sent.data(), payload.data(), payload.size());
  EXPECT_EQ(sent, g);

  const std::uint32_t outside[] = {7};
  PsWork refused = client.start_push(pushes, outside, 0.1f);
  EXPECT_TRUE(refused.active());
  try {
    refused.wait();
    ADD_FAILURE() << "a push of partition 7 of a one-partition layout was not refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("push of partition 7: the layout has 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(refused.active());
}
