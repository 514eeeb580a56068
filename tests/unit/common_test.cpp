// The shared readers: HOST:PORT (common/host_port.h), TOML values (common/toml_fields.h)
// and the agent configuration read with them (config/options.h), JSON field lists
// (common/json_fields.h), with the exact messages users see.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/options.h"
#include "common/errors.h"
#include "common/host_port.h"
#include "common/json_fields.h"
#include "common/toml_fields.h"
#include "wire/leader_events.h"
#include "wire/task_events.h"
#include "support/error_of.h"

using namespace dltrain;

using dltrain::testing::message_of;

TEST(HostPort, ParsesNamesIPv4AndIPv6) {
  const auto a = parse_host_port("ps.example:7000", "--ps");
  EXPECT_EQ(a.host, "ps.example");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(parse_host_port("[::1]:9", "x").host, "::1");
  EXPECT_EQ(parse_host_port("::1:9", "x").host, "::1");  // the last colon ends the host
  EXPECT_EQ(parse_host_port("10.0.0.2:65535", "x").port, 65535);
}

TEST(HostPort, RefusesWhatIsNotAnEndpointNamingTheField) {
  EXPECT_EQ(message_of<ConfigError>([] { parse_host_port("nohost", "--ps", "HOST:PORT[,HOST:PORT...]"); }),
            "--ps: expected HOST:PORT[,HOST:PORT...], got \"nohost\"");
  EXPECT_EQ(message_of<ConfigError>([] { parse_host_port(":80", "--ps"); }), "--ps: expected HOST:PORT, got \":80\"");
  EXPECT_EQ(message_of<ConfigError>([] { parse_host_port("h:0", "--ps"); }), "--ps: port out of range in \"h:0\"");
  EXPECT_EQ(message_of<ConfigError>([] { parse_host_port("h:65536", "--ps"); }), "--ps: port out of range in \"h:65536\"");
  EXPECT_EQ(message_of<ConfigError>([] { parse_host_port("h:12ab", "--ps"); }), "--ps: port is not a number in \"h:12ab\"");
}

TEST(TomlFields, ValuesOfTheWrongTypeOrRangeAreNamedWithWhatWasFound) {
  const auto t = toml_fields::parse("n = 3\ns = \"x\"\nf = 1.5\nb = true\n");
  EXPECT_EQ(toml_fields::get_int(*t.get("n"), "n", 0, 10), 3);
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_int(*t.get("n"), "n", 5, 10); }), "n: expected an integer in [5, 10], got 3");
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_int(*t.get("s"), "s", 0, 1); }),
            "s: expected an integer in [0, 1], got a string \"x\"");
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_double(*t.get("f"), "f", 0, 1, false, true); }),
            "f: expected a number in [0, 1), got 1.5");
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_bool(*t.get("n"), "n"); }), "n: expected true or false, got an integer 3");
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_string(*t.get("b"), "b"); }), "b: expected a string, got a boolean true");
  EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::get_duration(*t.get("n"), "n", "1s"); }),
            "n: expected a duration string such as \"1s\", got an integer 3");
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("x = \n"); }).rfind("TOML syntax error at line 1, column", 0), 0u);
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse_file("/nonexistent/dltrain.toml"); }),
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

