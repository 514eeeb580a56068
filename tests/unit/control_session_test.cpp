// The control server's sessions (control/sessions.h) over beast::test::stream with a fail
// count, as Beast's own tests drive its streams: each scenario runs again and again, the
// server's N-th stream operation failing in run N (N = 1, 2, 3, ...; beast::test::
// fail_count(N) fails the N-th, 1-based, and every later one), until a run meets no
// failure: a scenario of K operations fails in runs 1 to K, each at another operation. Every run must end on both sides, bounded in time (the client learns the
// outcome: its reply or an error), and the owner's callbacks must pair up (on_close once
// for every on_open, never a message after it); the run without a failure must give the
// scenario's full result. The same code serves TCP and TLS in control/server.cpp;
// what only a socket has (TLS handshake and shutdown, deadlines) compiles out here and is
// tested over sockets in control_test.cpp.
#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include <boost/asio.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <gtest/gtest.h>

#include "control/sessions.h"
#include "wire/control.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using dltrain::control::Session;
using dltrain::control::SessionHost;

namespace {

constexpr std::size_t kMaxRuns = 400;  // far more operations than any scenario has

// What the owner saw: its callbacks, counted and checked for order.
struct Owner {
  int opens = 0, closes = 0, messages = 0, after_close = 0;
};

std::shared_ptr<SessionHost> make_host(Owner& owner) {
  dltrain::control::ControlServerOptions o;
  o.agent_token = "agent-secret";
  o.client_token = "client-secret";
  o.handshake_timeout = std::chrono::seconds(2);
  dltrain::control::ControlHandler h;
  h.on_open = [&owner](const std::shared_ptr<Session>&) { ++owner.opens; };
  h.on_message = [&owner](const std::shared_ptr<Session>& s, const std::string& text) {
    ++owner.messages;
    if (owner.closes > 0) ++owner.after_close;
    s->send("echo:" + text);
  };
  h.on_close = [&owner](const std::shared_ptr<Session>&) { ++owner.closes; };
  return std::make_shared<SessionHost>(SessionHost{std::move(o), std::move(h)});
}

// One connection to a fresh server side whose `n`-th stream operation fails: the owner,
// the host, the io_context and the two ends of a beast::test::stream.
struct Connection {
  Owner owner;
  std::shared_ptr<SessionHost> host;
  asio::io_context io;
  beast::test::fail_count fc;
  beast::test::stream server_end, client_end;

  explicit Connection(std::size_t n) : host(make_host(owner)), fc(n), server_end(io, fc), client_end(io) {
    server_end.connect(client_end);
  }
  /// Hands the server end to the sessions (control/sessions.h).
  void serve() { dltrain::control::serve_connection(std::move(server_end), "test-peer", host); }
};

// Runs `io` until `done()` or 10 s, then lets the server side settle (its last
// completions after the client's), bounded as well.
template <typename Done>
bool run_until(asio::io_context& io, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    if (io.run_one_for(std::chrono::milliseconds(100)) == 0 && io.stopped()) io.restart();
  }
  io.poll();
  return done();
}

// One client on /v1/client (bearer token) or /v1/dashboard (an auth message first):
// upgrade, one request, its reply, a normal close. `result` is "ok:<reply>" or the first
// error.
struct WsClient {
  websocket::stream<beast::test::stream> ws;
  beast::flat_buffer buf;
  std::string result;
  bool done = false;
  bool dashboard;

  WsClient(beast::test::stream s, bool dash) : ws(std::move(s)), dashboard(dash) {}

  void fail(const char* what, beast::error_code ec) {
    result = std::string(what) + ": " + ec.message();
    done = true;
  }
  void start() {
    if (!dashboard) {
      ws.set_option(websocket::stream_base::decorator(
          [](websocket::request_type& r) { r.set(http::field::authorization, "Bearer client-secret"); }));
    }
    ws.async_handshake("leader", dashboard ? "/v1/dashboard" : "/v1/client", [this](beast::error_code ec) {
      if (ec) return fail("handshake", ec);
      if (dashboard) return authenticate();
      request();
    });
  }
  void authenticate() {
    auth_ = dltrain::wire::make_request("a1", "auth", {{"token", "client-secret"}});
    ws.async_write(asio::buffer(auth_), [this](beast::error_code ec, std::size_t) {
      if (ec) return fail("auth write", ec);
      ws.async_read(buf, [this](beast::error_code ec2, std::size_t) {
        if (ec2) return fail("auth read", ec2);
        const auto env = dltrain::wire::parse_envelope(beast::buffers_to_string(buf.data()));
        buf.consume(buf.size());
        if (env.type != "reply") {
          result = "auth refused: " + env.type;
          done = true;
          return;
        }
        request();
      });
    });
  }
  void request() {
    ws.async_write(asio::buffer(std::string_view("ping")), [this](beast::error_code ec, std::size_t) {
      if (ec) return fail("write", ec);
      ws.async_read(buf, [this](beast::error_code ec2, std::size_t) {
        if (ec2) return fail("read", ec2);
        reply_ = beast::buffers_to_string(buf.data());
        buf.consume(buf.size());
        ws.async_close(websocket::close_code::normal, [this](beast::error_code ec3) {
          if (ec3) return fail("close", ec3);
          result = "ok:" + reply_;
          done = true;
        });
      });
    });
  }

