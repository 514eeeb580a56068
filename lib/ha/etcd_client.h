// A client of etcd's v3 API through its JSON gateway (HTTP/1.1 over Boost.Beast, TLS
// with OpenSSL): the key-value range, put, delete and transactions, leases, and watches —
// what leader election (ha/election.h) and a leader's state in etcd need. Debian ships no
// C++ etcd client; the gateway is etcd's documented path for languages without gRPC
// (etcd.io/docs/v3.4/dev-guide/api_grpc_gateway: `/v3/kv/range`, `/v3/kv/txn`,
// `/v3/lease/grant`, `/v3/watch`, …; keys and values are base64, 64-bit integers are
// decimal strings). docs/ha.md describes how dltrain uses it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace dltrain::ha {

/// Where etcd is and how to reach it ([ha] in the configuration).
struct EtcdOptions {
  /// Client URLs of the etcd members, "http://HOST:PORT" or "https://HOST:PORT", at least
  /// one. Requests go to one of them and move on to the next when it does not answer.
  std::vector<std::string> endpoints;
  /// etcd user and password (etcd's RBAC; /v3/auth/authenticate). Empty user: none.
  std::string user, password;
  /// https endpoints: the CA certificates that sign the members' certificates (PEM; empty:
  /// the system's), and a client certificate and key when etcd asks for one.
  std::string ca_file, cert_file, key_file;
  /// The longest one request may take on one endpoint, connection included. A member
  /// that lost its quorum holds requests until then.
  std::chrono::milliseconds request_timeout{2000};
};

/// An etcd key-value pair as the gateway returns it.
struct KeyValue {
  std::string key, value;
  std::int64_t create_revision = 0;  ///< the revision that created the key (0: absent)
  std::int64_t mod_revision = 0;     ///< the revision of its last change
  std::int64_t version = 0;          ///< changes since it was created
  std::int64_t lease = 0;            ///< the lease it is attached to (0: none)
};

/// A change a watch saw.
struct WatchEvent {
  bool deleted = false;  ///< DELETE (a lease expired, or a delete); else PUT
  KeyValue kv;           ///< the key (and its new value for a PUT)
};

/// An error from etcd or on the way to it: `endpoint` the member that gave it ("" when
/// every endpoint failed, the message then names each), `code` etcd's gRPC status code
/// when it answered (3 invalid argument, 9 failed precondition, 14 unavailable,
/// 16 unauthenticated, …; -1 when it did not answer).
class EtcdError : public IoError {
 public:
  EtcdError(std::string endpoint, int code, const std::string& what)
      : IoError(what), endpoint_(std::move(endpoint)), code_(code) {}
  const std::string& endpoint() const { return endpoint_; }
  int code() const { return code_; }

 private:
  std::string endpoint_;
  int code_;
};

/// One etcd cluster. Every call is synchronous and bounded (request_timeout per endpoint
/// tried); errors are EtcdError naming the endpoint and etcd's message. Not thread-safe:
/// one EtcdClient per thread (they are cheap: a connection per request).
class EtcdClient {
 public:
  /// Throws ConfigError("etcd", …) for an empty endpoint list or an endpoint that is not an
  /// http:// or https:// URL with a host and port, or TLS files that cannot be read.
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// Reaches a member (authenticating when a user is set) and returns its status line
  /// ("etcd 3.4.23 at http://…, cluster …, raft leader member …"). Throws EtcdError saying, for
  /// each endpoint, why it could not: a wrong address, TLS, credentials.
  std::string check();

  /// The key's pair, or nullopt when it is absent.
  std::optional<KeyValue> get(const std::string& key);
  /// The pairs whose key starts with `prefix`, in key order, at most `limit` (0: all),
  /// from key `from` on (empty: the first; a page after key K starts at K + '\0').
  /// `keys_only`: the values are left out (KeyValue::value empty).
  std::vector<KeyValue> get_prefix(const std::string& prefix, std::int64_t limit = 0, const std::string& from = "",
                                   bool keys_only = false);
  /// Puts `value` at `key` (attached to `lease` when not 0); returns the revision.
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  /// Deletes `key` (with `prefix`, every key under it); returns how many were deleted.
  std::int64_t erase(const std::string& key, bool prefix = false);

  /// The outcome of a transaction.
  struct TxnResult {
    bool succeeded = false;          ///< the comparison held and the put was made
    std::int64_t revision = 0;       ///< the store's revision after it
    std::optional<KeyValue> current; ///< on failure: `key`'s pair as it is (nullopt: absent)
  };
  /// Creates `key` = `value` (on `lease`) only when it does not exist (its
  /// create_revision is 0): the compare-and-swap of etcd's election recipe.
  TxnResult create(const std::string& key, const std::string& value, std::int64_t lease);
  /// Puts `key` = `value` only while `guard` has create_revision `guard_revision` (a
  /// fenced write: it fails once another leader created the election key `guard`).
  TxnResult put_if(const std::string& guard, std::int64_t guard_revision, const std::string& key,
                   const std::string& value);
  /// One operation of a fenced transaction.
  struct TxnOp {
    enum Kind { kPut, kDelete, kDeletePrefix } kind = kPut;
    std::string key, value;  ///< value: kPut only; kDeletePrefix deletes every key under `key`
    static TxnOp put(std::string k, std::string v) { return {kPut, std::move(k), std::move(v)}; }
    static TxnOp erase(std::string k) { return {kDelete, std::move(k), {}}; }
    static TxnOp erase_prefix(std::string k) { return {kDeletePrefix, std::move(k), {}}; }
  };
  /// Runs `ops` in one transaction (all or none) only while `guard` has create_revision
  /// `guard_revision`; on failure `current` is the guard as it is. etcd limits a
  /// transaction to 128 operations and a request to 1.5 MiB (its defaults).
  TxnResult fenced(const std::string& guard, std::int64_t guard_revision, const std::vector<TxnOp>& ops);
  /// Deletes `key` only while it has create_revision `revision` (resigning: it removes
  /// only this leader's key).
  bool erase_if(const std::string& key, std::int64_t revision);

  /// Discards etcd's history of key versions before `revision` (/v3/kv/compaction): what
  /// keeps its database from growing with every write. A revision already compacted is not
  /// an error.
  void compact(std::int64_t revision);

  /// A new lease of `ttl_seconds` (>= 1); returns its id.
  std::int64_t lease_grant(int ttl_seconds);
  /// Renews lease `id`: the seconds it has left, 0 when it has expired or is unknown.
  std::int64_t lease_keepalive(std::int64_t id);
  /// Revokes lease `id` (its keys are deleted). An unknown lease is not an error.
  void lease_revoke(std::int64_t id);

  /// Waits up to `timeout` for changes to `key` from revision `from_revision` on (0: from
  /// now): the first batch of events, or none when the time ran out (a short timeout in a
  /// loop lets the caller stop between waits).
  std::vector<WatchEvent> watch(const std::string& key, std::int64_t from_revision, std::chrono::milliseconds timeout);

  /// The endpoint the last request went to.
  const std::string& endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The URL list of a "[ha] etcd" setting: each "http(s)://HOST:PORT". Throws
/// ConfigError("etcd", …) naming a malformed one.
void check_endpoints(const std::vector<std::string>& endpoints);

}  // namespace dltrain::ha
