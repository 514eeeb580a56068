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

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

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
/// The leader cannot accept the request now (its state database refuses writes: a full
/// disk, a read-only file system); the message names the cause. Reads still work.
inline constexpr const char* kUnavailable = "unavailable";
}  // namespace error_code

/// A parsed, validated envelope.
struct Envelope {
  int v = kControlVersion;
  std::string id;     ///< empty for events
  std::string type;
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
std::string make_request(const std::string& id, const std::string& type, const nlohmann::json& body,
                         std::int64_t term = 0);
std::string make_reply(const std::string& id, const nlohmann::json& body);
std::string make_error(const std::string& id, const std::string& code, const std::string& message,
                       const std::string& field = "");
std::string make_event(const nlohmann::json& body);

}  // namespace dltrain::wire