// [ha] (docs/ha.md): a leader candidate's etcd settings, each checked and named; agents
// list the candidates in leader_url.
TEST(AgentOptions, HaSettingsAreReadAndEachMistakeIsNamed) {
  const std::string cand = "agent_token = \"t\"\nclient_token = \"c\"\nleader = true\nhost_tasks = false\n";
  const auto o = config::parse_agent_options(
      cand + "[ha]\netcd = [\"http://10.0.0.1:2379\", \"https://10.0.0.2:2379\"]\nuser = \"dltrain\"\n"
             "password = \"pw\"\nlease_ttl = \"15s\"\nprefix = \"/team-a\"\nca_file = \"ca.pem\"\n"
             "replication_timeout = \"2m\"\n",
      "/etc/dltrain");
  EXPECT_TRUE(o.ha.enabled());
  EXPECT_EQ(o.ha.etcd, (std::vector<std::string>{"http://10.0.0.1:2379", "https://10.0.0.2:2379"}));
  EXPECT_EQ(o.ha.user, "dltrain");
  EXPECT_EQ(o.ha.password, "pw");
  EXPECT_EQ(o.ha.lease_ttl_seconds, 15);
  EXPECT_EQ(o.ha.prefix, "/team-a");
  EXPECT_EQ(o.ha.ca_file, "/etc/dltrain/ca.pem");
  EXPECT_EQ(o.ha.replication_timeout, std::chrono::minutes(2));
  EXPECT_FALSE(config::parse_agent_options(cand, "/").ha.enabled());
  EXPECT_EQ(config::parse_agent_options(cand + "[ha]\netcd = [\"http://e:2379\"]\n", "/").ha.replication_timeout,
            std::chrono::seconds(60));
  const auto error = [&](const std::string& ha, const std::string& head = "") {
    return message_of<ConfigError>([&] { config::parse_agent_options((head.empty() ? cand : head) + ha, "/"); });
  };
  EXPECT_EQ(error("[ha]\nlease_ttl = \"10s\"\n"), "ha.etcd: required in [ha]: the etcd members' client URLs");
  EXPECT_EQ(error("[ha]\netcd = []\n"),
            "ha.etcd: expected a list of etcd client URLs such as [\"http://10.0.0.1:2379\"], got an empty list");
  EXPECT_EQ(error("[ha]\netcd = [\"10.0.0.1:2379\"]\n"),
            "ha.etcd[0]: expected http://HOST:PORT or https://HOST:PORT, got \"10.0.0.1:2379\"");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\nlease_ttl = \"1s\"\n"),
            "ha.lease_ttl: expected whole seconds from 2s to 300s, got \"1s\"");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\nreplication_timeout = \"2h\"\n"),
            "ha.replication_timeout: expected 0s to 1h, got \"2h\"");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\nuser = \"u\"\n"),
            "ha.password: etcd credentials need both user and password (or password_file)");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\nprefix = \"dltrain/\"\n"),
            "ha.prefix: expected a key prefix such as \"/dltrain\" (starting with /, not ending with /), got "
            "\"dltrain/\"");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\nttl = \"5s\"\n").rfind("ha.ttl: unknown key (expected etcd, ", 0), 0u);
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\n", "agent_token = \"t\"\n"),
            "ha: only a leader candidate (leader = true) takes part in the election; an agent lists the candidates' "
            "URLs in leader_url");
  EXPECT_EQ(error("[ha]\netcd = [\"http://e:2379\"]\n", "agent_token = \"t\"\nclient_token = \"c\"\nleader = true\n"),
            "leader_url: a leader candidate that hosts tasks (host_tasks = true) lists every candidate's URL here, so "
            "that its agent follows whichever serves (or host_tasks = false)");
  // An agent of HA candidates lists their URLs; one URL stays a list of one.
  const auto a = config::parse_agent_options(
      "agent_token = \"t\"\nleader_url = [\"ws://10.0.0.1:7070\", \"ws://10.0.0.2:7070\"]\n", "/");
  EXPECT_EQ(a.leader_urls, (std::vector<std::string>{"ws://10.0.0.1:7070", "ws://10.0.0.2:7070"}));
  EXPECT_EQ(a.leader_url, "ws://10.0.0.1:7070");
  EXPECT_EQ(config::parse_agent_options("agent_token = \"t\"\nleader_url = \"ws://h:1\"\n", "/").leader_urls,
            std::vector<std::string>{"ws://h:1"});
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\nleader_url = []\n", "/"); }),
            "leader_url: expected at least one URL");
}

