// Worker-side client of the PS shards (blocking calls with timeouts over TCP).
//
// The messages (init, push, pull, done) are built in ps/client.cpp; the connections they
// travel on (connect, authenticate, exchange, reconnect) live in ps/connection.h, which
// users of PsClient never include.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/errors.h"
#include "ps/partition.h"
#include "wire/frame.h"

namespace dltrain::ps {

namespace detail {
class ShardConnections;  // ps/connection.h: sockets, handshake, exchange, reconnect
}  // namespace detail

/// One partition's encoded push (see compress::GradientCompressor). The payload is
/// `first` followed by `second` (indices then values for sparse codecs).
struct PartitionPush {
  wire::Codec codec = wire::Codec::kDenseF32;
  std::uint32_t count = 0;             ///< elements (n for dense codecs, k for sparse/seeded)
  std::span<const std::byte> first;
  std::span<const std::byte> second;
  std::uint64_t seed = 0;              ///< kSeededF32: the index seed (sent in `seq`)
};

/// Where one PS shard listens.
struct PsEndpoint {
  std::string host;        ///< IP literal or host name
  std::uint16_t port = 0;
};

/// Identity and limits of a worker's PS connections.
struct PsClientOptions {
  std::uint64_t job = 0;
  std::uint32_t generation = 0;
  /// The job secret (raw bytes, at least kMinJobSecretBytes) the connections prove they
  /// know, and that each shard must prove it knows too (wire/auth.h).
  std::vector<std::uint8_t> secret;
  std::uint32_t rank = 0;          ///< this worker's rank, [0, num_workers)
  std::uint32_t num_workers = 1;   ///< the job's workers (an elastic job's max_workers)
  /// Say hello when connecting (join the shard's barrier). A ChunkClient's connection
  /// does not: it only claims training chunks.
  bool hello = true;
  /// Bound on the shards' silence within a call: connect gives up after it; push/pull/done
  /// fail when no read or write completed for this long (a call that keeps receiving
  /// replies goes on; time this worker spent suspended is not silence).
  std::chrono::milliseconds timeout{60000};
  /// Bound on resync(): how long a worker keeps trying to reach a shard that went away
  /// (e.g. while its agent restarts it).
  std::chrono::milliseconds reconnect_timeout{60000};
  /// This worker will use sparse pulls: its dense pulls ask the shards to record what it
  /// holds (x_seen), which costs the shard a copy of its partitions per worker.
  bool sparse_downlink = false;
  /// The low-rank downlink (compression method powersgd): per partition key, the block
  /// header of its tiling (compress::lowrank_header_words words: B, then rows, cols, rank
  /// per block). A pull below density 1 of a partition with a header asks its shard for a
  /// low-rank approximation of x − x_seen (wire::MessageType::kPullLowRank) instead of
  /// its top-k; an empty header (or none) keeps the top-k. Requires sparse_downlink.
  std::vector<std::vector<std::uint32_t>> lowrank_downlink;
  /// The fp16 downlink (compression method fp16): a step's pull at density 1 (push_pull,
  /// pull(params, ratio >= 1), start_pull) asks each shard for all of x − x_seen in
  /// binary16 (wire::MessageType::kPullHalf, ShardState::pull_half) and adds its decoding
  /// to `params`, the worker's replica, instead of overwriting them: half the bytes of a
  /// dense pull, the rounding error kept in x − x_seen for later pulls. pull(params) and
  /// resync()'s pulls stay dense fp32 (and record x_seen). Requires sparse_downlink.
  bool half_downlink = false;
  wire::FrameLimits limits;
  /// When set, every call checks it at least every 100 ms (also while it connects, waits
  /// for replies or backs off in resync()) and throws StopRequested once it is true. A
  /// worker sets it from its SIGTERM handler (a lock-free atomic store is
  /// async-signal-safe), so that it can save its replica and exit within its agent's stop
  /// grace even while a shard does not answer. Must outlive the client.
  const std::atomic<bool>* stop_requested = nullptr;
};

/// An elastic job's training chunks, claimed from PS shard 0's data dispatch
/// (ps/dispatch.h, wire kClaim) on a connection of their own that does not join the
/// barrier, so that a claim never waits behind a pull. Not thread-safe: one caller.
/// Errors as PsClient's (IoError, TimeoutError, StopRequested, ProtocolError).
class ChunkClient {
 public:
  /// `shard0`: where PS shard 0 listens; options.rank is the claiming worker's.
  ChunkClient(PsEndpoint shard0, PsClientOptions options);
  ~ChunkClient();
  ChunkClient(const ChunkClient&) = delete;
  ChunkClient& operator=(const ChunkClient&) = delete;
  /// One claim (ChunkDispatch::claim): acknowledges `acked` chunks, then asks for up to
  /// `want` of `epoch`; the first call of a process says it is fresh. Returns (epoch,
  /// chunk) pairs. Connects on first use and again after a lost connection (once).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> claim(std::uint32_t epoch, std::uint32_t want,
                                                             std::uint32_t acked, std::uint32_t chunks_per_epoch,
                                                             bool release = false);
  /// Whether the last claim had to reconnect (and so gave back what this worker held).
  bool reconnected() const { return reconnected_; }

