#include "wire/control.h"

#include "common/errors.h"

namespace dltrain::wire {

nlohmann::json parse_peer_json(const std::string& text) {
  try {
    // nlohmann parses without recursion, but copies, compares and dumps a value
    // recursively: a peer's [[[[...]]]] four million deep would overflow the stack there.
    return nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxJsonDepth) {
        throw ProtocolError("control message: nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number that overflows a double (1e400).
    throw ProtocolError(std::string("control message is not valid JSON: ") + e.what());
  }
}

Envelope parse_envelope(const std::string& text) {
  const nlohmann::json j = parse_peer_json(text);
  if (!j.is_object()) throw ProtocolError("control message: expected a JSON object");
  Envelope env;
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer()) {
    throw ProtocolError("control message field \"v\": expected the protocol version (integer)");
  }
  // Compared as the number it is: a version of 2^32 + 1 must not pass as 1.
  const bool ours = v->is_number_unsigned() ? v->get<std::uint64_t>() == kControlVersion
                                            : v->get<std::int64_t>() == kControlVersion;
  if (!ours) {
    throw ProtocolError("control message field \"v\": version " + v->dump() +
                        " is not supported (this build speaks version " +
                        std::to_string(kControlVersion) + ")");
  }
  env.v = kControlVersion;
  auto t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get<std::string>().empty()) {
    throw ProtocolError("control message field \"type\": expected a non-empty string");
  }
  env.type = t->get<std::string>();
  if (auto id = j.find("id"); id != j.end() && !id->is_null()) {
    if (!id->is_string()) throw ProtocolError("control message field \"id\": expected a string");
    env.id = id->get<std::string>();
  } else if (!env.is(ControlType::kEvent)) {
    throw ProtocolError("control message field \"id\": required for type \"" + env.type + "\"");
  }
  if (auto b = j.find("body"); b != j.end() && !b->is_null()) {
    if (!b->is_object()) throw ProtocolError("control message field \"body\": expected an object");
    env.body = *b;
  }
  if (env.is(ControlType::kReply)) {
    auto ok = j.find("ok");
    if (ok == j.end() || !ok->is_boolean()) {
      throw ProtocolError("control reply field \"ok\": expected a boolean");
    }
    env.ok = ok->get<bool>();
    if (!env.ok) {
      auto e = j.find("error");
      if (e == j.end() || !e->is_object()) {
        throw ProtocolError("control reply field \"error\": expected an object");
      }
      // Readers take code, message and field as strings (error.value("message", ...)).
      for (const char* key : {"code", "message", "field"}) {
        const auto f = e->find(key);
        if (f != e->end() && !f->is_string()) {
          throw ProtocolError(std::string("control reply field \"error.") + key + "\": expected a string");
        }
      }
      env.error = *e;
    }
  }
  if (auto term = j.find("term"); term != j.end() && !term->is_null()) {
    if (!term->is_number_integer() || (term->is_number_unsigned() ? term->get<std::uint64_t>() > INT64_MAX
                                                                   : term->get<std::int64_t>() < 0)) {
      throw ProtocolError("control message field \"term\": expected a non-negative integer (a leader's term)");
    }
    env.term = term->get<std::int64_t>();
  }
  return env;
}

std::string make_request(const std::string& id, const std::string& type, const nlohmann::json& body,
                         std::int64_t term) {
  nlohmann::json j{{"v", kControlVersion}, {"id", id}, {"type", type}, {"body", body}};
  if (term > 0) j["term"] = term;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string make_request(const std::string& id, ControlType type, const nlohmann::json& body, std::int64_t term) {
  return make_request(id, std::string(enum_name(type)), body, term);
}

std::string make_reply(const std::string& id, const nlohmann::json& body) {
  return nlohmann::json{{"v", kControlVersion}, {"id", id}, {"type", std::string(enum_name(ControlType::kReply))}, {"ok", true}, {"body", body}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string make_error(const std::string& id, const std::string& code, const std::string& message,
                       const std::string& field) {
  nlohmann::json err{{"code", code}, {"message", message}};
  if (!field.empty()) err["field"] = field;
  return nlohmann::json{{"v", kControlVersion}, {"id", id}, {"type", std::string(enum_name(ControlType::kReply))}, {"ok", false}, {"error", err}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string make_event(const nlohmann::json& body) {
  return nlohmann::json{{"v", kControlVersion}, {"type", std::string(enum_name(ControlType::kEvent))}, {"body", body}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dltrain::wire