// [users.NAME] (docs/operations.md, "Users"): each user's token, role and quotas, and
// every mistake named by its key.
TEST(AgentOptions, UsersAreReadWithTheirRolesAndQuotasAndEachMistakeIsNamed) {
  const std::string head = "agent_token = \"t\"\nclient_token = \"c\"\nleader = true\n";
  const auto o = config::parse_agent_options(head + "[users.alice]\ntoken = \"a1\"\nmax_cores = 8\nmax_gpus = 2\n"
                                                    "max_running_jobs = 3\npriority = 10\n[users.ops]\ntoken = \"o1\"\nrole = \"admin\"\n",
                                             "/");
  ASSERT_EQ(o.users.size(), 2u);
  EXPECT_EQ(o.users[0].name, "alice");
  EXPECT_EQ(o.users[0].token, "a1");
  EXPECT_FALSE(o.users[0].admin);
  EXPECT_EQ(o.users[0].max_cores, 8);
  EXPECT_EQ(o.users[0].max_gpus, 2);
  EXPECT_EQ(o.users[0].max_running_jobs, 3);
  EXPECT_EQ(o.users[0].priority, 10);
  EXPECT_EQ(o.users[1].name, "ops");
  EXPECT_TRUE(o.users[1].admin);
  EXPECT_EQ(o.users[1].max_cores, 0);  // no bound
  EXPECT_TRUE(config::parse_agent_options(head, "/").users.empty());
  const auto error = [&](const std::string& users, const std::string& h = "") {
    return message_of<ConfigError>([&] { config::parse_agent_options((h.empty() ? head : h) + users, "/"); });
  };
  EXPECT_EQ(error("[users.bob]\nrole = \"user\"\n"), "users.bob.token_file: required (or token): the token this user's clients present");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\nrole = \"root\"\n"),
            "users.bob.role: expected one of user | admin, got \"root\"");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\nmax_cores = -1\n").rfind("users.bob.max_cores: ", 0), 0u);
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\ncores = 1\n").rfind("users.bob.cores: unknown key (expected token, ", 0),
            0u);
  EXPECT_EQ(error("[users.bob]\ntoken = \"c\"\n"),
            "users.bob.token: the same token as client_token (the admin's): give each user its own");
  EXPECT_EQ(error("[users.bob]\ntoken = \"t\"\n"),
            "users.bob.token: the same token as agent_token: a user's token must not let it join as an agent");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\n[users.eve]\ntoken = \"b\"\n"),
            "users.eve.token: the same token as user \"bob\": each user needs its own");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\ntoken_file = \"b.token\"\n"), "users.bob.token: give token or token_file, not both");
  EXPECT_EQ(error("[users.admin]\ntoken = \"b\"\n"),
            "users.admin: \"admin\" is the user of the client token (client_token); name this user otherwise");
  EXPECT_EQ(error("[users.\"a b\"]\ntoken = \"b\"\n"), "users.a b: a user name is 1 to 64 letters, digits, '_', '.' or '-'");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\npriority = 1001\n").rfind("users.bob.priority: ", 0), 0u);
  EXPECT_EQ(error("users = 3\n"), "users: expected a table, got an integer");
  EXPECT_EQ(error("[users.bob]\ntoken = \"b\"\n", "agent_token = \"t\"\n"), "users: only the leader (leader = true) has users");
}

TEST(AgentOptions, KeysWrittenBelowThePricesTableAreNamedAsMisplaced) {
  // configs/leader.toml ends with [prices]: a key appended to it lands in that table.
  EXPECT_EQ(message_of<ConfigError>([] {
              config::parse_agent_options("agent_token = \"t\"\n[prices]\ncpu = 1.0\ntls_cert_file = \"c.pem\"\n", "/");
            }),
            "prices.tls_cert_file: \"tls_cert_file\" is a top-level key written below the [prices] table, so TOML "
            "reads it as a price; move it above [prices]");
  const auto o = config::parse_agent_options("agent_token = \"t\"\n[prices]\ncpu = 1.5\ngpu-a100 = 4\n", "/");
  EXPECT_DOUBLE_EQ(o.prices.at("cpu"), 1.5);
  EXPECT_DOUBLE_EQ(o.prices.at("gpu-a100"), 4.0);
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\nname = \"\"\n", "/"); }),
            "name: must not be empty");
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\nfrobnicate = 1\n", "/"); }),
            "frobnicate: unknown key");
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\nprogress_interval = \"50ms\"\n", "/"); }),
            "progress_interval: expected at least 100ms, got 50ms");
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\ncores = 5000\n", "/"); }),
            "cores: expected an integer in [0, 4096], got 5000");
  const auto p = config::parse_agent_options(
      "agent_token = \"t\"\nname = \"gpu-07\"\nstate_dir = \"state\"\nqueue_timeout = \"1h\"\n", "/etc/dltrain");
  EXPECT_EQ(p.name, "gpu-07");
  EXPECT_EQ(p.state_dir, "/etc/dltrain/state");
  EXPECT_EQ(p.queue_timeout, std::chrono::hours(1));
}