 private:
  std::string auth_, reply_;
};

// Runs the WebSocket scenario with the server's operation `n` failing; returns the
// client's result and checks the invariants of every run.
std::string websocket_run(std::size_t n, bool dashboard) {
  Connection c(n);
  c.serve();
  Owner& owner = c.owner;
  WsClient client(std::move(c.client_end), dashboard);
  client.start();
  const bool ended = run_until(c.io, [&] { return client.done && owner.closes == owner.opens; });
  EXPECT_TRUE(ended) << "run " << n << ": client " << (client.done ? client.result : "still waiting") << ", "
                     << owner.opens << " opens, " << owner.closes << " closes";
  EXPECT_LE(owner.opens, 1) << "run " << n;
  EXPECT_EQ(owner.closes, owner.opens) << "run " << n;
  EXPECT_LE(owner.messages, 1) << "run " << n;
  EXPECT_EQ(owner.after_close, 0) << "run " << n;
  EXPECT_TRUE(c.host->sessions.empty()) << "run " << n << ": a session stayed registered";
  return client.result;
}

// Every run up to the first without a failure; returns how many runs failed (each at
// another of the server's operations).
std::size_t websocket_runs(bool dashboard) {
  for (std::size_t n = 1; n < kMaxRuns; ++n) {
    const std::string r = websocket_run(n, dashboard);
    if (::testing::Test::HasFailure()) return n - 1;
    if (r.rfind("ok:", 0) == 0) {
      EXPECT_EQ(r, "ok:echo:ping");
      return n - 1;
    }
  }
  ADD_FAILURE() << "no run of " << kMaxRuns << " got past the injected failures";
  return kMaxRuns;
}

}  // namespace

TEST(ControlSession, AClientSessionEndsCleanlyWhereverItsStreamFails) {
  const std::size_t failed = websocket_runs(false);
  std::cout << "[ figures  ] a client session: " << failed << " runs failed first, each at another operation" << std::endl;
  // The upgrade's read and write, the request's read, the reply's write and the close
  // are each an operation that failed in one run before the clean one.
  EXPECT_GE(failed, 5u);
}

TEST(ControlSession, ADashboardSessionEndsCleanlyWhereverItsStreamFailsBeforeOrAfterItsAuth) {
  const std::size_t failed = websocket_runs(true);
  std::cout << "[ figures  ] a dashboard session: " << failed << " runs failed first, each at another operation" << std::endl;
  EXPECT_GE(failed, 7u);  // the client session's operations and the auth message's two
}

// GET /healthz and a refused upgrade: one HTTP exchange each, failing at every operation.
TEST(ControlSession, AnHttpRequestGetsItsResponseOrAnEndWhereverItsStreamFails) {
  struct Case {
    const char* request;
    const char* want;  // the start of the response
  };
  const Case cases[] = {
      {"GET /healthz HTTP/1.1\r\nHost: leader\r\n\r\n", "HTTP/1.1 200 OK"},
      {"GET /v1/client HTTP/1.1\r\nHost: leader\r\nAuthorization: Bearer wrong\r\n\r\n", "HTTP/1.1 401 Unauthorized"},
      {"GET /nowhere HTTP/1.1\r\nHost: leader\r\n\r\n", "HTTP/1.1 404 Not Found"},
  };
  for (const auto& c : cases) {
    bool clean = false;
    for (std::size_t n = 1; n < kMaxRuns && !clean; ++n) {
      Connection conn(n);
      auto& client_end = conn.client_end;
      client_end.write_some(asio::buffer(std::string_view(c.request)));
      conn.serve();
      // The client reads to the end of the stream: the response, then the server's close.
      std::string got;
      bool ended = false;
      std::array<char, 4096> chunk{};
      std::function<void()> read_more = [&] {
        client_end.async_read_some(asio::buffer(chunk), [&](beast::error_code ec, std::size_t k) {
          got.append(chunk.data(), k);
          if (ec) {
            ended = true;
            return;
          }
          read_more();
        });
      };
      read_more();
      ASSERT_TRUE(run_until(conn.io, [&] { return ended; })) << c.request << " run " << n << ": the client waits";
      EXPECT_EQ(conn.owner.opens, 0);
      clean = got.rfind(c.want, 0) == 0;
      if (!clean) EXPECT_TRUE(got.empty()) << "run " << n << ": a partial response: " << got;
      if (clean) {
        EXPECT_GE(n - 1, 2u) << c.request;  // the request's read and the response's write failed first
        std::cout << "[ figures  ] " << c.want << ": " << n - 1 << " failed runs first" << std::endl;
      }
    }
    EXPECT_TRUE(clean) << c.request;
  }
}
