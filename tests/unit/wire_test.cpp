// Frame codec and payloads, data-plane handshake, control envelope and message bodies.
#include <array>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "job/job_spec.h"
#include "compress/fp16.h"
#include "compress/topk.h"
#include "ps/payload.h"
#include "wire/auth.h"
#include "wire/control.h"
#include "wire/control_bodies.h"
#include "wire/frame.h"
#include "wire/task_events.h"

using namespace dltrain;
using namespace dltrain::wire;

namespace {

using Buf = std::array<std::byte, kHeaderSize>;

Buf encode(const FrameHeader& h) {
  Buf b{};
  encode_header(h, std::span<std::byte, kHeaderSize>(b));
  return b;
}

FrameHeader decode(const Buf& b, const FrameLimits& l = {}) {
  return decode_header(std::span<const std::byte, kHeaderSize>(b), l);
}

std::string error_of(const Buf& b, const FrameLimits& l = {}) {
  try {
    decode(b, l);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

template <typename T>
void poke(Buf& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

}  // namespace

TEST(Frame, RoundTripsEveryMessageType) {
  const std::pair<MessageType, Codec> cases[] = {
      {MessageType::kHello, Codec::kBytes},       {MessageType::kHelloAck, Codec::kNone},
      {MessageType::kInit, Codec::kDenseF32},     {MessageType::kPush, Codec::kDenseF32},
      {MessageType::kPull, Codec::kNone},         {MessageType::kPullReply, Codec::kDenseF32},
      {MessageType::kDone, Codec::kNone},         {MessageType::kDoneAck, Codec::kNone},
      {MessageType::kQuery, Codec::kNone},        {MessageType::kQueryReply, Codec::kNone},
      {MessageType::kError, Codec::kBytes},       {MessageType::kPush, Codec::kSparseF32},
      {MessageType::kPush, Codec::kDenseF16},     {MessageType::kPullReply, Codec::kSparseF16}};
  std::uint32_t n = 1;
  for (auto [type, codec] : cases) {
    FrameHeader h;
    h.type = type;
    h.job = 0x0102030405060708ull + n;
    h.seq = 77 + n;
    h.key = 9 * n;
    h.codec = codec;
    h.count = codec == Codec::kNone ? 0 : 100 + n;
    ASSERT_TRUE(expected_payload_bytes(codec, h.count, h.payload_bytes));
    h.scale = 0.125f * static_cast<float>(n);
    h.generation = 3 + n;
    const FrameHeader d = decode(encode(h));
    EXPECT_EQ(d.type, type) << to_string(type);
    EXPECT_EQ(d.job, h.job);
    EXPECT_EQ(d.seq, h.seq);
    EXPECT_EQ(d.key, h.key);
    EXPECT_EQ(d.codec, codec);
    EXPECT_EQ(d.count, h.count);
    EXPECT_EQ(d.payload_bytes, h.payload_bytes);
    EXPECT_EQ(d.scale, h.scale);
    EXPECT_EQ(d.generation, h.generation);
    ++n;
  }
}

TEST(Frame, LayoutIsLittleEndianAtDocumentedOffsets) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.job = 5;
  h.key = 0x11223344;
  h.codec = Codec::kDenseF32;
  h.count = 2;
  h.payload_bytes = 8;
  const Buf b = encode(h);
  // "DLTR" in memory order, version 2, type 5.
  EXPECT_EQ(static_cast<char>(b[0]), 'D');
  EXPECT_EQ(static_cast<char>(b[1]), 'L');
  EXPECT_EQ(static_cast<char>(b[2]), 'T');
  EXPECT_EQ(static_cast<char>(b[3]), 'R');
  EXPECT_EQ(static_cast<int>(b[4]), 2);
  EXPECT_EQ(static_cast<int>(b[6]), 5);
  EXPECT_EQ(static_cast<int>(b[24]), 0x44);
  EXPECT_EQ(static_cast<int>(b[27]), 0x11);
  EXPECT_EQ(static_cast<int>(b[36]), 8);
}

TEST(Frame, RejectsWrongMagic) {
  Buf b = encode(FrameHeader{});
  poke<std::uint32_t>(b, 0, 0xDEADBEEF);
  EXPECT_EQ(error_of(b), "frame magic: expected 0x52544C44, got 0xDEADBEEF");
}

TEST(Frame, RejectsWrongVersion) {
  Buf b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 4, 1);  // a version-1 peer: its pull replies carry no push count
  EXPECT_EQ(error_of(b), "frame version: expected 2, got 1");
}

TEST(Frame, RejectsUnknownTypeAndCodecAndFlags) {
  Buf b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 6, 999);
  EXPECT_EQ(error_of(b), "frame type: unknown value 999");
  b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 28, 42);
  EXPECT_NE(error_of(b).find("frame codec: unknown value 42"), std::string::npos);
  b = encode(FrameHeader{});
  poke<std::uint16_t>(b, 30, 1);
  EXPECT_EQ(error_of(b), "frame flags: expected 0, got 1");
}

