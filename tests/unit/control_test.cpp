// The leader's control endpoint over real loopback sockets: /healthz, bearer tokens,
// malformed messages, job validation errors; with an agent played by hand: job secrets
// and generations in task messages, malformed agent messages; with a leader played by
// hand: malformed requests to an agent.
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
#include "agent/leader.h"
#include "common/errors.h"
#include "common/job_spec.h"
#include "common/secret.h"
#include "control/client.h"
#include "control/server.h"
#include "store/store.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"
#include "wire/control_bodies.h"

using namespace dltrain;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// A leader on 127.0.0.1 (ephemeral port) with its own io thread, optionally with a store
// (`state_dir`) and serving wss:// (`tls_cert`, `tls_key`).
struct RunningLeader {
  explicit RunningLeader(const std::string& state_dir = "", const std::string& tls_cert = "",
                         const std::string& tls_key = "") {
    agent::AgentOptions o;
    o.leader = true;
    o.listen_address = "127.0.0.1";
    o.listen_port = 0;
    o.agent_token = "agent-secret";
    o.client_token = "client-secret";
    o.state_dir = state_dir;
    o.tls_cert_file = tls_cert;
    o.tls_key_file = tls_key;
    leader = std::make_unique<agent::Leader>(io, o);
    leader->start();
    thread = std::thread([this] { io.run(); });
  }
  ~RunningLeader() {
    asio::post(io, [this] { leader->stop(); io.stop(); });
    thread.join();
  }
  std::uint16_t port() const { return leader->port(); }
  std::string url(const std::string& scheme = "ws") const {
    return scheme + "://127.0.0.1:" + std::to_string(port());
  }

  asio::io_context io;
  std::unique_ptr<agent::Leader> leader;
  std::thread thread;
};

class LeaderFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    leader_.emplace();  // no store: these tests are about the control endpoint
    port_ = leader_->port();
  }
  void TearDown() override { leader_.reset(); }
  std::string url() const { return leader_->url(); }

  // A raw HTTP/1.1 request; returns the response.
  http::response<http::string_body> get(const std::string& target, const std::string& auth, bool upgrade) {
    asio::io_context io;
    beast::tcp_stream s(io);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
    http::request<http::empty_body> req(http::verb::get, target, 11);
    req.set(http::field::host, "127.0.0.1");
    if (!auth.empty()) req.set(http::field::authorization, auth);
    if (upgrade) {
      req.set(http::field::connection, "Upgrade");
      req.set(http::field::upgrade, "websocket");
      req.set(http::field::sec_websocket_version, "13");
      req.set(http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
    }
    http::write(s, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(s, buf, res);
    return res;
  }

  std::optional<RunningLeader> leader_;
  std::uint16_t port_ = 0;
};

// An agent played by hand over the real control protocol: it registers, then records
// the leader's requests (answering each with an empty ok reply) and sends task messages
// as a test says. Every wait is bounded (10 s).
class FakeAgent {
 public:
  FakeAgent(const std::string& url, const std::string& name, int cores) {
    link_ = std::make_shared<control::ControlClient>(io_, url, "agent-secret", control::PeerKind::kAgent);
    link_->on_message = [this](const std::string& text) {
      auto env = wire::parse_envelope(text);
      if (env.type == "reply") {
        replies_.push_back(env);
      } else {
        link_->send(wire::make_reply(env.id, nlohmann::json::object()));
        requests_.push_back(env);
      }
    };
    std::optional<std::exception_ptr> done;
    link_->connect(std::chrono::seconds(10), [&](std::exception_ptr e) { done = e; });
    run_until([&] { return done.has_value(); });
    if (!done || *done) throw IoError("the fake agent could not connect to the leader");
    auto r = request("register", {{"name", name}, {"advertise_address", "127.0.0.1"}, {"cores", cores},
                                  {"memory_mb", 1024}, {"hardware_class", "cpu"}, {"tasks", nlohmann::json::array()}});
    if (!r.ok) throw IoError("the leader refused the fake agent: " + r.error.dump());
  }
  ~FakeAgent() {
    link_->close();
    io_.run_for(std::chrono::milliseconds(100));
  }

  // Sends a request; returns its reply (ok or not). Throws TimeoutError after 10 s.
  wire::Envelope request(const std::string& type, const nlohmann::json& body) {
    const std::string id = "f" + std::to_string(next_id_++);
    link_->send(wire::make_request(id, type, body));
    auto reply = take(replies_, [&](const wire::Envelope& e) { return e.id == id; });
    if (!reply) throw TimeoutError("no reply to " + type + " within 10 s");
    return *reply;
  }

  // Sends `text` as it is; returns the reply whose id is `reply_id`. Throws TimeoutError
  // after 10 s.
  wire::Envelope raw(const std::string& text, const std::string& reply_id) {
    link_->send(text);
    auto reply = take(replies_, [&](const wire::Envelope& e) { return e.id == reply_id; });
    if (!reply) throw TimeoutError("no reply to " + text.substr(0, 80) + " within 10 s");
    return *reply;
  }

  // The next request of `type` from the leader, waiting up to 10 s.
  std::optional<wire::Envelope> next(const std::string& type) {
    return take(requests_, [&](const wire::Envelope& e) { return e.type == type; });
  }

 private:
  // Removes and returns the first message of `from` that `match` accepts, running the
  // connection until one arrives (at most 10 s).
  std::optional<wire::Envelope> take(std::deque<wire::Envelope>& from,
                                     const std::function<bool(const wire::Envelope&)>& match) {
    std::optional<wire::Envelope> got;
    run_until([&] {
      const auto it = std::find_if(from.begin(), from.end(), match);
      if (it == from.end()) return false;
      got = *it;
      from.erase(it);
      return true;
    });
    return got;
  }

  void run_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    io_.restart();
    while (!done() && std::chrono::steady_clock::now() < deadline) io_.run_for(std::chrono::milliseconds(20));
  }

  asio::io_context io_;
  std::shared_ptr<control::ControlClient> link_;
  std::deque<wire::Envelope> replies_, requests_;
  std::uint64_t next_id_ = 1;
};

