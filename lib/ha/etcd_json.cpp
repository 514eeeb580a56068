#include "ha/etcd_json.h"

#include <charconv>
#include <span>

#include "common/errors.h"
#include "common/file_transfer.h"

namespace dltrain::ha::gateway {

using json = nlohmann::json;

namespace {

std::string shown(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 100); }

void need_object(const json& j, const char* what) {
  if (!j.is_object()) throw ProtocolError(std::string("etcd: ") + what + " is not an object: " + shown(j));
}

}  // namespace

std::string b64(const std::string& s) {
  return base64_encode(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

std::string unb64(const json& v, const char* what) {
  if (v.is_null()) return {};
  if (!v.is_string()) throw ProtocolError(std::string("etcd: \"") + what + "\" is not a base64 string: " + shown(v));
  const auto bytes = base64_decode(v.get<std::string>());  // ProtocolError when not base64
  return std::string(bytes.begin(), bytes.end());
}

std::int64_t int_of(const json& j, const char* key) {
  need_object(j, "a reply");
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      throw ProtocolError(std::string("etcd: \"") + key + "\" is out of range: " + shown(*it));
    }
    return it->get<std::int64_t>();
  }
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return v;
  }
  throw ProtocolError(std::string("etcd: \"") + key + "\" is not an integer: " + shown(*it));
}

namespace {

// The member `key` of the reply object `j`, checked by `is_type`: absent or null gives
// `absent`; any other JSON type is a ProtocolError naming the key and the `kind` expected.
json member_of(const json& j, const char* key, bool (json::*is_type)() const noexcept, const char* kind,
               json absent) {
  need_object(j, "a reply");
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absent;
  if (!((*it).*is_type)()) throw ProtocolError(std::string("etcd: \"") + key + "\" is not " + kind + ": " + shown(*it));
  return *it;
}

}  // namespace

json object_of(const json& j, const char* key) {
  return member_of(j, key, &json::is_object, "an object", json::object());
}

json array_of(const json& j, const char* key) { return member_of(j, key, &json::is_array, "an array", json::array()); }

bool bool_of(const json& j, const char* key) {
  return member_of(j, key, &json::is_boolean, "a boolean", false).get<bool>();
}

KeyValue kv_of(const json& j) {
  need_object(j, "a key-value pair");
  KeyValue kv;
  kv.key = unb64(j.contains("key") ? j["key"] : json(), "key");
  kv.value = unb64(j.contains("value") ? j["value"] : json(), "value");
  kv.create_revision = int_of(j, "create_revision");
  kv.mod_revision = int_of(j, "mod_revision");
  kv.version = int_of(j, "version");
  kv.lease = int_of(j, "lease");
  return kv;
}

std::vector<KeyValue> range_kvs(const json& reply) {
  std::vector<KeyValue> out;
  for (const auto& kv : array_of(reply, "kvs")) out.push_back(kv_of(kv));
  return out;
}

EtcdClient::TxnResult txn_result(const json& reply) {
  EtcdClient::TxnResult t;
  t.succeeded = bool_of(reply, "succeeded");
  t.revision = int_of(object_of(reply, "header"), "revision");
  if (!t.succeeded) {
    for (const auto& resp : array_of(reply, "responses")) {
      need_object(resp, "a transaction's response");
      const auto kvs = array_of(object_of(resp, "response_range"), "kvs");
      if (!kvs.empty()) t.current = kv_of(kvs.at(0));
    }
  }
  return t;
}

bool watch_line(const json& line, std::vector<WatchEvent>& out) {
  need_object(line, "a watch line");
  const json r = line.contains("result") ? object_of(line, "result") : line;
  const std::size_t before = out.size();
  for (const auto& e : array_of(r, "events")) {
    need_object(e, "a watch event");
    WatchEvent w;
    const auto type = e.find("type");
    if (type != e.end() && !type->is_null() && !type->is_string()) {
      throw ProtocolError("etcd: a watch event's \"type\" is not a string: " + shown(*type));
    }
    w.deleted = type != e.end() && type->is_string() && type->get<std::string>() == "DELETE";
    w.kv = kv_of(object_of(e, "kv"));
    out.push_back(std::move(w));
  }
  return out.size() > before || bool_of(r, "canceled");
}

json reply_of(unsigned status, const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (status != 200 || (j.is_object() && j.contains("error"))) {
    // {"error": "…", "message": "…", "code": N}, or on a streamed reply {"error":
    // {"grpc_code": N, "message": "…", …}}.
    std::string msg = text.substr(0, 300);
    int code = -1;
    if (j.is_object()) {
      const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : j;
      if (e.contains("message") && e["message"].is_string()) {
        msg = e["message"].get<std::string>();
      } else if (e.contains("error") && e["error"].is_string()) {
        msg = e["error"].get<std::string>();
      }
      for (const char* k : {"code", "grpc_code"}) {
        if (e.contains(k) && e[k].is_number_integer()) {
          const auto v = e[k].get<std::int64_t>();
          if (v >= 0 && v <= 1000) code = static_cast<int>(v);
        }
      }
    }
    throw EtcdError(where, code, "etcd at " + where + ": " + msg + " (HTTP " + std::to_string(status) + ")");
  }
  if (j.is_discarded()) throw EtcdError(where, -1, "etcd at " + where + ": a reply that is not JSON: " + text.substr(0, 200));
  return j;
}

}  // namespace dltrain::ha::gateway
