// The leader's log relay (leader/log_relay.h) without sockets: a reply reaches the client
// that asked with the agent's name and whether the task runs, an agent's error reaches
// it prefixed with the agent, a request left unanswered past the timeout is answered as
// unavailable, and replies to anything else are not the relay's.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

#include "leader/log_relay.h"
#include "wire/control.h"

using namespace dltrain;
using namespace dltrain::leader;
using json = nlohmann::json;

namespace {

// What one client was told.
struct Told {
  std::optional<json> body;
  std::string code, message, field;
  int answers = 0;
};

LogRelay::Client client_of(Told& t) {
  return {[&t](const json& body) {
            t.body = body;
            ++t.answers;
          },
          [&t](const std::string& code, const std::string& message, const std::string& field) {
            t.code = code;
            t.message = message;
            t.field = field;
            ++t.answers;
          }};
}

wire::Envelope parsed(const std::string& text) { return wire::parse_envelope(text); }

}  // namespace

TEST(LogRelay, AReplyReachesItsClientWithTheAgentAndWhetherTheTaskRuns) {
  LogRelay relay;
  const auto t0 = LogRelay::Clock::now();
  Told running, exited;
  relay.expect("log-1", "agent-a", true, client_of(running), t0);
  relay.expect("log-2", "agent-b", false, client_of(exited), t0);
  EXPECT_EQ(relay.size(), 2u);

  EXPECT_TRUE(relay.on_reply(parsed(wire::make_reply("log-1", {{"data", "line\n"}, {"running", true}}))));
  ASSERT_TRUE(running.body.has_value());
  EXPECT_EQ(*running.body, (json{{"data", "line\n"}, {"running", true}, {"agent", "agent-a"}}));
  // The agent says the process runs, the leader that the task will not run again: not running.
  EXPECT_TRUE(relay.on_reply(parsed(wire::make_reply("log-2", {{"data", ""}, {"running", true}}))));
  ASSERT_TRUE(exited.body.has_value());
  EXPECT_EQ((*exited.body)["running"], false);
  EXPECT_EQ(relay.size(), 0u);
  // A second reply to the same request, or one to a request the relay never sent, is not its.
  EXPECT_FALSE(relay.on_reply(parsed(wire::make_reply("log-1", json::object()))));
  EXPECT_FALSE(relay.on_reply(parsed(wire::make_reply("m-7", json::object()))));
  EXPECT_EQ(running.answers, 1);
}

TEST(LogRelay, AnAgentsErrorReachesTheClientNamingTheAgent) {
  LogRelay relay;
  Told told;
  relay.expect("log-3", "agent-c", true, client_of(told), LogRelay::Clock::now());
  EXPECT_TRUE(relay.on_reply(parsed(wire::make_error("log-3", wire::error_code::kNotFound, "no log yet", "task"))));
  EXPECT_FALSE(told.body.has_value());
  EXPECT_EQ(told.code, wire::error_code::kNotFound);
  EXPECT_EQ(told.message, "agent agent-c: no log yet");
  EXPECT_EQ(told.field, "task");
}

TEST(LogRelay, ARequestUnansweredPastTheTimeoutIsAnsweredUnavailable) {
  LogRelay relay;
  const auto t0 = LogRelay::Clock::now();
  Told early, late;
  relay.expect("log-4", "agent-d", true, client_of(early), t0);
  relay.expect("log-5", "agent-e", true, client_of(late), t0 + std::chrono::seconds(5));
  // 10 s after the first request: its deadline has come, the second's (15 s) has not.
  relay.expire(t0 + LogRelay::kReplyTimeout);
  EXPECT_EQ(early.code, wire::error_code::kUnavailable);
  EXPECT_EQ(early.message, "agent agent-d did not answer for the log within 10 s");
  EXPECT_EQ(late.answers, 0);
  EXPECT_EQ(relay.size(), 1u);
  // Its reply, arriving after it was answered, is no longer the relay's.
  EXPECT_FALSE(relay.on_reply(parsed(wire::make_reply("log-4", json::object()))));
  relay.expire(t0 + std::chrono::seconds(15));
  EXPECT_EQ(late.code, wire::error_code::kUnavailable);
  EXPECT_EQ(relay.size(), 0u);
}
