// Fuzzes the control channel as the leader and the agents read it: the JSON envelope
// (wire::parse_envelope, every WebSocket text message) and every message body they
// accept (wire::parse_body of wire/control_bodies.h: register, task_event, task_exit, logs,
// read_log and its reply,
// submit / plan, status / cancel / follow / series, list, history, events, auth, replicate and
// its reply (the standby candidates' copying), start_task,
// stop_task).
//
// Input: one control message's text. Every body schema is tried on its body, whatever
// the envelope's type says, so that each parser sees every input. Checks, beyond "no
// crash" and "only ProtocolError escapes":
//   - an envelope that parses, written again by its builder (make_request, make_reply,
//     make_error, make_event), parses to the same envelope;
//   - a body that parses, written with to_json() and parsed again, gives the same JSON
//     (the schema is one list for both directions);
//   - what a parsed body promises holds: a start_task's job and task are single path
//     components, its kind ps or worker, its spec a job; a register's name is set and
//     its cores >= 1;
//   - nesting deeper than kMaxJsonDepth is refused.
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "job/job_spec.h"
#include "fuzz_check.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

using namespace dltrain;
using nlohmann::json;

namespace {

// Parses env.body as a B (the body of message type `type`), and checks the round trip.
template <typename B>
const B* try_body(const wire::Envelope& env, const char* type, B& out) {
  wire::Envelope e = env;
  e.type = type;
  try {
    out = wire::parse_body<B>(e);
  } catch (const wire::BodyError& err) {
    FUZZ_CHECK(!err.field().empty(), "a BodyError without a field");
    return nullptr;
  }
  const json once = out.to_json();
  e.body = once;
  B again;
  try {
    again = wire::parse_body<B>(e);
  } catch (const wire::BodyError& err) {
    std::fprintf(stderr, "%s body %s refused after a round trip: %s\n", type, once.dump().c_str(), err.what());
    FUZZ_CHECK(false, "a body that parsed does not parse again after to_json()");
  }
  FUZZ_CHECK(again.to_json() == once, "to_json(parse_body(to_json(b))) != to_json(b)");
  return &out;
}

bool is_path_component(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const ProtocolError&) {
    return 0;
  }
  const json raw = wire::parse_peer_json(text);
  FUZZ_CHECK(raw["v"].is_number_integer() && raw["v"] == wire::kControlVersion,
             "an envelope of another version was accepted");
  FUZZ_CHECK(!env.type.empty() && env.body.is_object(), "an envelope without type or object body");
  FUZZ_CHECK(fuzz::depth_of(env.body) <= wire::kMaxJsonDepth, "a body nested deeper than the limit was accepted");

  // The builders write what the parser reads.
  std::string rebuilt;
  if (env.type == "reply" && env.ok) {
    rebuilt = wire::make_reply(env.id, env.body);
  } else if (env.type == "reply") {
    rebuilt = json{{"v", wire::kControlVersion}, {"id", env.id}, {"type", "reply"}, {"ok", false},
                   {"error", env.error}, {"body", env.body}}
                  .dump();
    if (env.error.contains("code") && env.error.contains("message")) {
      const auto e = wire::parse_envelope(wire::make_error(env.id, env.error["code"], env.error["message"],
                                                           env.error.value("field", "")));
      FUZZ_CHECK(e.error["code"] == env.error["code"] && e.error["message"] == env.error["message"],
                 "make_error lost the code or message");
    }
  } else if (env.type == "event") {
    rebuilt = wire::make_event(env.body);
  } else {
    rebuilt = wire::make_request(env.id, env.type, env.body);
  }
  const auto again = wire::parse_envelope(rebuilt);
  FUZZ_CHECK(again.type == env.type && again.body == env.body && again.ok == env.ok && again.error == env.error,
             "the envelope changed through its builder");
  FUZZ_CHECK(env.type == "event" || again.id == env.id, "the request id changed through its builder");