// One PS shard and one worker of the MLP: the leader needs two cores.
const std::string kTwoTaskJob = "name = \"gen\"\nmodel = \"mlp\"\nworkers = 1\nps_shards = 1\nepochs = 1\n";

}  // namespace

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
  asio::post(io, [&] {
    for (int i = 0; i < 200; ++i) session->send("big " + std::to_string(i) + std::string(64u << 10, '.'));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the peer is not reading meanwhile
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
    agent::AgentOptions o;
    o.leader = true;
    o.listen_address = "127.0.0.1";
    o.agent_token = "agent-secret";
    o.client_token = "client-secret";
    o.state_dir = "";
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    agent::Leader leader(io, o);
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

TEST(LeaderTasks, MessagesOfAnOlderGenerationAreRefusedAndTheSecretStaysWithTheTasks) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 4);
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto sub = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
  const std::string job = sub["job"];

  const auto ps = agent.next("start_task");
  ASSERT_TRUE(ps) << "the leader did not start the PS shard";
  EXPECT_EQ(ps->body["task"], "ps-0");
  const auto gen = ps->body["generation"].get<std::uint32_t>();
  EXPECT_EQ(gen, 1u);
  const std::string secret = ps->body["secret"];
  EXPECT_EQ(job_secret_from_hex(secret, "secret").size(), 32u);

  // The shard's "listening" event as a task of the previous generation would send it:
  // refused, and the job does not move on.
  // The port the fake PS shard reports: only relayed to the worker, never bound or dialled.
  const nlohmann::json listening{{"event", "listening"}, {"port", 5555}, {"address", "127.0.0.1"}};
  auto stale =
      agent.request("task_event", {{"job", job}, {"task", "ps-0"}, {"generation", gen - 1}, {"event", listening}});
  EXPECT_FALSE(stale.ok);
  EXPECT_EQ(stale.error["code"], "conflict");
  EXPECT_EQ(stale.error["field"], "generation");
  EXPECT_EQ(stale.error["message"], "stale generation");
  auto st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["state"], "starting");
  EXPECT_FALSE(st["tasks"][0].contains("endpoint")) << st.dump();

  // The same event from the current generation starts the worker, with the same secret.
  auto fresh = agent.request("task_event", {{"job", job}, {"task", "ps-0"}, {"generation", gen}, {"event", listening}});
  EXPECT_TRUE(fresh.ok) << fresh.error.dump();
  const auto worker = agent.next("start_task");
  ASSERT_TRUE(worker) << "the leader did not start the worker";
  EXPECT_EQ(worker->body["task"], "worker-0");
  EXPECT_EQ(worker->body["generation"], gen);
  EXPECT_EQ(worker->body["ps"], nlohmann::json::array({"127.0.0.1:5555"}));
  EXPECT_EQ(worker->body["secret"], secret);

  // A stale task's exit does not fail the job either.
  auto exit = agent.request("task_exit", {{"job", job}, {"task", "worker-0"}, {"generation", gen - 1}, {"exit_code", 1},
                                          {"signal", 0}, {"describe", "exit code 1"}, {"last_error", "boom"}});
  EXPECT_FALSE(exit.ok);
  EXPECT_EQ(exit.error["code"], "conflict");
  st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["state"], "running") << st.dump();

  // Clients never see the secret.
  EXPECT_EQ(st.dump().find(secret), std::string::npos);
  const auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
  EXPECT_EQ(list.dump().find(secret), std::string::npos);

  // A second job gets its own secret.
  c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
  const auto ps2 = agent.next("start_task");
  ASSERT_TRUE(ps2);
  EXPECT_NE(ps2->body["job"], job);
  EXPECT_NE(ps2->body["secret"], secret);
}

