// Fuzzes the readers of etcd's JSON gateway replies (ha/etcd_json.h): what an etcd member,
// or anything answering on its port, sends a leader candidate.
//
// Input: a first byte choosing the HTTP status (200, or an error status) and the rest a
// reply body. Checks, beyond "no crash" and "only ProtocolError or EtcdError escapes, as
// documented":
//   - reply_of gives JSON only for status 200 and a body that parses without "error";
//   - every reader (range, txn, watch line, lease TTL and grant, the header's revision)
//     either reads the reply or throws ProtocolError;
//   - a pair kv_of read, written back as the gateway writes it (base64, decimal strings),
//     reads back the same; a transaction that succeeded carries no current pair.
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "fuzz_check.h"
#include "ha/etcd_json.h"

using namespace dltrain;
using namespace dltrain::ha;
using nlohmann::json;

namespace {

json written(const KeyValue& kv) {
  json j{{"key", gateway::b64(kv.key)}};
  if (!kv.value.empty()) j["value"] = gateway::b64(kv.value);
  if (kv.create_revision) j["create_revision"] = std::to_string(kv.create_revision);
  if (kv.mod_revision) j["mod_revision"] = std::to_string(kv.mod_revision);
  if (kv.version) j["version"] = std::to_string(kv.version);
  if (kv.lease) j["lease"] = std::to_string(kv.lease);
  return j;
}

bool same(const KeyValue& a, const KeyValue& b) {
  return a.key == b.key && a.value == b.value && a.create_revision == b.create_revision &&
         a.mod_revision == b.mod_revision && a.version == b.version && a.lease == b.lease;
}

template <typename F>
void reader(F&& f) {
  try {
    f();
  } catch (const ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned statuses[] = {200, 200, 200, 400, 401, 404, 500, 503};
  const unsigned status = statuses[data[0] % 8];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  json r;
  try {
    r = gateway::reply_of(status, text, "http://127.0.0.1:2379");
  } catch (const EtcdError& e) {
    FUZZ_CHECK(e.code() >= -1 && e.code() <= 1000, "an error code out of range");
    return 0;
  }
  FUZZ_CHECK(status == 200, "a reply of an error status was taken");
  FUZZ_CHECK(!(r.is_object() && r.contains("error")), "an error reply was taken");

  reader([&] {
    for (const auto& kv : gateway::range_kvs(r)) {
      const KeyValue again = gateway::kv_of(written(kv));
      FUZZ_CHECK(same(kv, again), "a pair written as the gateway writes it reads back otherwise");
    }
  });
  reader([&] {
    const auto t = gateway::txn_result(r);
    FUZZ_CHECK(!(t.succeeded && t.current), "a transaction that succeeded has a current pair");
  });
  reader([&] {
    std::vector<WatchEvent> events;
    const bool ended = gateway::watch_line(r, events);
    FUZZ_CHECK(ended || events.empty(), "a watch line with events did not end the watch");
  });
  reader([&] { (void)gateway::int_of(gateway::object_of(r, "result"), "TTL"); });
  reader([&] { (void)gateway::int_of(r, "ID"); });
  reader([&] { (void)gateway::int_of(gateway::object_of(r, "header"), "revision"); });
  reader([&] { (void)gateway::bool_of(r, "succeeded"); });
  reader([&] { (void)gateway::kv_of(r); });
  return 0;
}
