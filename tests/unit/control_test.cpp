// The leader's control endpoint over real loopback sockets: /healthz, bearer tokens,
// malformed messages, job validation errors, Nagle, slow readers, leader URLs and TLS.
// The leader's handling of agents, tasks, the queue and the store is in
// leader_control_test.cpp; the shared fixtures in support/control_fixtures.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <future>
#include <gtest/gtest.h>

#include "agent/agent.h"
#include "leader/leader.h"
#include "common/errors.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "control/client.h"
#include "control/server.h"
#include "store/store.h"
#include "support/control_fixtures.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"
#include "wire/control_bodies.h"

using namespace dltrain;
using namespace dltrain::testing;

TEST_F(LeaderFixture, HealthzNeedsNoTokenAndRevealsNothing) {
  auto res = get("/healthz", "", false);
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res.body(), R"({"status":"ok"})");
  EXPECT_EQ(get("/nope", "", false).result_int(), 404);
}

TEST_F(LeaderFixture, MissingOrWrongTokenGets401) {
  EXPECT_EQ(get("/v1/client", "", true).result_int(), 401);
  EXPECT_EQ(get("/v1/client", "Bearer wrong", true).result_int(), 401);
  // The agent token does not open the client endpoint, nor the reverse.
  EXPECT_EQ(get("/v1/client", "Bearer agent-secret", true).result_int(), 401);
  EXPECT_EQ(get("/v1/agent", "Bearer client-secret", true).result_int(), 401);
  auto res = get("/v1/agent", "", true);
  EXPECT_EQ(res.result_int(), 401);
  EXPECT_EQ(res[http::field::www_authenticate], "Bearer realm=\"dltrain\"");
  try {
    control::BlockingControlClient c(url(), "wrong", std::chrono::seconds(5));
    FAIL() << "connected with a wrong token";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("refused the token (HTTP 401)"), std::string::npos) << e.what();
  }
}

TEST_F(LeaderFixture, RightTokenServesRequests) {
  control::BlockingControlClient c(url(), "client-secret", std::chrono::seconds(5));
  auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(5));
  EXPECT_TRUE(list["jobs"].empty());
  auto agents = c.request("agents", nlohmann::json::object(), std::chrono::seconds(5));
  EXPECT_TRUE(agents["agents"].empty());
}

TEST_F(LeaderFixture, InvalidJobIsRejectedWithTheFieldAndNothingStarts) {
  control::BlockingControlClient c(url(), "client-secret", std::chrono::seconds(5));
  try {
    c.request("submit", {{"job_toml", "batch_size = -1\n"}, {"base_dir", "/tmp"}}, std::chrono::seconds(5));
    FAIL() << "accepted a negative batch size";
  } catch (const control::RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_job");
    EXPECT_EQ(e.field(), "batch_size");
    EXPECT_EQ(std::string(e.what()), "batch_size: expected an integer in [1, 65536], got -1");
  }
  try {
    c.request("status", {{"job", "job-99"}}, std::chrono::seconds(5));
    FAIL();
  } catch (const control::RemoteError& e) {
    EXPECT_EQ(e.code(), "not_found");
  }
  // The leader carries on and has no job.
  auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(5));
  EXPECT_TRUE(list["jobs"].empty());
}