TEST(LeaderTasks, TheSecretIsStoredWhileTheJobLivesAndOlderRecordsStayReadable) {
  dltrain::testing::TempDir d;
  const auto state = d.path / "state";
  std::string secret;
  {
    RunningLeader l(state.string());
    FakeAgent agent(l.url(), "fake-1", 4);
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    const auto ps = agent.next("start_task");
    ASSERT_TRUE(ps);
    secret = ps->body["secret"];
  }
  {
    auto db = store::Store::open((state / "db").string());
    auto jobs = db->jobs();
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].first, 1u);
    EXPECT_EQ(jobs[0].second["state"], "starting");
    EXPECT_EQ(jobs[0].second["secret"], secret);
    EXPECT_EQ(jobs[0].second["generation"], 1);
    // A record as a leader without job secrets wrote it: no "secret", no "generation".
    auto old = jobs[0].second;
    old.erase("secret");
    old.erase("generation");
    old["state"] = "succeeded";
    old["num"] = 7;
    old["test_accuracy"] = 0.8;
    db->put_job(7, old);
  }
  {
    // Restarted: the unfinished job is restored with its secret; the old record is served
    // as it was.
    RunningLeader l(state.string());
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    auto j1 = c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10));
    EXPECT_EQ(j1["state"], "starting");
    auto j7 = c.request("status", {{"job", "job-7"}}, std::chrono::seconds(10));
    EXPECT_EQ(j7["state"], "succeeded");
    EXPECT_DOUBLE_EQ(j7["test_accuracy"].get<double>(), 0.8);
    // Its agent comes back without the shard (it restarted too): the job had been
    // starting, so it is re-assigned as generation 2, with the same secret.
    FakeAgent agent(l.url(), "fake-1", 4);
    const auto ps = agent.next("start_task");
    ASSERT_TRUE(ps);
    EXPECT_EQ(ps->body["task"], "ps-0");
    EXPECT_EQ(ps->body["generation"], 2);
    EXPECT_EQ(ps->body["secret"], secret);
    // A message of generation 1 is refused now.
    auto stale = agent.request("task_event", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", 1},
                                              {"event", {{"event", "listening"}, {"port", 5555}}}});
    EXPECT_FALSE(stale.ok);
    // Cancelled: its shard reports its exit and the job ends, dropping the secret.
    c.request("cancel", {{"job", "job-1"}}, std::chrono::seconds(10));
    ASSERT_TRUE(agent.next("stop_task"));
    EXPECT_TRUE(agent.request("task_exit", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", 2}, {"exit_code", 0},
                                            {"signal", 0}, {"describe", "exit code 0"}})
                    .ok);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"] != "cancelled" &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"], "cancelled");
  }
  auto db = store::Store::open((state / "db").string());
  for (const auto& [num, rec] : db->jobs()) {
    EXPECT_FALSE(rec.contains("secret")) << "job " << num << " still stores its secret after it ended";
  }
}

