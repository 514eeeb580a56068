// The parts of the etcd client and the leader election that need no etcd: endpoint
// checking, the election's settings, the election key's value, and the error a client
// gives when nothing listens (a loopback port the kernel picked, then closed). The
// behaviour against a real etcd is tests/integration/ha_election_test.py's.
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>

#include "ha/election.h"
#include "ha/etcd_client.h"
#include "support/error_of.h"

namespace dltrain {
namespace {

using testing::message_of;

TEST(EtcdEndpoints, AreHttpOrHttpsUrlsWithAPort) {
  EXPECT_NO_THROW(ha::check_endpoints({"http://127.0.0.1:2379", "https://etcd-1.example:2379", "http://[::1]:2379/"}));
  EXPECT_EQ(message_of<ConfigError>([] { ha::check_endpoints({}); }),
            "etcd: expected at least one endpoint, e.g. [\"http://10.0.0.1:2379\"]");
  EXPECT_EQ(message_of<ConfigError>([] { ha::check_endpoints({"http://127.0.0.1:2379", "127.0.0.1:2379"}); }),
            "etcd: endpoint \"127.0.0.1:2379\": expected http://HOST:PORT or https://HOST:PORT");
  EXPECT_EQ(message_of<ConfigError>([] { ha::check_endpoints({"http://etcd"}); }),
            "etcd: endpoint \"http://etcd\": expected http://HOST:PORT or https://HOST:PORT");
  EXPECT_EQ(message_of<ConfigError>([] { ha::check_endpoints({"http://etcd:99999"}); }),
            "etcd: endpoint \"http://etcd:99999\": port \"99999\" is not in [1, 65535]");
  EXPECT_THROW(ha::check_endpoints({"http://etcd:2379/v3"}), ConfigError);
}

TEST(EtcdClient, NamesEachEndpointThatDidNotAnswer) {
  // A port nothing listens on: bound by the kernel's choice, then closed.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const auto port = a.local_endpoint().port();
  a.close();
  ha::EtcdOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(port)};
  o.request_timeout = std::chrono::milliseconds(2000);
  ha::EtcdClient c(o);
  const auto what = message_of<ha::EtcdError>([&] { c.check(); });
  EXPECT_EQ(what, "etcd: no endpoint answered /v3/maintenance/status (http://127.0.0.1:" + std::to_string(port) +
                      ": Connection refused)");
}

TEST(LeaderElection, RefusesSettingsOutOfRange) {
  ha::EtcdOptions e;
  e.endpoints = {"http://127.0.0.1:2379"};
  ha::ElectionOptions o;
  o.candidate = "agent-1";
  EXPECT_NO_THROW(ha::LeaderElection(e, o, {}));
  o.ttl_seconds = 1;
  EXPECT_EQ(message_of<ConfigError>([&] { ha::LeaderElection(e, o, {}); }), "lease_ttl: expected 2 to 300 seconds, got 1");
  o.ttl_seconds = 4;
  o.safety_margin = std::chrono::milliseconds(2001);
  EXPECT_EQ(message_of<ConfigError>([&] { ha::LeaderElection(e, o, {}); }),
            "lease_safety_margin: expected more than 0 and at most half the TTL (2000 ms), got 2001 ms");
  o.safety_margin = std::chrono::milliseconds(500);
  o.candidate.clear();
  EXPECT_THROW(ha::LeaderElection(e, o, {}), ConfigError);
}

TEST(LeaderElection, ANewCandidateDoesNotServe) {
  ha::EtcdOptions e;
  e.endpoints = {"http://127.0.0.1:2379"};
  ha::ElectionOptions o;
  o.candidate = "agent-1";
  ha::LeaderElection el(e, o, {});  // not started
  EXPECT_FALSE(el.serving());
  EXPECT_EQ(el.term(), 0);
  EXPECT_FALSE(el.leader());
}

TEST(LeaderElection, TheKeysValueNamesTheCandidateAndItsAddress) {
  ha::LeaderInfo info{"agent-2", "10.0.0.2:7070", 0, 1764900000.5, "0123456789abcdef"};
  const auto back = ha::LeaderElection::from_value(ha::LeaderElection::to_value(info), 42);
  EXPECT_EQ(back.candidate, "agent-2");
  EXPECT_EQ(back.address, "10.0.0.2:7070");
  EXPECT_EQ(back.term, 42);
  EXPECT_DOUBLE_EQ(back.since_unix, 1764900000.5);
  EXPECT_EQ(back.instance, "0123456789abcdef");  // two candidates named alike are told apart
  EXPECT_EQ(message_of<ProtocolError>([] { ha::LeaderElection::from_value("{\"x\":1}", 1); }),
            "the election key's value is not a dltrain leader's: {\"x\":1}");
  EXPECT_THROW(ha::LeaderElection::from_value("not json", 1), ProtocolError);
}

}  // namespace
}  // namespace dltrain