TEST(Frame, RejectsOversizedCountsBeforeAllocating) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.codec = Codec::kDenseF32;
  h.count = 1000;
  h.payload_bytes = 4000;
  FrameLimits small{100, 1u << 20};
  EXPECT_EQ(error_of(encode(h), small), "frame count: 1000 exceeds the limit 100");
  // A hostile header claiming 4 GiB - 1 of payload.
  h.count = 1u << 30;
  h.payload_bytes = 0xFFFFFFFFu;
  EXPECT_NE(error_of(encode(h)).find("exceeds the limit"), std::string::npos);
}

TEST(Frame, RejectsPayloadLengthThatDisagreesWithCodec) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.codec = Codec::kDenseF32;
  h.count = 10;
  h.payload_bytes = 39;  // truncated: 10 floats need 40 bytes
  EXPECT_EQ(error_of(encode(h)), "frame payload_bytes: codec 1 with count 10 needs 40 bytes, header says 39");
  h.codec = Codec::kSparseF32;
  h.payload_bytes = 40;  // 10 index/value pairs need 80
  EXPECT_EQ(error_of(encode(h)), "frame payload_bytes: codec 3 with count 10 needs 80 bytes, header says 40");
}

TEST(Frame, PayloadSizesPerCodec) {
  std::uint32_t b = 0;
  ASSERT_TRUE(expected_payload_bytes(Codec::kDenseF16, 7, b));
  EXPECT_EQ(b, 14u);
  ASSERT_TRUE(expected_payload_bytes(Codec::kSparseF16, 7, b));
  EXPECT_EQ(b, 42u);
  EXPECT_FALSE(expected_payload_bytes(Codec::kSparseF32, 0x40000000u, b));  // overflows 32 bits
}

TEST(ControlEnvelope, ParsesRequestsRepliesAndErrors) {
  auto req = parse_envelope(make_request("7", "submit", {{"job_toml", "x"}}));
  EXPECT_EQ(req.id, "7");
  EXPECT_EQ(req.type, "submit");
  EXPECT_EQ(req.body["job_toml"], "x");
  auto ok = parse_envelope(make_reply("7", {{"job", "job-1"}}));
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.body["job"], "job-1");
  auto err = parse_envelope(make_error("8", error_code::kInvalidJob, "batch_size: bad", "batch_size"));
  EXPECT_FALSE(err.ok);
  EXPECT_EQ(err.error["code"], "invalid_job");
  EXPECT_EQ(err.error["field"], "batch_size");
  auto ev = parse_envelope(make_event({{"event", "progress"}}));
  EXPECT_EQ(ev.type, "event");
  EXPECT_TRUE(ev.id.empty());
}

