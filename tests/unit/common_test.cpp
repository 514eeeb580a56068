// The shared readers: HOST:PORT (common/host_port.h), TOML values (common/toml_fields.h)
// and the agent configuration read with them (agent/options.h), JSON field lists
// (common/json_fields.h), with the exact messages users see.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/options.h"
#include "common/errors.h"
#include "common/host_port.h"
#include "common/json_fields.h"
#include "common/toml_fields.h"
#include "wire/task_events.h"

using namespace dltrain;

namespace {

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(HostPort, ParsesNamesIPv4AndIPv6) {
  const auto a = parse_host_port("ps.example:7000", "--ps");
  EXPECT_EQ(a.host, "ps.example");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(parse_host_port("[::1]:9", "x").host, "::1");
  EXPECT_EQ(parse_host_port("::1:9", "x").host, "::1");  // the last colon ends the host
  EXPECT_EQ(parse_host_port("10.0.0.2:65535", "x").port, 65535);
}

TEST(HostPort, RefusesWhatIsNotAnEndpointNamingTheField) {
  EXPECT_EQ(message([] { parse_host_port("nohost", "--ps", "HOST:PORT[,HOST:PORT...]"); }),
            "--ps: expected HOST:PORT[,HOST:PORT...], got \"nohost\"");
  EXPECT_EQ(message([] { parse_host_port(":80", "--ps"); }), "--ps: expected HOST:PORT, got \":80\"");
  EXPECT_EQ(message([] { parse_host_port("h:0", "--ps"); }), "--ps: port out of range in \"h:0\"");
  EXPECT_EQ(message([] { parse_host_port("h:65536", "--ps"); }), "--ps: port out of range in \"h:65536\"");
  EXPECT_EQ(message([] { parse_host_port("h:12ab", "--ps"); }), "--ps: port is not a number in \"h:12ab\"");
}

TEST(TomlFields, ValuesOfTheWrongTypeOrRangeAreNamedWithWhatWasFound) {
  const auto t = toml_fields::parse("n = 3\ns = \"x\"\nf = 1.5\nb = true\n");
  EXPECT_EQ(toml_fields::get_int(*t.get("n"), "n", 0, 10), 3);
  EXPECT_EQ(message([&] { toml_fields::get_int(*t.get("n"), "n", 5, 10); }), "n: expected an integer in [5, 10], got 3");
  EXPECT_EQ(message([&] { toml_fields::get_int(*t.get("s"), "s", 0, 1); }),
            "s: expected an integer in [0, 1], got a string \"x\"");
  EXPECT_EQ(message([&] { toml_fields::get_double(*t.get("f"), "f", 0, 1, false, true); }),
            "f: expected a number in [0, 1), got 1.5");
  EXPECT_EQ(message([&] { toml_fields::get_bool(*t.get("n"), "n"); }), "n: expected true or false, got an integer 3");
  EXPECT_EQ(message([&] { toml_fields::get_string(*t.get("b"), "b"); }), "b: expected a string, got a boolean true");
  EXPECT_EQ(message([&] { toml_fields::get_duration(*t.get("n"), "n", "1s"); }),
            "n: expected a duration string such as \"1s\", got an integer 3");
  EXPECT_EQ(message([] { toml_fields::parse("x = \n"); }).rfind("TOML syntax error at line 1, column", 0), 0u);
  EXPECT_EQ(message([] { toml_fields::parse_file("/nonexistent/dltrain.toml"); }),
            "/nonexistent/dltrain.toml: cannot read it: No such file or directory");
}

TEST(JsonFields, WrongTypesThrowAndAbsentFieldsKeepDefaults) {
  namespace events = wire::events;
  using nlohmann::json;
  // A nested struct or a list of the wrong JSON type is refused, not read as empty.
  EXPECT_THROW(events::Listening::from_json(json::parse(R"({"port":1,"checkpoint":"x"})")), json::type_error);
  EXPECT_THROW(events::WaitingForAgent::from_json(json::parse(R"({"tasks":"worker-0"})")), json::type_error);
  EXPECT_THROW(events::Started::from_json(json::parse("[]")), json::type_error);
  // A null counts as absent for plain and optional fields.
  const auto e = events::EpochEnd::from_json(json::parse(R"({"epoch":2,"test_accuracy":null})"));
  EXPECT_EQ(e.epoch, 2);
  EXPECT_FALSE(e.test_accuracy.has_value());
  EXPECT_EQ(events::Restarting::from_json(json::object()).reason, "died");
}

TEST(AgentOptions, KeysWrittenBelowThePricesTableAreNamedAsMisplaced) {
  // configs/leader.toml ends with [prices]: a key appended to it lands in that table.
  EXPECT_EQ(message([] {
              agent::parse_agent_options("agent_token = \"t\"\n[prices]\ncpu = 1.0\ntls_cert_file = \"c.pem\"\n", "/");
            }),
            "prices.tls_cert_file: \"tls_cert_file\" is a top-level key written below the [prices] table, so TOML "
            "reads it as a price; move it above [prices]");
  const auto o = agent::parse_agent_options("agent_token = \"t\"\n[prices]\ncpu = 1.5\ngpu-a100 = 4\n", "/");
  EXPECT_DOUBLE_EQ(o.prices.at("cpu"), 1.5);
  EXPECT_DOUBLE_EQ(o.prices.at("gpu-a100"), 4.0);
  EXPECT_EQ(message([] { agent::parse_agent_options("agent_token = \"t\"\nname = \"\"\n", "/"); }),
            "name: must not be empty");
  EXPECT_EQ(message([] { agent::parse_agent_options("agent_token = \"t\"\nfrobnicate = 1\n", "/"); }),
            "frobnicate: unknown key");
  EXPECT_EQ(message([] { agent::parse_agent_options("agent_token = \"t\"\nprogress_interval = \"50ms\"\n", "/"); }),
            "progress_interval: expected at least 100ms, got 50ms");
  EXPECT_EQ(message([] { agent::parse_agent_options("agent_token = \"t\"\ncores = 5000\n", "/"); }),
            "cores: expected an integer in [0, 4096], got 5000");
  const auto p = agent::parse_agent_options(
      "agent_token = \"t\"\nname = \"gpu-07\"\nstate_dir = \"state\"\nqueue_timeout = \"1h\"\n", "/etc/dltrain");
  EXPECT_EQ(p.name, "gpu-07");
  EXPECT_EQ(p.state_dir, "/etc/dltrain/state");
  EXPECT_EQ(p.queue_timeout, std::chrono::hours(1));
}