// No silent waits: a job larger than the whole cluster is accepted with a warning, its
// follower is told at once why it waits (and the status says the same), and its
// queue_timeout fails it with the reason.
TEST(LeaderQueue, AJobThatCannotFitSaysWhyAtSubmitAndWhileItWaitsAndFailsAfterItsQueueTimeout) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 2);
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const std::string toml =
      "name = \"big\"\nmodel = \"mlp\"\nworkers = 4\nps_shards = 1\nepochs = 1\nqueue_timeout = \"2s\"\n";
  const auto sub =
      c.request("submit", {{"job_toml", toml}, {"base_dir", "."}, {"follow", true}}, std::chrono::seconds(10));
  const std::string job = sub["job"];
  EXPECT_EQ(sub["state"], "queued");
  EXPECT_EQ(sub["warning"],
            "needs 5 cores (5 tasks x 1), more than the 2 cores of the agents registered now; it waits in the "
            "queue until agents join");

  // Collects the follower's events until one of `kind` arrives (at most 15 s).
  std::vector<nlohmann::json> seen;
  auto wait_for = [&](const std::string& kind) -> std::optional<nlohmann::json> {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      auto e = c.next_event(std::chrono::milliseconds(500));
      if (!e) continue;
      seen.push_back(*e);
      if ((*e)["job"] == job && (*e)["event"] == kind) return e;
    }
    return std::nullopt;
  };
  const auto waiting = wait_for("waiting");
  ASSERT_TRUE(waiting) << nlohmann::json(seen).dump();
  EXPECT_EQ((*waiting)["position"], 1);
  EXPECT_EQ((*waiting)["cores_needed"], 5);
  EXPECT_EQ((*waiting)["cores_free"], 2);
  EXPECT_EQ((*waiting)["cores_total"], 2);
  EXPECT_EQ((*waiting)["fits_cluster"], false);
  EXPECT_EQ((*waiting)["queue_timeout_seconds"], 2.0);
  const auto st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["cores_total"], 2);
  EXPECT_EQ(st["fits_cluster"], false);

  // The heartbeat checker (every second) fails it once it has waited 2 s.
  const auto summary = wait_for("summary");
  ASSERT_TRUE(summary) << nlohmann::json(seen).dump();
  EXPECT_EQ((*summary)["state"], "failed");
  EXPECT_EQ((*summary)["error"],
            "waited 2 s in the queue (queue_timeout): it needs 5 cores, 2 are free and the cluster has 2 in all");
  const auto ended = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_TRUE(ended["tasks"].empty()) << "nothing of the job may have started: " << ended.dump();
}

// Two machines with one host name (cloned VMs): the second agent is refused with what to
// do about it, and the first one carries on.
TEST(LeaderAgents, ASecondAgentWithTheSameNameIsRefusedWithTheFix) {
  RunningLeader l;
  FakeAgent first(l.url(), "vm", 2);
  try {
    FakeAgent second(l.url(), "vm", 2);
    ADD_FAILURE() << "a second agent named vm was registered";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("an agent named \\\"vm\\\" is already registered (from 127.0.0.1:"), std::string::npos) << m;
    EXPECT_NE(m.find("set a unique name = \\\"...\\\" in this agent's configuration (it defaults to the host name)"),
              std::string::npos)
        << m;
  }
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto agents = c.request("agents", nlohmann::json::object(), std::chrono::seconds(10));
  ASSERT_EQ(agents["agents"].size(), 1u);
  EXPECT_EQ(agents["agents"][0]["state"], "ready");
}

