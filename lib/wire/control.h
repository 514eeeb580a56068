// Control-plane messages (WebSocket text frames, JSON) between clients, agents and the
// leader. See docs/protocol.md for every message type.
//
// Envelope:  {"v": 1, "id": "<request id>", "type": "<type>", "body": {...}}
// Reply:     {"v": 1, "id": "<same id>", "type": "reply", "ok": true, "body": {...}}
// Error:     {"v": 1, "id": "<same id>", "type": "reply", "ok": false,
//             "error": {"code": "<ErrorCode>", "message": "...", "field": "..."}}
// Event:     {"v": 1, "type": "event", "body": {...}}   (unsolicited, no id)
// An order from a leader elected through etcd (docs/ha.md) also carries its term:
//            {"v": 1, "id": ..., "type": "start_task", "term": 42, "body": {...}}
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/enum_names.h"
#include "common/errors.h"

namespace dltrain::wire {

/// Every control message type (docs/protocol.md, "Control messages"); its name on the wire
/// is in EnumNames<ControlType> below, the one place it is spelt. The bodies are
/// wire/control_bodies.h's.
enum class ControlType {
  // client → leader
  kAuth, kSubmit, kPlan, kHistory, kList, kStatus, kCancel, kFollow, kAgents, kLogs, kModels, kModelRead,
  kModelUpload, kResume, kSeries, kEvents, kScale, kClusterPlan,
  // agent → leader
  kRegister, kHeartbeat, kModelDownload, kTaskEvent, kTaskExit, kLinkReport,
  // standby leader candidate → the serving leader (docs/ha.md "Artifacts")
  kReplicate,
  // leader → agent
  kStartTask, kStopTask, kReadLog, kReadModelFile,
  // either way
  kReply, kEvent,
};

}  // namespace dltrain::wire

namespace dltrain {
template <>
struct EnumNames<wire::ControlType> {
  using T = wire::ControlType;
  static constexpr std::array<EnumName<T>, 31> kNames{{
      {T::kAuth, "auth"},
      {T::kSubmit, "submit"},
      {T::kPlan, "plan"},
      {T::kHistory, "history"},
      {T::kList, "list"},
      {T::kStatus, "status"},
      {T::kCancel, "cancel"},
      {T::kFollow, "follow"},
      {T::kAgents, "agents"},
      {T::kLogs, "logs"},
      {T::kModels, "models"},
      {T::kModelRead, "model_read"},
      {T::kModelUpload, "model_upload"},
      {T::kResume, "resume"},
      {T::kSeries, "series"},
      {T::kEvents, "events"},
      {T::kScale, "scale"},
      {T::kClusterPlan, "cluster_plan"},
      {T::kRegister, "register"},
      {T::kHeartbeat, "heartbeat"},
      {T::kModelDownload, "model_download"},
      {T::kTaskEvent, "task_event"},
      {T::kTaskExit, "task_exit"},
      {T::kLinkReport, "link_report"},
      {T::kReplicate, "replicate"},
      {T::kStartTask, "start_task"},
      {T::kStopTask, "stop_task"},
      {T::kReadLog, "read_log"},
      {T::kReadModelFile, "read_model_file"},
      {T::kReply, "reply"},
      {T::kEvent, "event"},
  }};
};
}  // namespace dltrain

namespace dltrain::wire {

/// The only control protocol version this build speaks.
inline constexpr int kControlVersion = 1;
/// Keep-alive of control sessions, at both ends (control/server.cpp, control/client.cpp):
/// a ping after half of this idle time, and the session is closed when nothing at all
/// arrives for this long, so that a silently lost peer is noticed.
inline constexpr std::chrono::seconds kControlIdleTimeout{30};
/// Largest control message accepted, in bytes (a job file plus headroom).
inline constexpr std::size_t kMaxControlMessage = 4u << 20;
/// Deepest nesting of arrays and objects accepted in a peer's JSON (far deeper than any
/// message dltrain writes).
inline constexpr int kMaxJsonDepth = 64;

/// Typed error codes carried in error replies.
namespace error_code {
inline constexpr const char* kBadRequest = "bad_request";          ///< malformed envelope or body
inline constexpr const char* kUnsupportedVersion = "unsupported_version";
inline constexpr const char* kInvalidJob = "invalid_job";          ///< job file rejected
inline constexpr const char* kNotFound = "not_found";              ///< unknown job/agent
inline constexpr const char* kConflict = "conflict";               ///< e.g. cancel of a finished job
inline constexpr const char* kInfeasible = "infeasible";           ///< the planner found no configuration
inline constexpr const char* kInternal = "internal";
/// The dashboard's first message was not an `auth` with the client token.
inline constexpr const char* kUnauthorized = "unauthorized";
/// The session's user may not act on this job: it is another user's, and the user is no
/// admin (docs/operations.md, "Users"); the message names the owner.
inline constexpr const char* kForbidden = "forbidden";
/// The leader cannot accept the request now (its state database refuses writes: a full
/// disk, a read-only file system); the message names the cause. Reads still work.
inline constexpr const char* kUnavailable = "unavailable";
}  // namespace error_code

/// A request refused: the error reply's code (error_code), message and the body field it
/// names ("" = none). Thrown by the logic behind a handler; the peer's dispatch answers
/// it as an error reply to the request, and nothing else is changed.
class Refused : public Error {
 public:
  Refused(const char* code, const std::string& message, std::string field = "")
      : Error(message), code_(code), field_(std::move(field)) {}
  const char* code() const noexcept { return code_; }
  const std::string& field() const noexcept { return field_; }

