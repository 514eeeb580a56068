// Reading etcd's JSON gateway replies (etcd.io/docs/v3.4/dev-guide/api_grpc_gateway):
// keys and values in base64, 64-bit integers as decimal strings, zero values left out.
// What an etcd member (or anything answering on its port) sends is a peer's input: each
// reader takes any JSON value and either gives the typed result or throws ProtocolError
// naming what was wrong (an EtcdError for an error reply) — never a JSON library
// exception. No Beast here: lib/ha/etcd_client.cpp does the HTTP, and the fuzz target
// tests/fuzz/fuzz_etcd_json.cpp drives these readers with arbitrary bytes.
// Thread-safety: free functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ha/etcd_client.h"

namespace dltrain::ha::gateway {

/// `s` in base64 (RFC 4648 §4), as the gateway takes keys and values.
std::string b64(const std::string& s);
/// The bytes of base64 value `v`; "" for an absent (null) value. Throws ProtocolError for
/// a value that is not a base64 string.
std::string unb64(const nlohmann::json& v, const char* what);
/// Integer `key` of object `j`, as a number or a decimal string; 0 when absent (the
/// gateway leaves zero values out). Throws ProtocolError when `j` is not an object or the
/// value is not a 64-bit integer.
std::int64_t int_of(const nlohmann::json& j, const char* key);
/// Object `key` of object `j`; an empty object when absent. Throws ProtocolError otherwise.
nlohmann::json object_of(const nlohmann::json& j, const char* key);
/// Array `key` of object `j`; an empty array when absent. Throws ProtocolError otherwise.
nlohmann::json array_of(const nlohmann::json& j, const char* key);
/// Boolean `key` of object `j`; false when absent. Throws ProtocolError otherwise.
bool bool_of(const nlohmann::json& j, const char* key);
/// A mvccpb.KeyValue: {key, value, create_revision, mod_revision, version, lease}.
KeyValue kv_of(const nlohmann::json& j);
/// The pairs of a /v3/kv/range reply ({kvs: [...]}).
std::vector<KeyValue> range_kvs(const nlohmann::json& reply);
/// A /v3/kv/txn reply: succeeded, the header's revision and, on failure, the pair its
/// request_range read.
EtcdClient::TxnResult txn_result(const nlohmann::json& reply);
/// One line of a /v3/watch stream ({result: {events, canceled}} or the result itself):
/// its events appended to `out`; true when the watch ended (events came, or it was
/// canceled).
bool watch_line(const nlohmann::json& line, std::vector<WatchEvent>& out);
/// An HTTP reply of member `where` ("http://HOST:PORT"): its JSON body, for status 200
/// without an "error". Throws EtcdError with etcd's message and gRPC code (-1 when none)
/// for an error reply, or for a body that is not JSON.
nlohmann::json reply_of(unsigned status, const std::string& text, const std::string& where);

}  // namespace dltrain::ha::gateway