// Found while writing tests/fuzz/fuzz_task_events.cpp and fuzz_control.cpp: nlohmann's get<int>()
// converts a float with a static_cast, undefined behaviour for 1e300; integers that do not
// fit wrapped silently.
TEST(JsonFields, IntegerFieldsTakeOnlyIntegersThatFit) {
  namespace events = wire::events;
  using nlohmann::json;
  const auto error_of = [](const json& j) -> std::string {
    try {
      events::Started::from_json(j);
    } catch (const json::type_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(error_of({{"rank", 1e300}}).find("rank: expected an integer in [-2147483648, 2147483647], got 1e+300"),
            std::string::npos)
      << error_of({{"rank", 1e300}});
  EXPECT_NE(error_of({{"rank", 2.5}}).find("rank: expected an integer"), std::string::npos);
  EXPECT_NE(error_of({{"rank", 4294967296LL}}).find("got 4294967296"), std::string::npos);
  EXPECT_NE(error_of({{"train_examples", "12"}}).find("train_examples: expected an integer"), std::string::npos);
  EXPECT_EQ(events::Started::from_json({{"rank", 3.0}}).rank, 3);  // an integral float is that integer
  EXPECT_EQ(events::Started::from_json({{"rank", -2}}).rank, -2);
  // Unsigned fields refuse negative numbers; the extremes of a type fit.
  EXPECT_THROW(events::Recovering::from_json({{"generation", -1}}), json::type_error);
  EXPECT_EQ(events::Recovering::from_json({{"generation", 4294967295u}}).generation, 4294967295u);
  EXPECT_EQ(json_fields::get_value<std::int64_t>(json(-9223372036854775807LL - 1)), INT64_MIN);
  EXPECT_THROW(json_fields::get_value<std::int64_t>(json(9223372036854775808.0)), json::type_error);
  EXPECT_THROW(json_fields::get_value<std::uint64_t>(json(std::nan(""))), json::type_error);
  // Nested fields are named by their path.
  EXPECT_THROW(events::Done::from_json({{"traffic", {{"up", 1e300}}}}), json::type_error);
  try {
    events::Done::from_json({{"traffic", {{"up", 1e300}}}});
  } catch (const json::type_error& e) {
    EXPECT_NE(std::string(e.what()).find("traffic: up: expected an integer"), std::string::npos) << e.what();
  }
}

// Found by tests/fuzz/fuzz_job_toml.cpp and fuzz_agent_toml.cpp: toml++ 3.3 reaches
// __builtin_unreachable() (UBSan: "execution reached an unreachable program point") on a
// non-ASCII character where it looks for whitespace: first after a backslash in a
// multi-line string, then, in the long runs, after a value followed by a quote
// ("a=0\"\u0382", "x =9a8=\"...\u00e9"). toml++ is now given ASCII text with the same meaning.
TEST(TomlFields, NonAsciiTextIsGivenToTomlPlusPlusAsEscapesWithTheSameValues) {
  // Outside strings and comments a non-ASCII character is a syntax error, named with its line.
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("epochs = 100\xce\x82\n"); }),
            "TOML syntax error at line 1: a non-ASCII character outside a string or comment (keys and values are "
            "ASCII; quote it)");
  EXPECT_NE(message_of<ConfigError>([] { toml_fields::parse("[t]\nx = 1 \xc3\xa9"); }).find("line 2"), std::string::npos);
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("s = \"\"\"\\\xc3\xa9\"\"\"\n"); }),
            "TOML syntax error at line 1: a non-ASCII character right after a backslash (not an escape)");
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("a = 1\ns = \"\xc3\x28\"\n"); }),
            "TOML syntax error at line 2: text that is not valid UTF-8");
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("# \xed\xa0\x80\n"); }),  // a UTF-16 surrogate
            "TOML syntax error at line 1: text that is not valid UTF-8");
  // The inputs the fuzzers found: still refused, as the syntax errors they are.
  for (const char* bad : {"a=0\"\xce\x82", "x =9a8=\"p:t\xc3\xa9s\"\"\n", "name =0\"\"\"\x17\"1\"0\"0\xce\x82"}) {
    EXPECT_EQ(message_of<ConfigError>([&] { toml_fields::parse(bad); }).rfind("TOML syntax error at line 1", 0), 0u) << bad;
  }
  // Every kind of string holds any UTF-8, with the value written; quotes and backslashes
  // inside them do not confuse the rewriting; comments hold any UTF-8.
  const auto t = toml_fields::parse(
      "\xef\xbb\xbf# caf\xc3\xa9 \xe2\x82\xac\nname = \"caf\xc3\xa9 \\\" # \xc3\xa9\"\n"
      "lit = 'd\xc3\xa9j\xc3\xa0 \\ \"q\" \xf0\x9f\x98\x80'\n"
      "ml = \"\"\"\n\xc3\xa9t\xc3\xa9\"\"\"\"\nmll = '''\xc3\xa9 \\n \"\"\" ''''\n\"\xc3\xa9\" = 1 # \xc3\xa9\n"
      "lb = \"\"\"\\\n   \xc2\xa7\"\"\"\n[t . '\xce\xa9']\nv = [ \"\xd0\x96\", '\xd0\x96' ]\n");
  EXPECT_EQ(*t["name"].value<std::string>(), "caf\xc3\xa9 \" # \xc3\xa9");
  EXPECT_EQ(*t["lit"].value<std::string>(), "d\xc3\xa9j\xc3\xa0 \\ \"q\" \xf0\x9f\x98\x80");
  EXPECT_EQ(*t["ml"].value<std::string>(), "\xc3\xa9t\xc3\xa9\"");
  EXPECT_EQ(*t["mll"].value<std::string>(), "\xc3\xa9 \\n \"\"\" '");
  EXPECT_EQ(*t["\xc3\xa9"].value<std::int64_t>(), 1);
  EXPECT_EQ(*t["lb"].value<std::string>(), "\xc2\xa7");
  EXPECT_EQ(*t["t"]["\xce\xa9"]["v"][0].value<std::string>(), "\xd0\x96");
  EXPECT_EQ(*t["t"]["\xce\xa9"]["v"][1].value<std::string>(), "\xd0\x96");
  // Line numbers in toml++'s own errors stay those of the file.
  EXPECT_EQ(message_of<ConfigError>([] { toml_fields::parse("# \xc3\xa9\nn = \"\xc3\xa9\"\nm = \n"); }).rfind("TOML syntax error at line 3", 0),
            0u);
}