TEST_F(LeaderFixture, MalformedAndUnsupportedMessagesGetTypedErrors) {
  asio::io_context io;
  auto raw = std::make_shared<control::ControlClient>(io, url(), "client-secret", control::PeerKind::kClient);
  std::vector<std::string> got;
  raw->on_message = [&](const std::string& t) { got.push_back(t); };
  bool connected = false;
  raw->connect(std::chrono::seconds(5), [&](std::exception_ptr e) { connected = !e; });
  io.run_for(std::chrono::seconds(2));
  ASSERT_TRUE(connected);
  raw->send("{not json");
  raw->send(R"({"v":9,"id":"x","type":"list"})");
  raw->send(R"({"v":1,"id":"y","type":"frobnicate"})");
  for (int i = 0; i < 50 && got.size() < 3; ++i) io.run_for(std::chrono::milliseconds(100));
  ASSERT_EQ(got.size(), 3u);
  auto e0 = nlohmann::json::parse(got[0]);
  EXPECT_EQ(e0["error"]["code"], "bad_request");
  auto e1 = nlohmann::json::parse(got[1]);
  EXPECT_EQ(e1["error"]["code"], "unsupported_version");
  EXPECT_EQ(e1["id"], "x");
  auto e2 = nlohmann::json::parse(got[2]);
  EXPECT_EQ(e2["error"]["code"], "bad_request");
  EXPECT_EQ(e2["error"]["message"], "unknown message type \"frobnicate\"");
  raw->close();
  io.run_for(std::chrono::milliseconds(200));
}

namespace {

// TCP_NODELAY of this process's connected IPv4 TCP sockets whose local port (the
// leader's end of a session) or peer port (the client's end) is `port`.
struct NoDelayOfSessions {
  std::vector<bool> leader_side, client_side;
};
NoDelayOfSessions no_delay_of_sessions(std::uint16_t port) {
  NoDelayOfSessions out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    sockaddr_in local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || local.sin_family != AF_INET) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;  // the listener
    int nodelay = 0;
    socklen_t nl = sizeof nodelay;
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &nl) != 0) continue;
    if (ntohs(local.sin_port) == port) out.leader_side.push_back(nodelay != 0);
    if (ntohs(peer.sin_port) == port) out.client_side.push_back(nodelay != 0);
  }
  return out;
}

}  // namespace

// Control messages are small and often several in a row; with Nagle's algorithm on,
// every one after the first waited for the peer's delayed ACK (40 ms on Linux: the
// control-plane load benchmark's task_event and relay p99, docs/benchmarks.md).
TEST_F(LeaderFixture, BothEndsOfAControlSessionSendWithoutNagleDelay) {
  control::BlockingControlClient c(url(), "client-secret", std::chrono::seconds(5));
  c.request("list", nlohmann::json::object(), std::chrono::seconds(5));  // the session is up at both ends
  const auto s = no_delay_of_sessions(port_);
  EXPECT_EQ(s.leader_side, std::vector<bool>{true});
  EXPECT_EQ(s.client_side, std::vector<bool>{true});
}