 private:
  const char* code_;
  std::string field_;
};

/// A parsed, validated envelope.
struct Envelope {
  int v = kControlVersion;
  std::string id;     ///< empty for events
  std::string type;   ///< as the peer wrote it (messages quote it); is() compares it
  /// Whether this is a message of type `t`.
  bool is(ControlType t) const { return type == enum_name(t); }
  /// The message's type; nullopt for a name this build does not know.
  std::optional<ControlType> control_type() const { return enum_from_name<ControlType>(type); }
  nlohmann::json body = nlohmann::json::object();
  bool ok = true;                 ///< replies only
  nlohmann::json error;           ///< replies with ok == false
  /// The sending leader's term (docs/ha.md "Fencing"): the create revision of the etcd
  /// election key it won, > 0; 0 when absent (a single leader without [ha], any other peer).
  std::int64_t term = 0;
};

/// Parses JSON text from a peer (a control message, a task's event line). Throws
/// ProtocolError when it is not JSON or nests deeper than kMaxJsonDepth.
nlohmann::json parse_peer_json(const std::string& text);

/// Parses a text frame. Throws ProtocolError naming the problem: not JSON (or nested
/// deeper than kMaxJsonDepth), not an
/// object, missing or mistyped "v"/"type"/"id"/"body", an error reply whose "error" is
/// not an object or whose code, message or field is not a string, or an unsupported
/// version (message says which versions are supported).
Envelope parse_envelope(const std::string& text);

/// Builders. All return compact JSON text; bytes in a string that are not UTF-8 (a
/// task's log line, say) are written as U+FFFD rather than thrown about.
/// `term` > 0 adds the sending leader's term (Envelope::term); 0 leaves it out.
std::string make_request(const std::string& id, ControlType type, const nlohmann::json& body,
                         std::int64_t term = 0);
/// A request of a type given by name: what a client or a test sends as the user wrote it
/// (an unknown type gets the peer's "unknown message type" error).
std::string make_request(const std::string& id, const std::string& type, const nlohmann::json& body,
                         std::int64_t term = 0);
std::string make_reply(const std::string& id, const nlohmann::json& body);
std::string make_error(const std::string& id, const std::string& code, const std::string& message,
                       const std::string& field = "");
std::string make_event(const nlohmann::json& body);

/// One peer's handlers by message type (the leader's client and agent endpoints, the
/// agent's link to the leader): each type that peer may send maps to one handler, which
/// gets `Args` (the session, say) and the envelope. Not thread-safe to build; dispatch is
/// const.
template <typename... Args>
class Dispatcher {
 public:
  using Handler = std::function<void(Args..., const Envelope&)>;
  /// Registers the handler of `t` (replacing one registered before).
  Dispatcher& on(ControlType t, Handler h) {
    handlers_[static_cast<std::size_t>(t)] = std::move(h);
    return *this;
  }
  /// Calls the handler of env's type and returns true; false, calling nothing, for a type
  /// this build does not know or this peer may not send.
  bool dispatch(Args... args, const Envelope& env) const {
    const auto t = env.control_type();
    if (!t) return false;
    const auto& h = handlers_[static_cast<std::size_t>(*t)];
    if (!h) return false;
    h(args..., env);
    return true;
  }

 private:
  std::array<Handler, EnumNames<ControlType>::kNames.size()> handlers_{};
};

}  // namespace dltrain::wire
