#include "wire/control.h"

#include "common/errors.h"

namespace dltrain::wire {

Envelope parse_envelope(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ProtocolError(std::string("control message is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ProtocolError("control message: expected a JSON object");
  Envelope env;
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer()) {
    throw ProtocolError("control message field \"v\": expected the protocol version (integer)");
  }
  env.v = v->get<int>();
  if (env.v != kControlVersion) {
    throw ProtocolError("control message field \"v\": version " + std::to_string(env.v) +
                        " is not supported (this build speaks version " +
                        std::to_string(kControlVersion) + ")");
  }
  auto t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get<std::string>().empty()) {
    throw ProtocolError("control message field \"type\": expected a non-empty string");
  }
  env.type = t->get<std::string>();
  if (auto id = j.find("id"); id != j.end() && !id->is_null()) {
    if (!id->is_string()) throw ProtocolError("control message field \"id\": expected a string");
    env.id = id->get<std::string>();
  } else if (env.type != "event") {
    throw ProtocolError("control message field \"id\": required for type \"" + env.type + "\"");
  }
  if (auto b = j.find("body"); b != j.end() && !b->is_null()) {
    if (!b->is_object()) throw ProtocolError("control message field \"body\": expected an object");
    env.body = *b;
  }
  if (env.type == "reply") {
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
      env.error = *e;
    }
  }
  return env;
}

std::string make_request(const std::string& id, const std::string& type, const nlohmann::json& body) {
  return nlohmann::json{{"v", kControlVersion}, {"id", id}, {"type", type}, {"body", body}}.dump();
}

std::string make_reply(const std::string& id, const nlohmann::json& body) {
  return nlohmann::json{{"v", kControlVersion}, {"id", id}, {"type", "reply"}, {"ok", true}, {"body", body}}
      .dump();
}

std::string make_error(const std::string& id, const std::string& code, const std::string& message,
                       const std::string& field) {
  nlohmann::json err{{"code", code}, {"message", message}};
  if (!field.empty()) err["field"] = field;
  return nlohmann::json{{"v", kControlVersion}, {"id", id}, {"type", "reply"}, {"ok", false}, {"error", err}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string make_event(const nlohmann::json& body) {
  return nlohmann::json{{"v", kControlVersion}, {"type", "event"}, {"body", body}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dltrain::wire