// Found while writing tests/fuzz/fuzz_agent_toml.cpp: a duration of 10^300 seconds was converted to
// integer milliseconds (undefined behaviour); "1.2.3s" and ".s" threw std::invalid_argument
// out of parse_duration_seconds instead of a ConfigError.
TEST(AgentOptions, DurationsThatDoNotParseOrFitAreNamed) {
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\nheartbeat_timeout = \"99999999999d\"\n", "/"); }),
            "heartbeat_timeout: expected at most 1000000000s, got \"99999999999d\"");
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\ntask_stop_grace = \".s\"\n", "/"); }),
            "task_stop_grace: expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \".s\"");
  EXPECT_EQ(message_of<ConfigError>([] { config::parse_agent_options("agent_token = \"t\"\ntask_stop_grace = \"1.2.3s\"\n", "/"); }),
            "task_stop_grace: expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \"1.2.3s\"");
  const std::string huge(400, '9');
  EXPECT_EQ(message_of<ConfigError>([&] { config::parse_agent_options("agent_token = \"t\"\nqueue_timeout = \"" + huge + "s\"\n", "/"); }),
            "queue_timeout: expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \"" + huge + "s\"");
  EXPECT_EQ(config::parse_agent_options("agent_token = \"t\"\ntask_stop_grace = \"1.5s\"\n", "/").task_stop_grace,
            std::chrono::milliseconds(1500));
}