// The leader's state database on a full disk (a 192 MiB tmpfs — RocksDB preallocates
// about 70 MiB for its write-ahead log — that the test mounts and fills to 16 MiB free,
// below the store's default reserve of 64 MiB):
// a submit is refused with the cause and leaves nothing behind, the jobs already stored
// are still listed, and once space is freed submits are accepted again, with no gap in
// the job numbers; a restarted leader finds every accepted job.
TEST(LeaderStore, ASubmitIsRefusedWithTheCauseWhileTheDiskIsFullAndAcceptedOnceSpaceIsFreed) {
  dltrain::testing::Tmpfs fs(192u << 20);
  if (!fs.error().empty()) GTEST_SKIP() << "needs root to mount a tmpfs: " << fs.error();
  const auto state = fs.path() / "state";
  int accepted = 0;
  {
    RunningLeader l(state.string());
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    ++accepted;
    ASSERT_GT(fs.fill(16u << 20), 0u);
    std::string refusal;
    try {
      c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
      ADD_FAILURE() << "a submit was accepted below the reserve";
    } catch (const control::RemoteError& e) {
      EXPECT_EQ(e.code(), "unavailable");
      refusal = e.what();
    }
    EXPECT_NE(refusal.find("the leader cannot store the job, so it does not accept it"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("below the reserve of 64.0 MiB"), std::string::npos) << refusal;
    // Reads go on: the accepted jobs are listed, the refused one is not.
    auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
    EXPECT_EQ(list["jobs"].size(), static_cast<std::size_t>(accepted)) << list.dump();
    EXPECT_EQ(c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"], "queued");

    fs.free_space();
    auto after = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    ++accepted;
    EXPECT_EQ(after["job"], "job-" + std::to_string(accepted));  // the refused submit used no number
  }
  RunningLeader again(state.string());
  control::BlockingControlClient c(again.url(), "client-secret", std::chrono::seconds(10));
  auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
  EXPECT_EQ(list["jobs"].size(), static_cast<std::size_t>(accepted)) << list.dump();
}

// Found while writing tests/fuzz/fuzz_control.cpp: a number that overflows a double
// escaped the leader's message handler as nlohmann::json::out_of_range, out of its event
// loop, and ended the leader; mistyped register and task fields were read with nlohmann's
// value(), which threw (an "internal" error) or, for 1e300 into an int, was undefined
// behaviour. Now each is a bad_request naming the field, and the leader carries on.
TEST(LeaderAgents, MalformedAgentMessagesAreRefusedNamingTheFieldAndTheLeaderCarriesOn) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 4);
  const auto overflow = agent.raw(R"({"v":1,"id":"r1","type":"heartbeat","body":{"x":1e400}})", "");  // id unknown
  EXPECT_FALSE(overflow.ok);
  EXPECT_EQ(overflow.error["code"], "bad_request");
  EXPECT_NE(overflow.error["message"].get<std::string>().find("number overflow"), std::string::npos);
  const auto deep = agent.raw(R"({"v":1,"id":"r2","type":"heartbeat","body":{"x":)" + std::string(5000, '[') +
                                  std::string(5000, ']') + "}}",
                              "");  // not parsed, so its id is not known
  EXPECT_EQ(deep.error["code"], "bad_request");
  const auto reg = agent.request("register", {{"name", "fake-2"}, {"cores", 1e300}});
  EXPECT_FALSE(reg.ok);
  EXPECT_EQ(reg.error["code"], "bad_request");
  EXPECT_EQ(reg.error["field"], "cores");
  const auto ev = agent.request("task_event", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", "1"}});
  EXPECT_EQ(ev.error["code"], "bad_request");
  EXPECT_EQ(ev.error["field"], "generation");
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto agents = c.request("agents", nlohmann::json::object(), std::chrono::seconds(10));
  ASSERT_EQ(agents["agents"].size(), 1u);
  EXPECT_EQ(agents["agents"][0]["agent"], "fake-1");
  EXPECT_EQ(agents["agents"][0]["cores"], 4);
}

namespace {

// A leader played by hand: a control server on 127.0.0.1 that records what its agents
// send, and an agent connected to it, on one io_context the test runs.
struct FakeLeader {
  FakeLeader() {
    control::ControlServerOptions so;
    so.agent_token = "agent-secret";
    so.client_token = "client-secret";
    control::ControlHandler h;
    h.on_message = [this](const std::shared_ptr<control::Session>& s, const std::string& text) {
      session = s;
      auto env = wire::parse_envelope(text);
      if (env.type == "register") s->send(wire::make_reply(env.id, {{"agent_id", "a"}, {"heartbeat_interval_ms", 1000}}));
      got.push_back(env);
    };
    server = std::make_unique<control::ControlServer>(io, so, h);
    server->start();
    agent::AgentOptions o;
    o.name = "agent-under-test";
    o.leader_url = "ws://127.0.0.1:" + std::to_string(server->port());
    o.agent_token = "agent-secret";
    o.state_dir = (dir.path / "state").string();
    o.cores = 2;
    a = std::make_unique<agent::Agent>(io, o);
    a->start();
  }
  ~FakeLeader() {
    a.reset();
    server->stop();
    io.run_for(std::chrono::milliseconds(100));
  }
  // The first message from the agent that `match` accepts, running the io for up to 10 s.
  std::optional<wire::Envelope> next(const std::function<bool(const wire::Envelope&)>& match) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto it = std::find_if(got.begin(), got.end(), match);
      if (it != got.end()) {
        auto e = *it;
        got.erase(it);
        return e;
      }
      io.restart();
      io.run_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }
  std::optional<wire::Envelope> reply_to(const std::string& id) {
    return next([&](const wire::Envelope& e) { return e.type == "reply" && e.id == id; });
  }

  dltrain::testing::TempDir dir;
  asio::io_context io;
  std::unique_ptr<control::ControlServer> server;
  std::unique_ptr<agent::Agent> a;
  std::shared_ptr<control::Session> session;
  std::deque<wire::Envelope> got;
};

}  // namespace