// A peer that stops reading: what the server sends it is queued, up to a bound in
// messages and one in bytes; past the bytes, the session is dropped and its queue freed
// (a client pipelining `list` requests could make the leader hold 4096 whole job lists).
TEST(ControlServer, APeerThatStopsReadingIsDroppedOnceItsQueueHoldsTooManyBytes) {
  asio::io_context io;
  control::ControlServerOptions so;
  so.agent_token = "agent-secret";
  so.client_token = "client-secret";
  so.max_send_queue_bytes = 256u << 10;
  std::shared_ptr<control::Session> session;
  std::promise<void> opened, closed;
  control::ControlHandler h;
  h.on_open = [&](const std::shared_ptr<control::Session>& s) {
    session = s;
    opened.set_value();
  };
  h.on_close = [&](const std::shared_ptr<control::Session>&) { closed.set_value(); };
  control::ControlServer server(io, so, h);
  server.start();
  std::thread loop([&] { io.run(); });

  // The peer: a plain Beast WebSocket client that reads only when the test says so.
  asio::io_context cio;
  beast::websocket::stream<beast::tcp_stream> ws(cio);
  ws.next_layer().connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), server.port()));
  ws.set_option(beast::websocket::stream_base::decorator(
      [](beast::websocket::request_type& r) { r.set(http::field::authorization, "Bearer client-secret"); }));
  ws.handshake("127.0.0.1", "/v1/client");
  ASSERT_EQ(opened.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto read_text = [&](beast::error_code& ec) {
    beast::flat_buffer b;
    ws.read(b, ec);
    return beast::buffers_to_string(b.data());
  };

  // 200 small messages (20 kB) fit: all of them arrive, in order.
  asio::post(io, [&] {
    for (int i = 0; i < 200; ++i) session->send("small " + std::to_string(i) + std::string(90, '.'));
  });
  for (int i = 0; i < 200; ++i) {
    beast::error_code ec;
    const auto text = read_text(ec);
    ASSERT_FALSE(ec) << "message " << i << ": " << ec.message();
    const std::string want = "small " + std::to_string(i) + ".";
    EXPECT_EQ(text.substr(0, want.size()), want);
  }

  // 200 of 64 KiB queued at once (far fewer than max_send_queue): the first is being
  // written, three more fit the 256 KiB, the fifth passes it and the session is dropped.
  // The peer gets at most the one being written (the close frame may come between its
  // fragments), then the close.
  // The peer reads nothing until every send has been made (and so the drop decided).
  std::promise<void> sent;
  asio::post(io, [&] {
    for (int i = 0; i < 200; ++i) session->send("big " + std::to_string(i) + std::string(64u << 10, '.'));
    sent.set_value();
  });
  ASSERT_EQ(sent.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  beast::error_code ec;
  std::vector<std::string> got;
  for (int i = 0; i < 200 && !ec; ++i) {
    auto text = read_text(ec);
    if (!ec) got.push_back(text.substr(0, 6));
  }
  EXPECT_LE(got.size(), 1u);
  if (!got.empty()) EXPECT_EQ(got[0], "big 0.");
  EXPECT_EQ(ec, beast::websocket::error::closed) << ec.message();
  EXPECT_EQ(ws.reason().code, beast::websocket::close_code::normal);
  EXPECT_EQ(closed.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);

  asio::post(io, [&] {
    server.stop();
    io.stop();
  });
  loop.join();
}

TEST(LeaderUrl, ParsesAndRejects) {
  auto u = control::parse_leader_url("ws://10.1.2.3:7070");
  EXPECT_EQ(u.host, "10.1.2.3");
  EXPECT_EQ(u.port, "7070");
  auto v6 = control::parse_leader_url("ws://[::1]:9/");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_THROW(control::parse_leader_url("http://x:1"), ConfigError);
  EXPECT_THROW(control::parse_leader_url("ws://x"), ConfigError);
  EXPECT_THROW(control::parse_leader_url("ws://x:1/path"), ConfigError);
  auto tls = control::parse_leader_url("wss://leader.example:7443");
  EXPECT_EQ(tls.host, "leader.example");
  EXPECT_EQ(tls.port, "7443");
  EXPECT_TRUE(tls.tls);
  EXPECT_FALSE(u.tls);
  EXPECT_THROW(control::parse_leader_url("wss//x:1"), ConfigError);
}

namespace {

// A self-signed certificate and its key made by the openssl command-line tool, for the
// names in `san` (e.g. "IP:127.0.0.1,DNS:localhost"); the key file is 0600.
struct TestCertificate {
  TestCertificate(const std::filesystem::path& dir, const std::string& name, const std::string& san) {
    cert = (dir / (name + ".pem")).string();
    key = (dir / (name + ".key")).string();
    const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                            "-subj /CN=" + name + " -addext subjectAltName=" + san + " -keyout " + key + " -out " +
                            cert + " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::filesystem::permissions(key, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  std::string cert, key;
};

// The message of the IoError a client gets connecting with `tls`, "" if it connects.
std::string connect_error(const std::string& url, const control::TlsClientOptions& tls,
                          const std::string& token = "client-secret") {
  try {
    control::BlockingControlClient c(url, token, std::chrono::seconds(5), tls);
    c.request("list", nlohmann::json::object(), std::chrono::seconds(5));
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

// wss://: a client that trusts the leader's certificate (as its CA) is served; one that
// trusts only the system's store, or a certificate for another name, is refused in the
// TLS handshake with the reason; a plain ws:// client gets nothing; the token is still
// checked; the leader carries on throughout.
TEST(ControlTls, ClientsThatTrustTheLeadersCertificateAreServedAndOthersRefused) {
  dltrain::testing::TempDir dir;
  TestCertificate good(dir.path, "leader", "IP:127.0.0.1,DNS:localhost");
  TestCertificate other(dir.path, "elsewhere", "DNS:elsewhere.example");
  RunningLeader l("", good.cert, good.key);
  EXPECT_EQ(connect_error(l.url("wss"), {good.cert, ""}), "");
  const auto untrusted = connect_error(l.url("wss"), {});
  EXPECT_NE(untrusted.find("TLS handshake with leader " + l.url("wss") + " failed: certificate verify failed"),
            std::string::npos)
      << untrusted;
  // A certificate that names another host, trusted as a CA: the name check fails.
  RunningLeader wrong_name("", other.cert, other.key);
  const auto mismatch = connect_error(wrong_name.url("wss"), {other.cert, ""});
  EXPECT_NE(mismatch.find("certificate verify failed"), std::string::npos) << mismatch;
  EXPECT_NE(connect_error(l.url("ws"), {}), "");
  EXPECT_NE(connect_error(l.url("wss"), {good.cert, ""}, "wrong").find("refused the token (HTTP 401)"),
            std::string::npos);
  // Pinned: exactly this certificate, whatever it names (the leader's own agent).
  EXPECT_EQ(connect_error(wrong_name.url("wss"), {"", other.cert}), "");
  EXPECT_NE(connect_error(l.url("wss"), {"", other.cert}), "");
  EXPECT_EQ(connect_error(l.url("wss"), {good.cert, ""}), "");
}

TEST(ControlTls, AnAgentRegistersOverTls) {
  dltrain::testing::TempDir dir;
  TestCertificate cert(dir.path, "leader", "IP:127.0.0.1");
  RunningLeader l("", cert.cert, cert.key);
  asio::io_context io;
  auto link = std::make_shared<control::ControlClient>(io, l.url("wss"), "agent-secret", control::PeerKind::kAgent,
                                                       control::TlsClientOptions{cert.cert, ""});
  nlohmann::json reply;
  link->on_message = [&](const std::string& text) {
    auto env = wire::parse_envelope(text);
    if (env.type == "reply") reply = env.body;
  };
  std::exception_ptr err;
  bool connected = false;
  link->connect(std::chrono::seconds(5), [&](std::exception_ptr e) {
    err = e;
    connected = true;
    if (!e) link->send(wire::make_request("r1", "register", {{"name", "tls-agent"}, {"cores", 2}}));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reply.is_null() && std::chrono::steady_clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(connected);
  ASSERT_FALSE(err);
  EXPECT_EQ(reply.value("agent_id", ""), "tls-agent");
  link->close();
  io.run_for(std::chrono::milliseconds(200));
}

TEST(ControlTls, AKeyFileOthersCanReadOrAMismatchedPairIsRefusedNamingTheKey) {
  dltrain::testing::TempDir dir;
  TestCertificate a(dir.path, "a", "IP:127.0.0.1");
  TestCertificate b(dir.path, "b", "IP:127.0.0.1");
  auto start = [](const std::string& cert, const std::string& key) -> std::string {
    asio::io_context io;
    leader::Leader leader(io, dltrain::testing::test_leader_options("", cert, key));
    try {
      leader.start();
      return "";
    } catch (const ConfigError& e) {
      return e.field() + ": " + e.what();
    }
  };
  EXPECT_EQ(start(a.cert, a.key), "");
  const auto mismatch = start(a.cert, b.key);
  EXPECT_NE(mismatch.find("tls_key_file: "), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("does not match the certificate"), std::string::npos) << mismatch;
  std::filesystem::permissions(a.key, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  const auto readable = start(a.cert, a.key);
  EXPECT_NE(readable.find("has mode 0644"), std::string::npos) << readable;
  EXPECT_NE(start(a.cert, "").find("TLS needs both"), std::string::npos);
}