 private:
  std::unique_ptr<detail::ShardConnections> conn_;
  bool fresh_ = true;
  bool open_ = false;
  bool reconnected_ = false;
};

/// A call gave up because PsClientOptions::stop_requested became true. The client is
/// closed; the caller's parameter replica holds what it had before the call, except that a
/// pull that was under way may have overwritten some partitions with the shard's values.
class StopRequested : public Error {
 public:
  using Error::Error;
};

/// A connection to a PS shard was lost in the middle of a call: closed or reset by the
/// shard, or a socket error (the shard process may have died and be restarting).
/// PsClient::resync() reconnects. A shard that refused a request (an error frame), a
/// malformed reply or a timeout are other errors.
class PsConnectionLost : public IoError {
 public:
  PsConnectionLost(std::size_t shard, const std::string& message) : IoError(message), shard_(shard) {}
  /// Index of the shard whose connection was lost.
  std::size_t shard() const noexcept { return shard_; }

 private:
  std::size_t shard_;
};

/// A push or a pull in flight, from PsClient::start_push / start_pull: the one handle a
/// worker waits on, as c10d's Work or ps-lite's timestamp + Wait, instead of a private
/// future. Move-only. Thread-safety: one owner at a time; wait() and the destructor are
/// not to be called concurrently (a thread that hands the handle on orders itself with
/// the next owner, as backward() orders its hook thread with the training thread).
class PsWork {
 public:
  PsWork() = default;  ///< none in flight
  PsWork(PsWork&&) noexcept = default;
  /// Waits for the call this handle holds before it takes another; an error nobody
  /// waited for is logged (as the destructor does), never lost silently.
  PsWork& operator=(PsWork&& other) noexcept;
  /// Waits for the call, so that none outlives its buffers; an error it ended with that
  /// no wait() saw is logged at error level with what it was.
  ~PsWork();

  /// True from start_push / start_pull until wait() returns or throws.
  bool active() const { return done_.valid(); }
  /// "push" or "pull" ("" when none was started).
  const char* what() const { return what_; }
  /// Blocks until the call has ended; rethrows what it threw (PsConnectionLost,
  /// TimeoutError, ProtocolError, IoError, StopRequested, and ConfigError for arguments
  /// the call refused: as PsClient::push / pull). Nothing when none is in flight.
  void wait();
  /// As wait(), but gives up after `timeout`: throws TimeoutError ("push still in flight
  /// after N ms", or "pull ...") and the handle stays active (the call goes on; its own
  /// deadline is PsClientOptions::timeout).
  void wait(std::chrono::milliseconds timeout);

 private:
  friend class PsClient;
  PsWork(const char* what, std::future<void> done) : what_(what), done_(std::move(done)) {}
  const char* what_ = "";
  std::future<void> done_;
};