  // Every body schema on this body.
  wire::RegisterBody reg;
  if (const auto* r = try_body(env, "register", reg)) {
    FUZZ_CHECK(!r->name.empty() && r->name.size() <= wire::kMaxNameLength && r->cores >= 1 && r->memory_mb >= 0,
               "register: a parsed body breaks its checks");
    FUZZ_CHECK(r->gpus.size() <= wire::kMaxGpus, "register: too many GPUs accepted");
    for (const auto& g : r->gpus) {
      FUZZ_CHECK(g.index >= 0 && g.index < static_cast<int>(wire::kMaxGpus) && g.memory_mb >= 0,
                 "register: a GPU out of range accepted");
    }
  }
  wire::ListBody list;
  if (const auto* l = try_body(env, "list", list)) {
    FUZZ_CHECK(l->limit >= 1 && l->limit <= wire::ListBody::kMaxLimit, "list: a limit out of range accepted");
  }
  wire::TaskRefBody ref;
  try_body(env, "stop_task", ref);
  wire::TaskEventBody ev;
  if (const auto* t = try_body(env, "task_event", ev)) FUZZ_CHECK(t->event.is_object(), "task_event: event not an object");
  wire::TaskExitBody ex;
  try_body(env, "task_exit", ex);
  wire::SubmitBody sub;
  if (const auto* s = try_body(env, "submit", sub)) FUZZ_CHECK(s->job_toml.has_value(), "submit without job_toml");
  wire::JobQueryBody q;
  try_body(env, "status", q);
  wire::HistoryBody hist;
  try_body(env, "history", hist);
  wire::LogRequestBody lr;
  for (const char* type : {"logs", "read_log"}) {
    if (const auto* l = try_body(env, type, lr)) {
      FUZZ_CHECK(is_path_component(l->job) && is_path_component(l->task),
                 "logs: a job or task name that is not one path component");
      FUZZ_CHECK((!l->offset || *l->offset >= 0) && l->tail >= 0 && l->tail <= wire::LogRequestBody::kMaxTail &&
                     l->max_bytes >= 1 && l->max_bytes <= wire::LogRequestBody::kMaxBytes,
                 "logs: a number out of range accepted");
    }
  }
  wire::EventsBody evs;
  if (const auto* e = try_body(env, "events", evs)) {
    FUZZ_CHECK(!e->job.empty() && e->limit >= 1 && e->limit <= wire::EventsBody::kMaxLimit,
               "events: an empty job or a limit out of range accepted");
  }
  wire::AuthBody auth;
  try_body(env, "auth", auth);
  wire::ReplicateBody rep;
  if (const auto* r = try_body(env, "replicate", rep)) {
    FUZZ_CHECK(!r->candidate.empty() && r->models.size() <= wire::ReplicateBody::kMaxItems &&
                   r->uploads.size() <= wire::ReplicateBody::kMaxItems,
               "replicate: an empty candidate or too many entries accepted");
    for (const auto& u : r->uploads) FUZZ_CHECK(is_sha256_hex(u), "replicate: an upload that is not a SHA-256 accepted");
  }
  wire::ReplicaInventoryBody inv;
  try_body(env, "reply", inv);  // what a standby reads back from the leader
  wire::LogChunkBody chunk;
  try_body(env, "reply", chunk);  // what the leader reads back from an agent's read_log
  wire::StartTaskBody st;
  if (const auto* s = try_body(env, "start_task", st)) {
    FUZZ_CHECK(is_path_component(s->job) && is_path_component(s->task),
               "start_task: a job or task name that is not one path component");
    FUZZ_CHECK(enum_name(s->kind) != "?", "start_task: unknown kind accepted");
    FUZZ_CHECK(s->threads >= 1 && s->index >= 0 && s->resume_epoch >= 0 && s->job_num >= 1,
               "start_task: a number out of range accepted");
    try {
      job_from_json(nlohmann::json(s->spec));  // the spec as accepted reads back
    } catch (const ConfigError&) {
      FUZZ_CHECK(false, "start_task: a spec whose JSON form job_from_json refuses was accepted");
    }
  }
  // What the agent reports about a refused start_task never throws.
  const auto lenient = wire::TaskRefBody::lenient(env.body);
  (void)lenient;
  return 0;
}