// An order of a leader elected through etcd carries its term (docs/ha.md "Fencing"); any
// other message has none (0).
TEST(ControlEnvelope, TheTermOfALeaderIsCarriedAndCheckedWhenPresent) {
  EXPECT_EQ(parse_envelope(make_request("l1", "start_task", nlohmann::json::object(), 42)).term, 42);
  EXPECT_EQ(parse_envelope(make_request("l1", "start_task", nlohmann::json::object())).term, 0);
  EXPECT_EQ(make_request("l1", "stop_task", nlohmann::json::object()).find("term"), std::string::npos);
  for (const char* bad : {R"({"v":1,"id":"1","type":"start_task","term":-1})",
                          R"({"v":1,"id":"1","type":"start_task","term":"42"})",
                          R"({"v":1,"id":"1","type":"start_task","term":1.5})",
                          R"({"v":1,"id":"1","type":"start_task","term":18446744073709551615})"}) {
    try {
      parse_envelope(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const dltrain::ProtocolError& e) {
      EXPECT_STREQ(e.what(), "control message field \"term\": expected a non-negative integer (a leader's term)");
    }
  }
}

TEST(ControlEnvelope, RejectsMalformedMessagesWithTheField) {
  auto msg = [](const std::string& text) {
    try {
      parse_envelope(text);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_EQ(msg("[1]"), "control message: expected a JSON object");
  EXPECT_EQ(msg(R"({"id":"1","type":"list"})"), "control message field \"v\": expected the protocol version (integer)");
  EXPECT_EQ(msg(R"({"v":2,"id":"1","type":"list"})"),
            "control message field \"v\": version 2 is not supported (this build speaks version 1)");
  EXPECT_EQ(msg(R"({"v":1,"id":"1"})"), "control message field \"type\": expected a non-empty string");
  EXPECT_EQ(msg(R"({"v":1,"type":"list"})"), "control message field \"id\": required for type \"list\"");
  EXPECT_EQ(msg(R"({"v":1,"id":"1","type":"list","body":[]})"), "control message field \"body\": expected an object");
  // Found while writing tests/fuzz/fuzz_control.cpp: 2^32 + 1 passed as version 1 (get<int> wrapped).
  EXPECT_EQ(msg(R"({"v":4294967297,"id":"1","type":"list"})"),
            "control message field \"v\": version 4294967297 is not supported (this build speaks version 1)");
  EXPECT_EQ(msg(R"({"v":1,"id":"1","type":"reply","ok":false,"error":{"message":5}})"),
            "control reply field \"error.message\": expected a string");
}

// Found while writing tests/fuzz/fuzz_task_events.cpp: a number that overflows a double made nlohmann
// throw json::out_of_range, which no caller caught, out of the leader's message handler
// (and so out of its event loop); a message nested four million deep
// would overflow the stack where nlohmann copies or dumps it recursively.
TEST(ControlEnvelope, OverflowingNumbersAndDeepNestingAreProtocolErrors) {
  try {
    parse_envelope(R"({"v":1,"id":"1","type":"list","body":{"x":1e400}})");
    FAIL() << "1e400 accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
  }
  const std::string deep = std::string(R"({"v":1,"id":"1","type":"list","body":{"x":)") + std::string(100000, '[') +
                           std::string(100000, ']') + "}}";
  try {
    parse_envelope(deep);
    FAIL() << "a message 100000 levels deep was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(std::string(e.what()), "control message: nested deeper than 64 levels");
  }
  std::string ok = R"({"v":1,"id":"1","type":"list","body":{"x":)";
  ok += std::string(60, '[') + std::string(60, ']') + "}}";
  EXPECT_NO_THROW(parse_envelope(ok));
}

// Found while writing tests/fuzz/fuzz_task_events.cpp: a task's log line that is
// not UTF-8 made make_request throw json::type_error (316) inside the agent.
TEST(ControlEnvelope, BuildersReplaceBytesThatAreNotUtf8) {
  const std::string line = "loss 0.4 \xff\xfe end";
  const auto ev = events::event_of_line(line);
  EXPECT_EQ(ev["event"], "log");
  const auto env = parse_envelope(make_request("a1", "task_event", TaskEventBody{{}, "job-1", "worker-0", 1, ev}.to_json()));
  EXPECT_EQ(env.body["event"]["line"], "loss 0.4 \xef\xbf\xbd\xef\xbf\xbd end");  // two U+FFFD
  EXPECT_NO_THROW(make_reply("1", {{"name", line}}));
  // Lines that are not one JSON object, or nest too deep, travel as log lines.
  EXPECT_EQ(events::event_of_line("[1,2]")["event"], "log");
  EXPECT_EQ(events::event_of_line(R"({"event":"progress","loss":1e400})")["event"], "log");
  EXPECT_EQ(events::event_of_line(std::string(1000, '{'))["event"], "log");
  EXPECT_EQ(events::event_of_line(R"({"event":"progress","rank":1})")["rank"], 1);
}

namespace {

std::string body_error(const std::string& type, const nlohmann::json& body, std::string* field = nullptr) {
  Envelope env;
  env.type = type;
  env.body = body;
  try {
    if (type == "register") parse_body<RegisterBody>(env);
    if (type == "start_task") parse_body<StartTaskBody>(env);
    if (type == "task_event") parse_body<TaskEventBody>(env);
    if (type == "task_exit") parse_body<TaskExitBody>(env);
    if (type == "submit") parse_body<SubmitBody>(env);
    if (type == "link_report") parse_body<LinkReportBody>(env);
  } catch (const BodyError& e) {
    if (field != nullptr) *field = e.field();
    return e.what();
  }
  return "(no error)";
}

nlohmann::json start_task_body() {
  StartTaskBody b;
  b.job = "job-3";
  b.job_num = 3;
  b.task = "worker-1";
  b.kind = TaskKind::kWorker;
  b.index = 1;
  b.generation = 2;
  b.secret = std::string(64, 'c');
  b.spec = JobSpec{};
  validate_job(b.spec);  // as the leader sends it: the data set's defaults filled in
  b.ps = {"10.0.0.2:7000", "[::1]:7001"};
  b.init_replica_generation = 1;
  return b.to_json();
}

}  // namespace

TEST(ControlBodies, StartTaskChecksItsGpusAndLocalGroup) {
  auto with = [](const char* key, const nlohmann::json& v) {
    auto b = start_task_body();
    b[key] = v;
    return b;
  };
  std::string field;
  EXPECT_EQ(body_error("start_task", with("gpus", {0, 64}), &field),
            "start_task field \"gpus\": expected distinct GPU indices in [0, 63], got 64");
  EXPECT_EQ(field, "gpus");
  EXPECT_EQ(body_error("start_task", with("gpus", {3, 3})),
            "start_task field \"gpus\": expected distinct GPU indices in [0, 63], got 3 twice");
  // A worker of a cuda job needs as many GPUs as gpus_per_worker.
  auto cuda = start_task_body();
  JobSpec spec;
  spec.device = Device::kCuda;
  spec.gpus_per_worker = 2;
  cuda["spec"] = spec;
  cuda["gpus"] = {1};
  EXPECT_EQ(body_error("start_task", cuda),
            "start_task field \"gpus\": a worker of a cuda job with gpus_per_worker = 2 needs as many GPUs, got 1");
  cuda["gpus"] = {1, 5};
  EXPECT_EQ(body_error("start_task", cuda), "(no error)");
  // A local group names this task at its rank.
  EXPECT_EQ(body_error("start_task", with("local_group", {{"rank", 1}, {"members", {"worker-0", "worker-1"}}})),
            "(no error)");
  EXPECT_NE(body_error("start_task", with("local_group", {{"rank", 0}, {"members", {"worker-0", "worker-1"}}}), &field)
                .find("member 0 is \"worker-0\", not this task \"worker-1\""),
            std::string::npos);
  EXPECT_EQ(field, "local_group");
  EXPECT_NE(body_error("start_task", with("local_group", {{"rank", 2}, {"members", {"worker-0", "worker-1"}}}))
                .find("local_group.rank\": expected [0, 2), got 2"),
            std::string::npos);
  EXPECT_NE(body_error("start_task", with("local_group", {{"rank", 0}, {"members", nlohmann::json::array()}}))
                .find("expected 1 to 256 members, got 0"),
            std::string::npos);
  EXPECT_NE(body_error("start_task", with("local_group", {{"rank", 1}, {"members", {"w/0", "worker-1"}}}))
                .find("not a valid name"),
            std::string::npos);
}

TEST(ControlBodies, EveryFieldRoundTripsThroughItsOneSchema) {
  Envelope env;
  env.type = "start_task";
  env.body = start_task_body();
  const auto b = parse_body<StartTaskBody>(env);
  EXPECT_EQ(b.job, "job-3");
  EXPECT_EQ(b.job_num, 3u);
  EXPECT_EQ(b.ps, (std::vector<std::string>{"10.0.0.2:7000", "[::1]:7001"}));
  EXPECT_EQ(b.init_replica_generation, 1u);
  EXPECT_FALSE(b.restore_generation.has_value());
  EXPECT_EQ(b.to_json(), env.body);
  EXPECT_EQ(b.spec.model, ModelKind::kCnn);
  env.type = "register";
  env.body = {{"name", "a1"}, {"cores", 4}, {"tasks", {{{"job", "job-1"}, {"task", "ps-0"}, {"generation", 2}}}},
              {"unknown", "ignored"}};
  const auto r = parse_body<RegisterBody>(env);
  EXPECT_EQ(r.advertise_address, "127.0.0.1");  // absent: the default
  ASSERT_EQ(r.tasks.size(), 1u);
  EXPECT_EQ(r.tasks[0].generation, 2u);
  EXPECT_FALSE(r.tasks[0].exited);
  EXPECT_FALSE(r.shard_cache_bytes.has_value());  // an older agent: absent
  env.body["shard_cache_bytes"] = 0;
  EXPECT_EQ(parse_body<RegisterBody>(env).shard_cache_bytes, std::optional<std::int64_t>(0));
  env.body["shard_cache_bytes"] = -1;
  try {
    parse_body<RegisterBody>(env);
    ADD_FAILURE() << "a negative shard_cache_bytes was accepted";
  } catch (const BodyError& e) {
    EXPECT_EQ(e.field(), "shard_cache_bytes");
  }
}

// Found while writing tests/fuzz/fuzz_control.cpp: a start_task whose job or
// task named a path ("../../x") made the agent create directories outside its state
// directory; mistyped fields threw nlohmann exceptions, one of them inside the agent's own
// catch handler (out of its event loop); a cores of 1e300 was undefined behaviour.
TEST(ControlBodies, BodiesThatDoNotFitTheirSchemaAreRefusedNamingTheField) {
  std::string field;
  auto with = [](const char* key, const nlohmann::json& v) {
    auto b = start_task_body();
    b[key] = v;
    return b;
  };
  EXPECT_EQ(body_error("start_task", with("job", "../../etc"), &field),
            "start_task field \"job\": \"../../etc\" is not a valid name (letters, digits, '-', '_' and '.'; not "
            "\".\" or \"..\")");
  EXPECT_EQ(field, "job");
  EXPECT_NE(body_error("start_task", with("task", ".."), &field).find("not a valid name"), std::string::npos);
  EXPECT_EQ(field, "task");
  EXPECT_NE(body_error("start_task", with("task", "a/b")).find("not a valid name"), std::string::npos);
  EXPECT_NE(body_error("start_task", with("task", "")).find("expected 1 to 256 characters, got 0"), std::string::npos);
  EXPECT_EQ(body_error("start_task", with("job", 5), &field), "start_task body: job: type must be string, but is number");
  EXPECT_EQ(field, "job");
  EXPECT_EQ(body_error("start_task", with("kind", "shell")), "start_task field \"kind\": expected ps or worker, got \"shell\"");
  // A task's kind and its job have no defaults: absent, they are refused as empty.
  auto no_kind = start_task_body();
  no_kind.erase("kind");
  EXPECT_EQ(body_error("start_task", no_kind, &field), "start_task field \"kind\": expected ps or worker, got \"\"");
  EXPECT_EQ(field, "kind");
  auto no_spec = start_task_body();
  no_spec.erase("spec");
  EXPECT_EQ(body_error("start_task", no_spec, &field).rfind("start_task field \"spec\": job: malformed job JSON", 0), 0u);
  EXPECT_EQ(field, "spec");
  EXPECT_NE(body_error("start_task", with("threads", 0)).find("\"threads\": expected >= 1, got 0"), std::string::npos);
  EXPECT_NE(body_error("start_task", with("secret", "zz"), &field).find("start_task for job-3/worker-1: secret:"),
            std::string::npos);
  EXPECT_EQ(field, "secret");
  EXPECT_NE(body_error("start_task", with("spec", {{"model", "cnn"}}), &field).find("malformed job JSON"),
            std::string::npos);
  EXPECT_EQ(field, "spec");
  EXPECT_NE(body_error("start_task", with("ps", {"a,b:1"})).find("holds a ','"), std::string::npos);
  EXPECT_NE(body_error("start_task", with("ps", {"nohost"})).find("expected HOST:PORT"), std::string::npos);
  EXPECT_NE(body_error("start_task", with("generation", -1), &field).find("generation: expected an integer in [0, 4294967295], got -1"),
            std::string::npos);
  EXPECT_NE(body_error("start_task", with("workers_done", {1, "x"}), &field).find("workers_done"), std::string::npos);
  EXPECT_NE(body_error("register", {{"name", "a"}, {"cores", 1e300}}, &field).find("cores: expected an integer"),
            std::string::npos);
  EXPECT_EQ(field, "cores");
  EXPECT_EQ(body_error("register", {{"cores", 2}}, &field), "register needs a name");
  EXPECT_EQ(field, "name");
  EXPECT_EQ(body_error("register", {{"name", "a"}, {"cores", 0}}), "cores must be >= 1, got 0");
  EXPECT_NE(body_error("register", {{"name", "a"}, {"cores", 1}, {"tasks", "x"}}, &field).find("tasks"), std::string::npos);
  EXPECT_EQ(body_error("task_event", {{"job", "job-1"}, {"event", 5}}), "task_event field \"event\": expected an object, got number");
  EXPECT_EQ(body_error("submit", {{"base_dir", "/"}}, &field), "submit needs \"job_toml\" (string)");
  EXPECT_EQ(field, "job_toml");
  EXPECT_NE(body_error("task_exit", {{"exit_code", "1"}}).find("exit_code"), std::string::npos);
  // What the agent reports about a request it refused never throws.
  const auto ref = TaskRefBody::lenient({{"job", 5}, {"task", "worker-1"}, {"generation", -3}});
  EXPECT_EQ(ref.job, "");
  EXPECT_EQ(ref.task, "worker-1");
  EXPECT_EQ(ref.generation, 0u);
  EXPECT_EQ(TaskRefBody::lenient(nlohmann::json::array()).task, "");
}

namespace {

FrameHeader push_header(Codec codec, std::uint32_t count, float scale = 0.5f) {
  FrameHeader h;
  h.type = MessageType::kPush;
  h.key = 4;
  h.codec = codec;
  h.count = count;
  h.scale = scale;
  std::uint32_t bytes = 0;
  expected_payload_bytes(codec, count, bytes);
  h.payload_bytes = bytes;
  return h;
}

template <typename T>
void put_words(std::vector<float>& words, std::size_t byte_off, const std::vector<T>& v) {
  words.resize(std::max(words.size(), (byte_off + v.size() * sizeof(T) + 3) / 4));
  std::memcpy(reinterpret_cast<std::byte*>(words.data()) + byte_off, v.data(), v.size() * sizeof(T));
}

}  // namespace

TEST(Payload, EveryPushCodecDecodesToTheValuesItCarries) {
  ps::PayloadScratch scratch;
  std::vector<float> dense;
  put_words(dense, 0, std::vector<float>{1.5f, -2.0f, 0.25f});
  auto v = ps::decode_push(push_header(Codec::kDenseF32, 3), dense, 3, scratch);
  EXPECT_FALSE(v.sparse);
  EXPECT_EQ(std::vector<float>(v.values.begin(), v.values.end()), (std::vector<float>{1.5f, -2.0f, 0.25f}));
  std::vector<float> half;  // 1.0, -2.0, 0.5 in binary16 (3 values: an odd number of halves)
  put_words(half, 0, std::vector<std::uint16_t>{0x3C00, 0xC000, 0x3800});
  v = ps::decode_push(push_header(Codec::kDenseF16, 3), half, 3, scratch);
  EXPECT_EQ(std::vector<float>(v.values.begin(), v.values.end()), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  std::vector<float> sparse;
  put_words(sparse, 0, std::vector<std::uint32_t>{1, 7});
  put_words(sparse, 8, std::vector<float>{3.0f, 4.0f});
  v = ps::decode_push(push_header(Codec::kSparseF32, 2), sparse, 10, scratch);
  EXPECT_TRUE(v.sparse);
  EXPECT_EQ(std::vector<std::uint32_t>(v.indices.begin(), v.indices.end()), (std::vector<std::uint32_t>{1, 7}));
  EXPECT_EQ(std::vector<float>(v.values.begin(), v.values.end()), (std::vector<float>{3.0f, 4.0f}));
  std::vector<float> sparse16;
  put_words(sparse16, 0, std::vector<std::uint32_t>{0, 9});
  put_words(sparse16, 8, std::vector<std::uint16_t>{0x3C00, 0xBC00});
  v = ps::decode_push(push_header(Codec::kSparseF16, 2), sparse16, 10, scratch);
  EXPECT_EQ(std::vector<float>(v.values.begin(), v.values.end()), (std::vector<float>{1.0f, -1.0f}));
  auto seeded_h = push_header(Codec::kSeededF32, 2);
  seeded_h.seq = 99;
  v = ps::decode_push(seeded_h, sparse, 10, scratch);
  std::vector<std::uint32_t> want;
  compress::randomk_indices(10, 2, 99, want);
  EXPECT_EQ(std::vector<std::uint32_t>(v.indices.begin(), v.indices.end()), want);
}

// Found while writing tests/fuzz/fuzz_frame.cpp: the scale of a push (its
// learning rate) was used unchecked, so one NaN poisoned every coordinate it touched.
TEST(Payload, NonFiniteScalesForeignCodecsAndOversizedSeededPushesAreRefused) {
  ps::PayloadScratch scratch;
  std::vector<float> dense(3, 1.0f);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    try {
      ps::decode_push(push_header(Codec::kDenseF32, 3, bad), dense, 3, scratch);
      FAIL() << "scale " << bad << " accepted";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("scale (learning rate)"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ps::decode_push(push_header(Codec::kBytes, 3), dense, 3, scratch), ProtocolError);
  EXPECT_THROW(ps::decode_push(push_header(Codec::kSeededF32, 3), dense, 2, scratch), ProtocolError);
}

// Found while writing tests/fuzz/fuzz_frame.cpp: a sparse pull reply with a bad
// index at position j had already added its first j pairs to the worker's replica.
TEST(Payload, ASparsePullReplyWithABadIndexChangesNothing) {
  std::vector<float> words;
  put_words(words, 0, std::vector<std::uint32_t>{0, 2, 9});
  put_words(words, 12, std::vector<float>{1.0f, 2.0f, 3.0f});
  std::vector<float> replica(5, 10.0f);
  try {
    ps::apply_sparse_reply(words, 3, replica);
    FAIL() << "index 9 of 5 accepted";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(std::string(e.what()), "bad index 9 at position 2 (indices must be strictly ascending and below 5)");
  }
  EXPECT_EQ(replica, std::vector<float>(5, 10.0f));
  std::vector<float> good;
  put_words(good, 0, std::vector<std::uint32_t>{0, 2});
  put_words(good, 8, std::vector<float>{1.0f, 2.0f});
  ps::apply_sparse_reply(good, 2, replica);
  EXPECT_EQ(replica, (std::vector<float>{11.0f, 10.0f, 12.0f, 10.0f, 10.0f}));
}

namespace {

std::string hex(std::span<const std::uint8_t> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (auto c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// The fixed inputs of the known-answer tests below.
struct AuthVector {
  std::array<std::uint8_t, 32> key{};
  Nonce nonce{};
  AuthVector() {
    for (int i = 0; i < 32; ++i) {
      key[i] = static_cast<std::uint8_t>(i);           // 00 01 .. 1f
      nonce[i] = static_cast<std::uint8_t>(0xa0 + i);  // a0 a1 .. bf
    }
  }
};

}  // namespace

TEST(DataPlaneAuth, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2; also `printf 'what do ya want for nothing?' | openssl dgst
  // -sha256 -hmac Jefe`.
  EXPECT_EQ(hex(hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(DataPlaneAuth, HandshakeMacsMatchAnIndependentComputation) {
  // Computed with Python's hmac module over the layout docs/protocol.md gives:
  //   import hmac, hashlib, struct
  //   key = bytes(range(32)); nonce = bytes(range(0xa0, 0xc0))
  //   msg = nonce + struct.pack('<QI', 7, 3) + b"dltrain data plane v1: worker"
  //   hmac.new(key, msg, hashlib.sha256).hexdigest()
  // and the same with b"dltrain data plane v1: ps shard" for the shard's proof.
  AuthVector v;
  EXPECT_EQ(hex(auth_mac(v.key, v.nonce, 7, 3, kWorkerContext)),
            "939902a31d848c46ddd23b9f100cd25e83ba2610033d06d9a57b75aeb2cdf1ab");
  EXPECT_EQ(hex(auth_mac(v.key, v.nonce, 7, 3, kShardContext)),
            "5a17b9d8d05759d9177090cb3482dd3b3469d8ec1c1fc284f61d526872381704");
  // Every input matters: another generation, job, nonce or key gives another MAC.
  const Mac m = auth_mac(v.key, v.nonce, 7, 3, kWorkerContext);
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, v.nonce, 7, 2, kWorkerContext)));
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, v.nonce, 8, 3, kWorkerContext)));
  Nonce other = v.nonce;
  other[31] ^= 1;
  EXPECT_FALSE(macs_equal(m, auth_mac(v.key, other, 7, 3, kWorkerContext)));
  auto key2 = v.key;
  key2[0] ^= 1;
  EXPECT_FALSE(macs_equal(m, auth_mac(key2, v.nonce, 7, 3, kWorkerContext)));
  EXPECT_TRUE(macs_equal(m, auth_mac(v.key, v.nonce, 7, 3, kWorkerContext)));
}

TEST(DataPlaneAuth, MessagesHaveTheDocumentedBytes) {
  AuthVector v;
  std::array<std::uint8_t, kChallengeSize> c{};
  encode_challenge(v.nonce, c);
  // magic "DLTA", version 1, type 1, then the nonce.
  EXPECT_EQ(hex(std::span(c).first(8)), "444c544101000100");
  EXPECT_EQ(hex(std::span(c).subspan(8)), hex(v.nonce));
  EXPECT_EQ(decode_challenge(c), v.nonce);

  AuthAnswer a;
  a.job = 0x0102030405060708ull;
  a.generation = 0x0a0b0c0d;
  a.nonce = v.nonce;
  a.mac = auth_mac(v.key, v.nonce, a.job, a.generation, kWorkerContext);
  std::array<std::uint8_t, kAnswerSize> b{};
  encode_answer(a, b);
  EXPECT_EQ(hex(std::span(b).first(24)), "444c544101000200" "0807060504030201" "0d0c0b0a" "00000000");
  EXPECT_EQ(hex(std::span(b).subspan(24, 32)), hex(a.nonce));
  EXPECT_EQ(hex(std::span(b).subspan(56)), hex(a.mac));
  const AuthAnswer back = decode_answer(b);
  EXPECT_EQ(back.job, a.job);
  EXPECT_EQ(back.generation, a.generation);
  EXPECT_EQ(back.nonce, a.nonce);
  EXPECT_EQ(back.mac, a.mac);

  std::array<std::uint8_t, kProofSize> p{};
  encode_proof(a.mac, p);
  EXPECT_EQ(hex(std::span(p).first(8)), "444c544101000300");
  EXPECT_EQ(decode_proof(p), a.mac);
}

TEST(DataPlaneAuth, DecodersRefuseForeignBytesNamingTheField) {
  AuthVector v;
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::array<std::uint8_t, kAnswerSize> b{};
  encode_answer(AuthAnswer{}, b);
  auto bad = b;
  bad[0] = 0x44;
  bad[3] = 0x52;  // a frame's magic "DLTR": a worker that skipped the handshake
  EXPECT_EQ(error_of([&] { decode_answer(bad); }),
            "handshake answer magic: expected 0x41544C44, got 0x52544C44 (not a dltrain data-plane peer, or an "
            "older version)");
  bad = b;
  bad[4] = 2;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer version: expected 1, got 2");
  bad = b;
  bad[6] = 3;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer type: expected 2, got 3");
  bad = b;
  bad[20] = 1;
  EXPECT_EQ(error_of([&] { decode_answer(bad); }), "handshake answer reserved field: expected 0, got 1");
  std::array<std::uint8_t, kChallengeSize> c{};
  encode_challenge(v.nonce, c);
  std::array<std::uint8_t, kProofSize> p{};
  std::memcpy(p.data(), c.data(), kProofSize);  // a challenge where a proof belongs
  EXPECT_EQ(error_of([&] { decode_proof(p); }), "handshake proof type: expected 3, got 1");
}

TEST(DataPlaneAuth, NoncesAreFresh) {
  // 256 random bits: two equal nonces would mean a broken generator.
  EXPECT_NE(random_nonce(), random_nonce());
}

TEST(ControlBodies, ALinkReportCarriesAPlausibleMeasurement) {
  Envelope env;
  env.type = "link_report";
  env.body = {{"bytes_per_sec", 1.25e7}, {"rtt_seconds", 0.0004}};
  const auto r = parse_body<LinkReportBody>(env);
  EXPECT_DOUBLE_EQ(r.bytes_per_sec, 1.25e7);
  EXPECT_DOUBLE_EQ(*r.rtt_seconds, 0.0004);
  std::string field;
  for (const auto& bad : {nlohmann::json(0), nlohmann::json(-5.0), nlohmann::json("fast")}) {
    field.clear();
    EXPECT_NE(body_error("link_report", {{"bytes_per_sec", bad}}, &field), "(no error)") << bad;
    EXPECT_EQ(field, "bytes_per_sec") << bad;
  }
  EXPECT_NE(body_error("link_report", nlohmann::json::object(), &field), "(no error)");
  EXPECT_EQ(field, "bytes_per_sec");
  EXPECT_NE(body_error("link_report", {{"bytes_per_sec", 1e6}, {"rtt_seconds", -1}}, &field), "(no error)");
  EXPECT_EQ(field, "rtt_seconds");
}