/// Push/pull of the flat parameter vector against every PS shard of a job (the
/// ps-lite `Push / Pull` shape, blocking). Shards are served in parallel within a call.
///
/// Thread-safety: one thread at a time. Errors: PsConnectionLost when an established
/// connection breaks (call resync() to carry on), StopRequested (see PsClientOptions),
/// IoError when a connection fails, the
/// authentication handshake fails either way (the shard refused this worker, or the
/// shard could not prove it knows the secret) or the PS answers with an error frame,
/// TimeoutError when the shards stay silent for `timeout`, ProtocolError when the PS's
/// reply is malformed. After any error the client is closed.
class PsClient {
 public:
  /// `endpoints[s]` serves shard s of `layout`. Throws ConfigError when the counts
  /// disagree or the secret is shorter than kMinJobSecretBytes.
  PsClient(std::vector<PsEndpoint> endpoints, PartitionLayout layout, PsClientOptions options);
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  /// Connects to every shard (retrying refused connections until the timeout; each attempt
  /// bounded by what is left of it, so a host that drops packets cannot hold it), runs the
  /// authentication handshake with each (in parallel; not retried) and says hello.
  void connect();
  /// Offers values for every partition (`params` has layout.total_floats floats), each
  /// with seen_pushes(key): 0 before the first pull (a model's initial values, of which
  /// a shard keeps the first it receives), afterwards the count of this worker's last
  /// pull, so that a shard whose values have seen fewer pushes is rebuilt from them
  /// (ShardState::init).
  void init(std::span<const float> params);
  /// Pushes `grad` (total_floats) to be applied with learning rate `lr`, then pulls the
  /// current parameters into `params` (total_floats) — with
  /// PsClientOptions::half_downlink, adds their binary16 differences from what this
  /// worker holds, so `params` must be its replica. One round trip per shard.
  void push_pull(std::span<const float> grad, float lr, std::span<float> params);
  /// General form: pushes `pushes[key]` for every partition (encoded as the codec says),
  /// then pulls. With downlink_ratio >= 1 the pull is dense and overwrites `params` (with
  /// PsClientOptions::half_downlink: binary16 differences added to `params`);
  /// below 1 each shard answers with the top-k (k = max(1, ⌈ratio·n⌉)) of what changed
  /// since this worker's last pull, which is added to `params` (the worker's replica).
  void push_pull(std::span<const PartitionPush> pushes, float lr, double downlink_ratio, std::span<float> params);
  /// Pulls the current parameters into `params` (total_floats). Dense; the shards record
  /// that this worker now holds them (the base of later sparse pulls).
  void pull(std::span<float> params);
  /// The two halves of push_pull, for a worker that overlaps communication with its
  /// backward pass: push() writes the push frames of the partitions `keys` (any order,
  /// each at most once per step; `pushes` indexed by partition key, only those in `keys`
  /// read) and returns once they are written (pushes have no reply); pull() then pulls
  /// every partition as push_pull does (dense at downlink_ratio >= 1, or binary16 into the
  /// replica with PsClientOptions::half_downlink; below 1 sparse or low rank into the
  /// replica). A step pushed in pieces and then pulled puts exactly push_pull's
  /// frames on the wire. Errors as push_pull.
  void push(std::span<const PartitionPush> pushes, std::span<const std::uint32_t> keys, float lr);
  void pull(std::span<float> params, double downlink_ratio);
  /// push(pushes, keys, lr) on a thread of its own: returns at once with the handle to
  /// wait on (`keys` is copied). Until the handle's wait() has returned, neither this
  /// client nor the buffers `pushes[k]` of the keys point into may be used by anything
  /// else (a worker's overlapped push runs while backward computes the layers before
  /// it, which write other partitions). The push's errors come from wait().
  PsWork start_push(std::span<const PartitionPush> pushes, std::span<const std::uint32_t> keys, float lr);
  /// pull(params, downlink_ratio) on a thread of its own: returns at once with the
  /// handle to wait on. Until the handle's wait() has returned, neither this client nor
  /// `params` may be used by anything else (a worker's pipelined pull runs while its next
  /// batch goes forward, which touches neither). Throws ConfigError at once when `params`
  /// has the wrong size; the pull's own errors come from wait().
  PsWork start_pull(std::span<float> params, double downlink_ratio);
  /// Tells every shard this worker is done; returns the smallest count of finished
  /// workers any shard reports.
  std::uint32_t done();
  /// Smallest count of finished workers any shard reports.
  std::uint32_t workers_done();
  /// Elastic jobs: the most members still training that any shard counts (joined,
  /// neither left nor done; StepBarrier::members_training). 0 for other jobs.
  std::uint32_t members_training();
  /// Elastic jobs: tells every shard this worker leaves the job (a scale-down) after
  /// its last push, which the shards have applied or staged; no step waits for it
  /// afterwards. Returns the members still training.
  std::uint32_t leave();

  /// Recovers from a lost connection (PsConnectionLost): closes every connection, then
  /// reconnects to every shard with back-off (0.1 s doubling to 2 s) until
  /// `reconnect_timeout` has passed, redoing the authentication handshake and hello;
  /// offers `params` (total_floats, this worker's replica) as init with the push counts
  /// of its last pull — a shard that restarted without a checkpoint, or from one older
  /// than the replica, is rebuilt from the freshest replica offered — and pulls densely into `params` (which also
  /// resets this worker's x_seen on every shard for sparse pulls). Throws IoError naming
  /// the last failure when the shards cannot be reached again within the bound, and
  /// ConfigError when `params` has the wrong size.
  void resync(std::span<float> params);

  /// The pushes to partition `key` that this worker's replica of it reflects: the count
  /// its shard sent with the last complete pull reply (0 before any). Throws ConfigError
  /// when `key` is not a partition of the layout.
  std::uint64_t seen_pushes(std::uint32_t key) const;

  /// Bytes written to / read from the sockets, handshakes and frame headers included.
  std::uint64_t bytes_pushed() const;
  std::uint64_t bytes_pulled() const;

 private:
  void require_floats(std::size_t n, const char* call) const;
  // pull(params, downlink_ratio), or with `dense` a dense pull whatever the options say.
  void pull_as(std::span<float> params, double downlink_ratio, bool dense);
  void require_pushes(std::size_t n, std::size_t params) const;

  PartitionLayout layout_;
  std::vector<std::vector<Partition>> owned_;  ///< per shard, in the order the shard answers pulls
  std::vector<std::uint64_t> seen_pushes_;     ///< per partition key, see seen_pushes()
  std::unique_ptr<detail::ShardConnections> conn_;
};

}  // namespace dltrain::ps
