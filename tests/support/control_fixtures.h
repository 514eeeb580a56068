// Shared by the leader's control-endpoint tests (tests/unit/control_test.cpp and
// leader_control_test.cpp): a leader on loopback with its own io thread, a fixture with
// raw HTTP requests to it, and an agent played by hand over the real control protocol.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "config/options.h"
#include "control/client.h"
#include "leader/leader.h"
#include "wire/control.h"

namespace dltrain::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;


/// A leader's options for a test: 127.0.0.1 on an ephemeral port, the tokens
/// "agent-secret" and "client-secret", its store in `state_dir` ("" = none; never the
/// system's /var/lib/dltrain) and wss:// with `tls_cert` and `tls_key` when given.
inline config::AgentOptions test_leader_options(const std::string& state_dir = "", const std::string& tls_cert = "",
                                                const std::string& tls_key = "") {
  config::AgentOptions o;
  o.leader = true;
  o.listen_address = "127.0.0.1";
  o.listen_port = 0;
  o.agent_token = "agent-secret";
  o.client_token = "client-secret";
  o.state_dir = state_dir;
  o.tls_cert_file = tls_cert;
  o.tls_key_file = tls_key;
  return o;
}

// A leader on 127.0.0.1 (ephemeral port) with its own io thread, optionally with a store
// (`state_dir`) and serving wss:// (`tls_cert`, `tls_key`).
struct RunningLeader {
  explicit RunningLeader(const std::string& state_dir = "", const std::string& tls_cert = "",
                         const std::string& tls_key = "") {
    leader = std::make_unique<leader::Leader>(io, test_leader_options(state_dir, tls_cert, tls_key));
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
  std::unique_ptr<leader::Leader> leader;
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
inline const std::string kTwoTaskJob = "name = \"gen\"\nmodel = \"mlp\"\nworkers = 1\nps_shards = 1\nepochs = 1\n";


}  // namespace dltrain::testing
