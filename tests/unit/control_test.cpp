// The leader's control endpoint over real loopback sockets: /healthz, bearer tokens,
// malformed messages, job validation errors.
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include "agent/leader.h"
#include "common/errors.h"
#include "control/client.h"

using namespace dltrain;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

class LeaderFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    agent::AgentOptions o;
    o.leader = true;
    o.listen_address = "127.0.0.1";
    o.listen_port = 0;
    o.agent_token = "agent-secret";
    o.client_token = "client-secret";
    o.state_dir = "";  // no store: these tests are about the control endpoint
    leader_ = std::make_unique<agent::Leader>(io_, o);
    leader_->start();
    port_ = leader_->port();
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    asio::post(io_, [this] { leader_->stop(); io_.stop(); });
    thread_.join();
  }
  std::string url() const { return "ws://127.0.0.1:" + std::to_string(port_); }

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

  asio::io_context io_;
  std::unique_ptr<agent::Leader> leader_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

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

TEST(LeaderUrl, ParsesAndRejects) {
  auto u = control::parse_leader_url("ws://10.1.2.3:7070");
  EXPECT_EQ(u.host, "10.1.2.3");
  EXPECT_EQ(u.port, "7070");
  auto v6 = control::parse_leader_url("ws://[::1]:9/");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_THROW(control::parse_leader_url("http://x:1"), ConfigError);
  EXPECT_THROW(control::parse_leader_url("ws://x"), ConfigError);
  EXPECT_THROW(control::parse_leader_url("ws://x:1/path"), ConfigError);
}
