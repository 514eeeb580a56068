// The dashboard's parts without a browser: the embedded files as the control server
// serves them (compared byte for byte with dashboard/ in the source tree, with their
// headers; unknown and traversing paths 404), the /v1/dashboard WebSocket's first-message
// authentication over real loopback sockets, the bounded curves the leader keeps
// (leader/job_series.h) and a job's progress and ETA. The page itself is tested in
// headless Chromium by tests/integration/dashboard_test.cpp.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "leader/job_record.h"
#include "leader/leader.h"
#include "config/options.h"
#include "control/client.h"
#include "leader/job_series.h"
#include "control/dashboard_assets.h"
#include "control/server.h"
#include "support/control_fixtures.h"
#include "support/temp_dir.h"
#include "wire/control.h"

using namespace dltrain;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using json = nlohmann::json;

namespace {

std::string source_file(const std::string& rel) {
  std::ifstream in(std::filesystem::path(DLTRAIN_SOURCE_DIR) / "dashboard" / rel, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A ControlServer on 127.0.0.1:0 with its io thread; records what reaches its owner.
struct Served {
  explicit Served(std::chrono::seconds handshake_timeout = std::chrono::seconds(10), const std::string& tls_cert = "",
                  const std::string& tls_key = "") {
    control::ControlServerOptions o;
    o.tls_cert_file = tls_cert;
    o.tls_key_file = tls_key;
    o.agent_token = "agent-secret";
    o.client_token = "client-secret";
    o.handshake_timeout = handshake_timeout;
    control::ControlHandler h;
    h.on_open = [this](const std::shared_ptr<control::Session>& s) {
      opened += 1;
      kinds.push_back(s->kind());
    };
    h.on_message = [this](const std::shared_ptr<control::Session>& s, const std::string& text) {
      messages.push_back(text);
      const auto env = wire::parse_envelope(text);
      s->send(wire::make_reply(env.id, {{"echo", env.type}}));
    };
    server = std::make_unique<control::ControlServer>(io, o, h);
    server->start();
    thread = std::thread([this] { io.run(); });
  }
  ~Served() {
    asio::post(io, [this] {
      server->stop();
      io.stop();
    });
    thread.join();
  }
  // What the owner saw, copied on the io thread (which writes it).
  struct Seen {
    int opened = 0;
    std::vector<control::PeerKind> kinds;
    std::vector<std::string> messages;
  };
  Seen seen() {
    std::promise<Seen> p;
    asio::post(io, [&] { p.set_value(Seen{opened, kinds, messages}); });
    return p.get_future().get();
  }
  int opened = 0;
  std::vector<control::PeerKind> kinds;
  std::vector<std::string> messages;
  asio::io_context io;
  std::unique_ptr<control::ControlServer> server;
  std::thread thread;
};

http::response<http::string_body> request(std::uint16_t port, http::verb verb, const std::string& target) {
  asio::io_context io;
  beast::tcp_stream s(io);
  s.expires_after(std::chrono::seconds(10));
  s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> req(verb, target, 11);
  req.set(http::field::host, "127.0.0.1");
  http::write(s, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  if (verb == http::verb::head) p.skip(true);
  http::read(s, buf, p);
  return p.release();
}

// A browser's side of /v1/dashboard: no Authorization header.
struct DashboardSocket {
  explicit DashboardSocket(std::uint16_t port) : ws(io) {
    beast::get_lowest_layer(ws).expires_after(std::chrono::seconds(10));
    beast::get_lowest_layer(ws).connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    ws.handshake("127.0.0.1", "/v1/dashboard");
  }
  void send(const std::string& text) { ws.write(asio::buffer(text)); }
  // The next message, or nullopt once the server closed the session (bounded: 10 s).
  std::optional<std::string> next() {
    beast::get_lowest_layer(ws).expires_after(std::chrono::seconds(10));
    beast::flat_buffer buf;
    beast::error_code ec;
    ws.read(buf, ec);
    if (ec) {
      closed_by = ec;
      return std::nullopt;
    }
    return beast::buffers_to_string(buf.data());
  }
  asio::io_context io;
  websocket::stream<beast::tcp_stream> ws;
  beast::error_code closed_by;
};

std::string auth(const std::string& token, const std::string& id = "a1") {
  return wire::make_request(id, "auth", {{"token", token}});
}

}  // namespace

TEST(DashboardAssets, EveryEmbeddedFileIsItsSourceFileAndSlashIsTheIndex) {
  const std::vector<std::string> files{"index.html", "dashboard.js", "dashboard.css", "vendor/uPlot.iife.min.js",
                                       "vendor/uPlot.min.css", "vendor/LICENSE-uPlot"};
  ASSERT_EQ(control::dashboard_assets().size(), files.size());
  for (const auto& f : files) {
    const auto* a = control::find_dashboard_asset("/" + f);
    ASSERT_NE(a, nullptr) << f;
    EXPECT_EQ(std::string(a->body), source_file(f)) << f;
    EXPECT_FALSE(a->body.empty()) << f;
  }
  EXPECT_EQ(control::find_dashboard_asset("/"), control::find_dashboard_asset("/index.html"));
  EXPECT_EQ(control::find_dashboard_asset("/?token=x"), control::find_dashboard_asset("/index.html"));
  EXPECT_EQ(control::find_dashboard_asset("/dashboard.js#x")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(control::find_dashboard_asset("/dashboard.css")->content_type, "text/css; charset=utf-8");
  EXPECT_EQ(control::find_dashboard_asset("/index.html")->content_type, "text/html; charset=utf-8");
  // The chart library is the pinned version.
  EXPECT_NE(std::string(control::find_dashboard_asset("/vendor/uPlot.iife.min.js")->body).find("(v1.6.32)"),
            std::string::npos);
  for (const char* bad : {"", "/index.htm", "/../index.html", "/vendor/../index.html", "//index.html",
                          "/%2e%2e/index.html", "/dashboard.js/", "/vendor/", "/vendor", "/DASHBOARD.JS",
                          "/etc/passwd", "index.html"}) {
    EXPECT_EQ(control::find_dashboard_asset(bad), nullptr) << bad;
  }
}

TEST(DashboardHttp, TheServerSendsEachFileWithItsTypeAndSecurityHeadersAndNothingElse) {
  Served s;
  const auto port = s.server->port();
  auto res = request(port, http::verb::get, "/");
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res.body(), source_file("index.html"));
  EXPECT_EQ(res[http::field::content_type], "text/html; charset=utf-8");
  EXPECT_EQ(res["Content-Security-Policy"],
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'");
  EXPECT_EQ(res["X-Content-Type-Options"], "nosniff");
  EXPECT_EQ(res["Cache-Control"], "no-cache");
  EXPECT_EQ(res["X-Frame-Options"], "DENY");

  res = request(port, http::verb::get, "/vendor/uPlot.iife.min.js");
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[http::field::content_type], "text/javascript; charset=utf-8");
  EXPECT_EQ(res.body(), source_file("vendor/uPlot.iife.min.js"));

  res = request(port, http::verb::head, "/dashboard.js");
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[http::field::content_length], std::to_string(source_file("dashboard.js").size()));
  EXPECT_TRUE(res.body().empty());

  EXPECT_EQ(request(port, http::verb::post, "/").result_int(), 405);
  for (const char* bad : {"/../index.html", "/vendor/../dashboard.js", "/nope", "/%2e%2e/etc/passwd", "/v1/"}) {
    res = request(port, http::verb::get, bad);
    EXPECT_EQ(res.result_int(), 404) << bad;
    EXPECT_EQ(res.body(), R"({"error":"not found"})") << bad;
  }
  // The WebSocket path without an upgrade.
  EXPECT_EQ(request(port, http::verb::get, "/v1/dashboard").result_int(), 426);
}

// With TLS on the control channel the dashboard is served over https:// and wss:// on the
// same port, and plain HTTP there gets nothing.
TEST(DashboardHttp, WithTlsThePageAndItsSocketAreServedOverTlsOnly) {
  dltrain::testing::TempDir dir("dltrain-dashboard-tls");
  const std::string d = dir.path.string();
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  const std::string cmd = "cd " + d + " && openssl req -x509" + ec + "-days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem && " +
                          "openssl req" + ec + "-subj /CN=leader -keyout leader.key -out leader.csr && " +
                          "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && " +
                          "openssl x509 -req -in leader.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 " +
                          "-extfile san.ext -out leader.pem && chmod 600 leader.key ca.key";
  ASSERT_EQ(std::system((cmd + " 2>/dev/null").c_str()), 0) << cmd;
  Served s(std::chrono::seconds(10), d + "/leader.pem", d + "/leader.key");
  const auto port = s.server->port();

  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(d + "/ca.pem");
  ctx.set_verify_mode(asio::ssl::verify_peer);
  ctx.set_verify_callback(asio::ssl::host_name_verification("127.0.0.1"));
  {
    beast::ssl_stream<beast::tcp_stream> tls(io, ctx);
    beast::get_lowest_layer(tls).expires_after(std::chrono::seconds(10));
    beast::get_lowest_layer(tls).connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    tls.handshake(asio::ssl::stream_base::client);
    http::request<http::empty_body> req(http::verb::get, "/", 11);
    req.set(http::field::host, "127.0.0.1");
    http::write(tls, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(tls, buf, res);
    EXPECT_EQ(res.result_int(), 200);
    EXPECT_EQ(res.body(), source_file("index.html"));
    EXPECT_FALSE(res["Content-Security-Policy"].empty());
  }
  {
    websocket::stream<beast::ssl_stream<beast::tcp_stream>> wss(io, ctx);
    beast::get_lowest_layer(wss).expires_after(std::chrono::seconds(10));
    beast::get_lowest_layer(wss).connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    wss.next_layer().handshake(asio::ssl::stream_base::client);
    wss.handshake("127.0.0.1", "/v1/dashboard");
    wss.write(asio::buffer(auth("client-secret")));
    beast::flat_buffer buf;
    wss.read(buf);
    const auto env = wire::parse_envelope(beast::buffers_to_string(buf.data()));
    EXPECT_TRUE(env.ok) << env.error.dump();
    beast::error_code ig;
    wss.close(websocket::close_code::normal, ig);
  }
  // Plain HTTP on the TLS port: no page.
  beast::error_code plain;
  try {
    const auto res = request(port, http::verb::get, "/");
    EXPECT_NE(res.result_int(), 200);
  } catch (const boost::system::system_error& e) {
    plain = e.code();
  }
  EXPECT_TRUE(plain) << "plain HTTP got an answer on the TLS port";
}

TEST(DashboardSocket, TheClientTokenInTheFirstMessageOpensAClientSession) {
  Served s;
  DashboardSocket ws(s.server->port());
  ws.send(auth("client-secret"));
  auto r = ws.next();
  ASSERT_TRUE(r) << ws.closed_by.message();
  auto env = wire::parse_envelope(*r);
  EXPECT_EQ(env.id, "a1");
  EXPECT_TRUE(env.ok);
  EXPECT_EQ(env.body, json({{"peer", "client"}}));
  ws.send(wire::make_request("c2", "list", json::object()));
  r = ws.next();
  ASSERT_TRUE(r);
  env = wire::parse_envelope(*r);
  EXPECT_EQ(env.id, "c2");
  EXPECT_EQ(env.body, json({{"echo", "list"}}));
  ws.ws.close(websocket::close_code::normal);
  const auto seen = s.seen();
  EXPECT_EQ(seen.opened, 1);
  ASSERT_EQ(seen.kinds.size(), 1u);
  EXPECT_EQ(seen.kinds[0], control::PeerKind::kClient);
  // The auth message itself is the server's, never the owner's.
  ASSERT_EQ(seen.messages.size(), 1u);
  EXPECT_EQ(wire::parse_envelope(seen.messages[0]).type, "list");
}

TEST(DashboardSocket, AWrongTokenOrAnyOtherFirstMessageIsRefusedAndClosedBeforeTheOwnerSeesIt) {
  Served s;
  const std::vector<std::pair<std::string, std::string>> cases{
      {auth("wrong"), "wrong client token"},
      {auth("agent-secret"), "wrong client token"},  // the agent token is not the client's
      {auth(""), "wrong client token"},
      {wire::make_request("a1", "list", json::object()), "the first message must be auth {token}, got \"list\""},
      {R"({"v":1,"id":"a1","type":"auth","body":{"token":7}})", "token"},
      {"not json", "the first message must be auth {token}"},
  };
  for (const auto& [first, why] : cases) {
    DashboardSocket ws(s.server->port());
    ws.send(first);
    auto r = ws.next();
    ASSERT_TRUE(r) << first;
    const auto env = wire::parse_envelope(*r);
    EXPECT_FALSE(env.ok) << first;
    EXPECT_EQ(env.error.value("code", ""), wire::error_code::kUnauthorized) << first;
    EXPECT_NE(env.error.value("message", "").find(why), std::string::npos) << env.error.dump();
    // Then the session is closed: a further message gets no answer.
    beast::error_code ig;
    ws.ws.write(asio::buffer(wire::make_request("c2", "list", json::object())), ig);
    EXPECT_FALSE(ws.next()) << first;
  }
  const auto seen = s.seen();
  EXPECT_EQ(seen.opened, 0);
  EXPECT_TRUE(seen.messages.empty());
}

TEST(DashboardSocket, ASessionThatSendsNoAuthIsClosedAfterTheHandshakeTimeout) {
  Served s(std::chrono::seconds(1));
  DashboardSocket ws(s.server->port());
  EXPECT_FALSE(ws.next());  // closed by the server (the read is bounded by 10 s)
  EXPECT_EQ(ws.closed_by, websocket::error::closed) << ws.closed_by.message();
  EXPECT_EQ(s.seen().opened, 0);
}

// Before it has authenticated a session may not send the 4 MiB a client may: its first
// message is limited to 16 KiB, and one larger closes it.
TEST(DashboardSocket, AnOversizedFirstMessageClosesTheSession) {
  Served s;
  DashboardSocket ws(s.server->port());
  beast::error_code ig;
  ws.ws.write(asio::buffer(auth(std::string(17 * 1024, 'x'))), ig);
  EXPECT_FALSE(ws.next());
  EXPECT_EQ(s.seen().opened, 0);
  // A token of a few KiB (long, but under the limit) is read and refused as wrong.
  DashboardSocket ws2(s.server->port());
  ws2.send(auth(std::string(8 * 1024, 'x')));
  const auto r = ws2.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(wire::parse_envelope(*r).error.value("message", ""), "wrong client token");
}

// The leader's answers to the dashboard's own requests when they are wrong: the field
// named, and the session carries on.
TEST(DashboardRequests, SeriesAndEventsRefuseAMissingJobAnUnknownOneAndALimitOutOfRange) {
  asio::io_context io;
  dltrain::testing::TempDir dir("dltrain-dashboard-requests");
  leader::Leader leader(io, dltrain::testing::test_leader_options(dir.path.string()));
  leader.start();
  std::thread t([&] { io.run(); });
  {
    control::BlockingControlClient c("ws://127.0.0.1:" + std::to_string(leader.port()), "client-secret",
                                     std::chrono::seconds(5));
    auto refused = [&](const std::string& type, const json& body) -> std::pair<std::string, std::string> {
      try {
        c.request(type, body, std::chrono::seconds(5));
      } catch (const control::RemoteError& e) {
        return {e.code(), e.field()};
      }
      return {"", ""};
    };
    EXPECT_EQ(refused("series", json::object()), std::make_pair(std::string("bad_request"), std::string("job")));
    EXPECT_EQ(refused("series", {{"job", "job-9"}}), std::make_pair(std::string("not_found"), std::string("job")));
    EXPECT_EQ(refused("events", json::object()), std::make_pair(std::string("bad_request"), std::string("job")));
    EXPECT_EQ(refused("events", {{"job", "job-9"}}), std::make_pair(std::string("not_found"), std::string("job")));
    EXPECT_EQ(refused("events", {{"job", "job-1"}, {"limit", 0}}),
              std::make_pair(std::string("bad_request"), std::string("limit")));
    EXPECT_EQ(refused("events", {{"job", "job-1"}, {"limit", 1001}}),
              std::make_pair(std::string("bad_request"), std::string("limit")));
    EXPECT_EQ(refused("events", {{"job", 3}}), std::make_pair(std::string("bad_request"), std::string("job")));
    // The session still serves.
    EXPECT_TRUE(c.request("list", json::object(), std::chrono::seconds(5))["jobs"].empty());
  }
  asio::post(io, [&] {
    leader.stop();
    io.stop();
  });
  t.join();
}

TEST(JobSeries, AFullSeriesDropsEverySecondPointAndKeepsTheFirstAndTheNewest) {
  leader::BoundedSeries<int> b(4);
  for (int i = 1; i <= 4; ++i) b.add(i);
  EXPECT_EQ(b.points(), (std::vector<int>{1, 2, 3, 4}));
  b.add(5);  // full: 1 2 3 4 -> 1 3, then 5
  EXPECT_EQ(b.points(), (std::vector<int>{1, 3, 5}));
  b.add(6);
  b.add(7);  // 1 3 5 6 -> 1 5, then 7
  EXPECT_EQ(b.points(), (std::vector<int>{1, 5, 7}));
  for (int i = 8; i < 1000; ++i) {
    b.add(i);
    ASSERT_LE(b.points().size(), 4u);
  }
  EXPECT_EQ(b.points().front(), 1);
  EXPECT_EQ(b.points().back(), 999);
}

TEST(JobSeries, ColumnsPerWorkerAndPerEpochInUPlotsLayout) {
  leader::JobSeries s(8);
  s.add_progress("worker-1", {2.0, 10, 1, 1.5, 400, 1000, 2000});
  s.add_progress("worker-0", {1.0, 5, 1, 2.0, 300, 500, 700});
  s.add_progress("worker-0", {3.0, 15, 2, 1.0, 350, 900, 1300});
  s.add_epoch({4.0, 1, 1.25, 0.5});
  s.add_epoch({8.0, 2, 0.75, std::nullopt});
  const json j = s.to_json();
  ASSERT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["workers"][0]["task"], "worker-0");  // task-name order
  EXPECT_EQ(j["workers"][0]["t"], json({1.0, 3.0}));
  EXPECT_EQ(j["workers"][0]["global_step"], json({5, 15}));
  EXPECT_EQ(j["workers"][0]["epoch"], json({1, 2}));
  EXPECT_EQ(j["workers"][0]["loss"], json({2.0, 1.0}));
  EXPECT_EQ(j["workers"][0]["images_per_sec"], json({300.0, 350.0}));
  EXPECT_EQ(j["workers"][0]["bytes_pushed"], json({500, 900}));
  EXPECT_EQ(j["workers"][0]["bytes_pulled"], json({700, 1300}));
  EXPECT_EQ(j["workers"][1]["loss"], json({1.5}));
  EXPECT_EQ(j["epochs"]["epoch"], json({1, 2}));
  EXPECT_EQ(j["epochs"]["t"], json({4.0, 8.0}));
  EXPECT_EQ(j["epochs"]["train_loss"], json({1.25, 0.75}));
  EXPECT_EQ(j["epochs"]["test_accuracy"], json({0.5, nullptr}));
  EXPECT_EQ(j["capacity"], 8);
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.to_json()["workers"], json::array());
}

TEST(JobProgress, StepsTakenOverStepsInTheJobAndAnEtaAtTheRateSinceTheFirstReport) {
  leader::JobRec j;
  j.spec.epochs = 2;
  j.life = leader::JobLifecycle::restored(leader::JobState::kRunning, std::nullopt);
  EXPECT_FALSE(j.progress());
  leader::TaskRec w0, w1, ps;
  w0.kind = w1.kind = leader::TaskKind::kWorker;
  ps.kind = leader::TaskKind::kPs;
  w0.steps_per_epoch = 100;  // 200 steps in the job
  w1.steps_per_epoch = 100;
  w0.global_step = 50;
  w1.global_step = 250;  // more than the job has (a restart's overshoot): counted as 200
  j.tasks = {ps, w0, w1};
  ASSERT_TRUE(j.progress());
  EXPECT_DOUBLE_EQ(*j.progress(), (50.0 + 200.0) / 400.0);
  // 0.125 done at the first report, 0.625 now, after 10 s: 0.5 in 10 s, 0.375 to go.
  j.eta_base.training_since = leader::JobRec::Clock::now() - std::chrono::seconds(10);
  j.eta_base.progress_at_training_since = 0.125;
  ASSERT_TRUE(j.eta_seconds());
  EXPECT_NEAR(*j.eta_seconds(), 10.0 * 0.375 / 0.5, 0.1);  // the clock moved on a little
  j.eta_base.progress_at_training_since = 0.625;  // no step since the first report
  EXPECT_FALSE(j.eta_seconds());
  j.eta_base.progress_at_training_since = 0.125;
  j.life = leader::JobLifecycle::restored(leader::JobState::kSucceeded, std::nullopt);
  EXPECT_FALSE(j.eta_seconds());
  const json st = leader::job_json(j, std::nullopt);
  EXPECT_EQ(st["progress"], 1.0);  // a succeeded job is done, whatever its counters say
  EXPECT_FALSE(st.contains("eta_seconds"));
}