// Found while writing tests/fuzz/fuzz_control.cpp: an agent read start_task with
// b.at("job").get<std::string>(); a job that was not a string threw, and so did the
// catch handler that reported the failure (env.body.value("job", "")), out of the agent's
// event loop; a job or task named "../.." put the task's directory (and its secret file)
// outside the state directory. Now both are refused as bad_request naming the field, the
// failure is reported as a task_exit, and the agent carries on.
TEST(AgentRequests, MalformedStartTaskIsRefusedNamingTheFieldAndTheAgentCarriesOn) {
  FakeLeader l;
  ASSERT_TRUE(l.next([](const wire::Envelope& e) { return e.type == "register"; })) << "the agent did not register";
  ASSERT_TRUE(l.session);
  wire::StartTaskBody st;
  st.job = "job-1";
  st.job_num = 1;
  st.task = "ps-0";
  st.kind = "ps";
  st.generation = 1;
  st.secret = std::string(64, 'a');
  st.spec = JobSpec{};
  auto body = st.to_json();
  body["job"] = 5;
  l.session->send(wire::make_request("l1", "start_task", body));
  auto r = l.reply_to("l1");
  ASSERT_TRUE(r) << "no reply to a start_task whose job is a number";
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error["code"], "bad_request");
  EXPECT_EQ(r->error["field"], "job");
  const auto exit = l.next([](const wire::Envelope& e) { return e.type == "task_exit"; });
  ASSERT_TRUE(exit) << "the refused start_task was not reported as a task_exit";
  EXPECT_EQ(exit->body["task"], "ps-0");
  EXPECT_EQ(exit->body["exit_code"], 126);

  body = st.to_json();
  body["job"] = "../../escaped";
  l.session->send(wire::make_request("l2", "start_task", body));
  r = l.reply_to("l2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error["field"], "job");
  EXPECT_FALSE(std::filesystem::exists(l.dir.path / "escaped"));

  // Still answering: a stop_task of a task it does not run is fine.
  l.session->send(wire::make_request("l3", "stop_task", wire::TaskRefBody{{}, "job-1", "ps-0", 1}.to_json()));
  r = l.reply_to("l3");
  ASSERT_TRUE(r) << "the agent stopped answering";
  EXPECT_TRUE(r->ok) << r->error.dump();
}

// Found by LeakSanitizer (scripts/test --sanitize=address,undefined) in
// LeaderAgents.ASecondAgentWithTheSameNameIsRefusedWithTheFix: a client's read and write
// loops held themselves (a std::function capturing its own shared_ptr), released only
// when a read or write completed, so a client whose io_context ended with a read pending
// leaked with its socket and buffers. Now the pending operation's handler owns the loop.
TEST(ControlClientLifetime, AClientWhoseEventLoopEndsWithAReadPendingIsFreed) {
  RunningLeader l;
  std::weak_ptr<control::ControlClient> weak;
  {
    asio::io_context io;
    auto c = std::make_shared<control::ControlClient>(io, l.url(), "client-secret", control::PeerKind::kClient);
    std::optional<std::exception_ptr> done;
    c->connect(std::chrono::seconds(10), [&](std::exception_ptr e) { done = e; });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(done.has_value() && !*done) << "the client did not connect";
    c->send(wire::make_request("1", "list", nlohmann::json::object()));  // a write in flight as well
    weak = c;
    c.reset();
    EXPECT_FALSE(weak.expired());  // the pending read holds it while the io_context lives
  }
  EXPECT_TRUE(weak.expired()) << "the client outlived its io_context";
}
