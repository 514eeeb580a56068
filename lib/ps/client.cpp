// PsClient's messages: what init, push, pull, done and query frames carry and what their
// replies must look like. The connections they travel on are ps/connection.cpp's.
#include "ps/client.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <future>

#include <spdlog/spdlog.h>

#include "common/enforce.h"
#include "common/errors.h"
#include "common/secret.h"
#include "compress/fp16.h"
#include "compress/lowrank.h"
#include "compress/topk.h"
#include "ps/connection.h"
#include "ps/payload.h"

namespace dltrain::ps {

using detail::HeaderBytes;
using detail::Request;
using detail::ShardConnections;

namespace {

// The block header of partition `key`'s low-rank pulls, empty when it has none.
std::span<const std::uint32_t> lowrank_blocks(const ShardConnections& conn, std::uint32_t key) {
  const auto& all = conn.options().lowrank_downlink;
  return key < all.size() ? std::span<const std::uint32_t>(all[key]) : std::span<const std::uint32_t>();
}

// What a call's pulls ask for: the values (kPull, overwriting `params`), or what changed
// since this worker's last pull, added to `params` (the worker's replica): its top-k
// (kPullSparse) or a low-rank approximation (kPullLowRank) below density 1, all of it
// in binary16 (kPullHalf) for the fp16 downlink.
enum class Downlink { kDense, kSparse, kHalf };

// A step's pull at `downlink_ratio`: sparse below 1, else the fp16 downlink where the
// worker asked for it, else dense.
Downlink step_downlink(const ShardConnections& conn, double downlink_ratio) {
  if (downlink_ratio < 1.0) return Downlink::kSparse;
  return conn.options().half_downlink ? Downlink::kHalf : Downlink::kDense;
}

// The replies to one call's pulls, dense (kPull: values overwrite `params`) or deltas
// (kPullSparse: (index, value) pairs added to `params`, the worker's replica; kPullLowRank:
// a low-rank approximation's factors, decoded and added to `params`; kPullHalf: binary16
// values, decoded and added to `params`). Every
// pull reply is checked here and nowhere else. Each complete reply's push count (its seq)
// goes to `seen[key]`: what the replica's partition has seen, offered with it on a resync.
class PullReplies {
 public:
  PullReplies(const ShardConnections& conn, const std::vector<std::vector<Partition>>& owned,
              std::span<float> params, Downlink mode, std::vector<std::uint64_t>& seen)
      : conn_(conn), owned_(owned), params_(params), mode_(mode), sparse_(mode != Downlink::kDense), seen_(seen),
        next_(owned.size(), 0), current_(owned.size(), nullptr), scratch_(mode == Downlink::kSparse ? owned.size() : 0),
        half_(mode == Downlink::kHalf ? owned.size() : 0) {}

  // ReplyDest: checks the reply and says where its payload goes.
  std::span<std::byte> dest(std::size_t s, const wire::FrameHeader& h) {
    const Partition& p = check(s, h);
    current_[s] = &p;
    const auto n = static_cast<std::size_t>(p.length);
    if (!sparse_) return std::as_writable_bytes(params_.subspan(static_cast<std::size_t>(p.offset), n));
    if (mode_ == Downlink::kHalf) {
      half_[s].resize(n);
      return std::as_writable_bytes(std::span<std::uint16_t>(half_[s]));
    }
    // Sparse: indices, then values; low rank: the block header, then the factors.
    scratch_[s].resize((h.codec == wire::Codec::kLowRankF32 ? 1 : 2) * static_cast<std::size_t>(h.count));
    return std::as_writable_bytes(std::span<float>(scratch_[s]));
  }

  // ReplyDone: records the push count of a reply now complete and adds a sparse one to
  // the replica. A reply cut off by a lost connection leaves the count as it was.
  void done(std::size_t s, const wire::FrameHeader& h) {
    const Partition& p = *current_[s];
    if (!sparse_) {
      seen_[p.key] = h.seq;
      return;
    }
    const auto replica = params_.subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length));
    try {
      if (h.codec == wire::Codec::kLowRankF32) {
        add_lowrank_reply(scratch_[s], replica);
      } else if (h.codec == wire::Codec::kDenseF16) {
        const auto& half = half_[s];
        // Inf and NaN (all exponent bits set) would poison the replica for good: refused,
        // nothing added. A shard never sends them (ShardState::pull_half clamps).
        const auto bad = std::find_if(half.begin(), half.end(), [](std::uint16_t v) { return (v & 0x7C00u) == 0x7C00u; });
        if (bad != half.end()) {
          throw ProtocolError("value " + std::to_string(bad - half.begin()) + " is not finite");
        }
        for (std::size_t i = 0; i < replica.size(); ++i) replica[i] += compress::half_to_float(half[i]);
      } else {
        apply_sparse_reply(scratch_[s], h.count, replica);
      }
    } catch (const ProtocolError& e) {
      throw ProtocolError(conn_.where(s) +
                          (h.codec == wire::Codec::kLowRankF32 ? ": low-rank pull-reply of partition "
                           : h.codec == wire::Codec::kDenseF16 ? ": fp16 pull-reply of partition "
                                                               : ": sparse pull-reply of partition ") +
                          std::to_string(p.key) + ": " + e.what());
    }
    seen_[p.key] = h.seq;
  }

 private:
  // The one check of a pull reply: its type, that it answers the next of this shard's
  // partitions (a shard serves a connection in order), its codec and element count.
  const Partition& check(std::size_t s, const wire::FrameHeader& h) {
    // The context (conn_.where) is built only when a check fails: this runs per partition.
    DLTRAIN_ENFORCE_EQ(h.type, wire::MessageType::kPullReply, ProtocolError, conn_.where(s));
    const auto& parts = owned_[s];
    if (next_[s] >= parts.size()) {
      throw ProtocolError(conn_.where(s) + ": pull-reply for partition " + std::to_string(h.key) + " after all " +
                          std::to_string(parts.size()) + " of this shard's partitions were answered");
    }
    const Partition& p = parts[next_[s]++];
    DLTRAIN_ENFORCE_EQ(h.key, p.key, ProtocolError, conn_.where(s), ": pull-reply partition");
    const char* kind = mode_ == Downlink::kHalf ? ": fp16 pull-reply of partition "
                       : sparse_              ? ": sparse pull-reply of partition "
                                              : ": pull-reply of partition ";
    const auto blocks = lowrank_blocks(conn_, p.key);
    const auto codec = mode_ == Downlink::kDense  ? wire::Codec::kDenseF32
                       : mode_ == Downlink::kHalf ? wire::Codec::kDenseF16
                       : blocks.empty()           ? wire::Codec::kSparseF32
                                                  : wire::Codec::kLowRankF32;
    DLTRAIN_ENFORCE_EQ(h.codec, codec, ProtocolError, conn_.where(s), kind, p.key, ": codec");
    if (codec == wire::Codec::kLowRankF32) {
      // A header and at most the partition's floats (a matrix's factors are smaller).
      DLTRAIN_ENFORCE_LE(h.count, p.length + blocks.size(), ProtocolError, conn_.where(s), kind, p.key,
                         ": word count");
    } else if (codec == wire::Codec::kSparseF32) {
      DLTRAIN_ENFORCE_LE(h.count, p.length, ProtocolError, conn_.where(s), kind, p.key, ": element count");
    } else {
      DLTRAIN_ENFORCE_EQ(h.count, p.length, ProtocolError, conn_.where(s), kind, p.key, ": element count");
    }
    return p;
  }

  // A low-rank reply (`words`: the block header, then the factors) decoded and added to
  // `replica`; nothing is added when the header does not tile it (ProtocolError).
  void add_lowrank_reply(std::span<const float> words, std::span<float> replica) {
    std::uint32_t nb = 0;
    if (!words.empty()) std::memcpy(&nb, words.data(), 4);
    const std::uint64_t hw = 1 + 3 * static_cast<std::uint64_t>(nb);
    if (nb == 0 || hw > words.size()) {
      throw ProtocolError("a header of " + std::to_string(nb) + " blocks in " + std::to_string(words.size()) + " words");
    }
    header_.resize(hw);
    std::memcpy(header_.data(), words.data(), 4 * hw);
    decoded_.resize(replica.size());
    try {
      compress::lowrank_decode(header_, words.subspan(hw), decoded_);
    } catch (const InvalidArgument& e) {
      throw ProtocolError(e.what());
    }
    for (std::size_t i = 0; i < replica.size(); ++i) replica[i] += decoded_[i];
  }

  const ShardConnections& conn_;
  const std::vector<std::vector<Partition>>& owned_;
  std::span<float> params_;
  Downlink mode_;
  bool sparse_;  // mode_ != kDense: replies are added to params_
  std::vector<std::uint64_t>& seen_;
  std::vector<std::size_t> next_;             // per shard: index into owned_[s] of the next reply
  std::vector<const Partition*> current_;     // per shard: the partition whose sparse reply is being read
  std::vector<std::vector<float>> scratch_;   // per shard: a sparse reply's indices and values
  std::vector<std::vector<std::uint16_t>> half_;  // per shard: an fp16 reply's binary16 values
  std::vector<std::uint32_t> header_;         // a low-rank reply's block header
  std::vector<float> decoded_;                // a low-rank reply's decoding
};

// The pull request of partition `p`: dense (count 1 asks the shard to record x_seen for
// later sparse pulls), sparse with k = max(1, ⌈ratio·n⌉) (or low rank) below ratio 1, or
// fp16.
wire::FrameHeader pull_header(ShardConnections& conn, const Partition& p, double downlink_ratio, Downlink mode) {
  if (mode == Downlink::kHalf) return conn.header(wire::MessageType::kPullHalf, p.key, wire::Codec::kNone, 0, 0);
  if (mode == Downlink::kDense) {
    return conn.header(wire::MessageType::kPull, p.key, wire::Codec::kNone, conn.options().sparse_downlink ? 1u : 0u, 0);
  }
  if (const auto blocks = lowrank_blocks(conn, p.key); !blocks.empty()) {
    const auto words = static_cast<std::uint32_t>(blocks.size());
    return conn.header(wire::MessageType::kPullLowRank, p.key, wire::Codec::kLowRankF32, words, 4 * words);
  }
  const auto k = compress::k_for(static_cast<std::size_t>(p.length), downlink_ratio);
  return conn.header(wire::MessageType::kPullSparse, p.key, wire::Codec::kNone, static_cast<std::uint32_t>(k), 0);
}

// Appends partition `p`'s pull request (its header, encoded into `hdr`, and a low-rank
// pull's block header) to `req`.
void append_pull(ShardConnections& conn, const Partition& p, double downlink_ratio, Downlink mode, HeaderBytes& hdr,
                 Request& req) {
  const auto h = pull_header(conn, p, downlink_ratio, mode);
  hdr = detail::encode(h);
  req.push_back(hdr);
  if (h.type == wire::MessageType::kPullLowRank) req.push_back(std::as_bytes(lowrank_blocks(conn, p.key)));
}

// Sends `req` (no payload, key = this worker's rank) to every shard and hands each
// shard's one reply header of type `want` to `take` (done, query, leave).
void header_exchange(ShardConnections& conn, wire::MessageType req, wire::MessageType want, const char* what,
                     const std::function<void(const wire::FrameHeader&)>& take) {
  std::vector<HeaderBytes> hdrs(conn.size());
  std::vector<Request> requests(conn.size());
  for (std::size_t s = 0; s < conn.size(); ++s) {
    hdrs[s] = detail::encode(conn.header(req, conn.options().rank, wire::Codec::kNone, 0, 0));
    requests[s] = {hdrs[s]};
  }
  conn.exchange(
      requests, std::vector<int>(conn.size(), 1),
      [&](std::size_t s, const wire::FrameHeader& h) -> std::span<std::byte> {
        DLTRAIN_ENFORCE_EQ(h.type, want, ProtocolError, conn.where(s));
        take(h);
        return {};
      },
      what);
}

// header_exchange's smallest reply count (done and query).
std::uint32_t count_exchange(ShardConnections& conn, wire::MessageType req, wire::MessageType want,
                             const char* what) {
  std::uint32_t least = UINT32_MAX;
  header_exchange(conn, req, want, what, [&](const wire::FrameHeader& h) { least = std::min(least, h.count); });
  return least;
}

}  // namespace

PsClient::PsClient(std::vector<PsEndpoint> endpoints, PartitionLayout layout, PsClientOptions options) {
  if (endpoints.size() != static_cast<std::size_t>(layout.num_shards)) {
    throw ConfigError("ps_shards", "layout has " + std::to_string(layout.num_shards) + " shards but " +
                                       std::to_string(endpoints.size()) + " endpoints were given");
  }
  if (options.secret.size() < kMinJobSecretBytes) {
    throw ConfigError("secret", "the job secret must have at least " + std::to_string(kMinJobSecretBytes) +
                                    " bytes, got " + std::to_string(options.secret.size()));
  }
  if (options.half_downlink && !options.sparse_downlink) {
    throw ConfigError("compression", "the fp16 downlink (half_downlink) needs sparse_downlink: its pulls are differences "
                                     "from what the shards record this worker holds");
  }
  layout_ = std::move(layout);
  for (int s = 0; s < layout_.num_shards; ++s) owned_.push_back(layout_.for_shard(s));
  seen_pushes_.assign(layout_.partitions.size(), 0);
  conn_ = std::make_unique<ShardConnections>(std::move(endpoints), std::move(options));
}

PsClient::~PsClient() = default;

void PsClient::require_floats(std::size_t n, const char* call) const {
  if (n != static_cast<std::size_t>(layout_.total_floats)) {
    throw ConfigError("model", std::string(call) + " " + std::to_string(n) + " floats, layout has " +
                                   std::to_string(layout_.total_floats));
  }
}

void PsClient::connect() { conn_->open(); }

void PsClient::init(std::span<const float> params) {
  require_floats(params.size(), "init with");
  std::vector<HeaderBytes> hdrs(layout_.partitions.size());
  std::vector<Request> requests(conn_->size());
  for (const auto& p : layout_.partitions) {
    const auto n = static_cast<std::uint32_t>(p.length);
    auto h = conn_->header(wire::MessageType::kInit, p.key, wire::Codec::kDenseF32, n, n * 4);
    h.seq = seen_pushes_[p.key];  // 0 until a pull: initial values
    hdrs[p.key] = detail::encode(h);
    requests[p.shard].push_back(hdrs[p.key]);
    requests[p.shard].push_back(std::as_bytes(params.subspan(static_cast<std::size_t>(p.offset), n)));
  }
  conn_->exchange(requests, std::vector<int>(conn_->size(), 0), nullptr, "init");
}

void PsClient::push_pull(std::span<const float> grad, float lr, std::span<float> params) {
  require_floats(grad.size(), "push_pull with");
  std::vector<PartitionPush> pushes(layout_.partitions.size());
  for (const auto& p : layout_.partitions) {
    auto& pp = pushes[p.key];
    pp.codec = wire::Codec::kDenseF32;
    pp.count = static_cast<std::uint32_t>(p.length);
    pp.first = std::as_bytes(grad.subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length)));
  }
  push_pull(pushes, lr, 1.0, params);
}

namespace {

// Appends the push frame of partition `p` (its encoded header into `hdr`, then the
// payload's spans) to `req`. Throws ConfigError when the payload does not fit the codec.
void append_push(ShardConnections& conn, const Partition& p, const PartitionPush& pp, float lr, HeaderBytes& hdr,
                 Request& req) {
  std::uint32_t bytes = 0;
  if (!wire::expected_payload_bytes(pp.codec, pp.count, bytes) || bytes != pp.first.size() + pp.second.size()) {
    throw ConfigError("compression", "push of partition " + std::to_string(p.key) + " has " +
                                         std::to_string(pp.first.size() + pp.second.size()) +
                                         " payload bytes for codec " + std::to_string(static_cast<int>(pp.codec)) +
                                         " and count " + std::to_string(pp.count));
  }
  auto h = conn.header(wire::MessageType::kPush, p.key, pp.codec, pp.count, bytes, lr);
  if (pp.codec == wire::Codec::kSeededF32) h.seq = pp.seed;
  hdr = detail::encode(h);
  req.push_back(hdr);
  if (!pp.first.empty()) req.push_back(pp.first);
  if (!pp.second.empty()) req.push_back(pp.second);
}

}  // namespace

void PsClient::require_pushes(std::size_t n, std::size_t params) const {
  const auto total = static_cast<std::size_t>(layout_.total_floats);
  if (params != total || n != layout_.partitions.size()) {
    throw ConfigError("model", "push_pull with " + std::to_string(n) + " partitions / " + std::to_string(params) +
                                   " floats, layout has " + std::to_string(layout_.partitions.size()) + " / " +
                                   std::to_string(total));
  }
}

void PsClient::push_pull(std::span<const PartitionPush> pushes, float lr, double downlink_ratio,
                         std::span<float> params) {
  require_pushes(pushes.size(), params.size());
  // Per partition: the push header, then the pull header.
  std::vector<HeaderBytes> hdrs(layout_.partitions.size() * 2);
  std::vector<Request> requests(conn_->size());
  std::vector<int> replies(conn_->size(), 0);
  const Downlink mode = step_downlink(*conn_, downlink_ratio);
  for (std::size_t s = 0; s < owned_.size(); ++s) {
    for (const auto& p : owned_[s]) append_push(*conn_, p, pushes[p.key], lr, hdrs[2 * p.key], requests[s]);
    for (const auto& p : owned_[s]) {
      append_pull(*conn_, p, downlink_ratio, mode, hdrs[2 * p.key + 1], requests[s]);
      ++replies[s];
    }
  }
  PullReplies pulled(*conn_, owned_, params, mode, seen_pushes_);
  conn_->exchange(
      requests, replies, [&](std::size_t s, const wire::FrameHeader& h) { return pulled.dest(s, h); }, "push/pull",
      [&](std::size_t s, const wire::FrameHeader& h) { pulled.done(s, h); });
}

void PsClient::push(std::span<const PartitionPush> pushes, std::span<const std::uint32_t> keys, float lr) {
  if (pushes.size() != layout_.partitions.size()) require_pushes(pushes.size(), layout_.total_floats);
  std::vector<HeaderBytes> hdrs(keys.size());
  std::vector<Request> requests(conn_->size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] >= layout_.partitions.size()) {
      throw ConfigError("model", "push of partition " + std::to_string(keys[i]) + ": the layout has " +
                                     std::to_string(layout_.partitions.size()));
    }
    const Partition& p = layout_.partitions[keys[i]];
    append_push(*conn_, p, pushes[p.key], lr, hdrs[i], requests[static_cast<std::size_t>(p.shard)]);
  }
  conn_->exchange(requests, std::vector<int>(conn_->size(), 0), nullptr, "push");
}

void PsClient::pull(std::span<float> params, double downlink_ratio) {
  pull_as(params, downlink_ratio, false);
}

void PsClient::pull_as(std::span<float> params, double downlink_ratio, bool dense) {
  const Downlink mode = dense ? Downlink::kDense : step_downlink(*conn_, downlink_ratio);
  require_floats(params.size(), "pull into");
  std::vector<HeaderBytes> hdrs(layout_.partitions.size());
  std::vector<Request> requests(conn_->size());
  std::vector<int> replies(conn_->size(), 0);
  for (std::size_t s = 0; s < owned_.size(); ++s) {
    for (const auto& p : owned_[s]) {
      append_pull(*conn_, p, downlink_ratio, mode, hdrs[p.key], requests[s]);
      ++replies[s];
    }
  }
  PullReplies pulled(*conn_, owned_, params, mode, seen_pushes_);
  conn_->exchange(
      requests, replies, [&](std::size_t s, const wire::FrameHeader& h) { return pulled.dest(s, h); }, "pull",
      [&](std::size_t s, const wire::FrameHeader& h) { pulled.done(s, h); });
}

void PsClient::pull(std::span<float> params) { pull_as(params, 1.0, true); }

PsWork PsClient::start_push(std::span<const PartitionPush> pushes, std::span<const std::uint32_t> keys, float lr) {
  std::vector<std::uint32_t> k(keys.begin(), keys.end());
  return PsWork("push", std::async(std::launch::async, [this, pushes, k = std::move(k), lr] { push(pushes, k, lr); }));
}

PsWork PsClient::start_pull(std::span<float> params, double downlink_ratio) {
  require_floats(params.size(), "pull into");
  return PsWork("pull", std::async(std::launch::async, [this, params, downlink_ratio] { pull(params, downlink_ratio); }));
}

namespace {

// Ends a push or pull nobody waits for any more (`what`), logging the error it ended with.
void settle(const char* what, std::future<void>& done) noexcept {
  if (!done.valid()) return;
  try {
    done.get();
  } catch (const std::exception& e) {
    spdlog::error("a {} in flight failed and nothing waited for it: {}", what, e.what());
  } catch (...) {
    spdlog::error("a {} in flight failed and nothing waited for it", what);
  }
}

}  // namespace

PsWork& PsWork::operator=(PsWork&& other) noexcept {
  if (this != &other) {
    settle(what_, done_);
    what_ = other.what_;
    done_ = std::move(other.done_);
  }
  return *this;
}

PsWork::~PsWork() { settle(what_, done_); }

void PsWork::wait() {
  if (!done_.valid()) return;
  auto done = std::move(done_);  // inactive from here, whatever the call ended with
  done.get();
}

void PsWork::wait(std::chrono::milliseconds timeout) {
  if (!done_.valid()) return;
  if (done_.wait_for(timeout) != std::future_status::ready) {
    throw TimeoutError(std::string(what_) + " still in flight after " + std::to_string(timeout.count()) + " ms");
  }
  wait();
}

std::uint32_t PsClient::done() {
  return count_exchange(*conn_, wire::MessageType::kDone, wire::MessageType::kDoneAck, "done");
}

std::uint32_t PsClient::workers_done() {
  return count_exchange(*conn_, wire::MessageType::kQuery, wire::MessageType::kQueryReply, "query");
}

std::uint32_t PsClient::members_training() {
  std::uint64_t most = 0;  // the query reply's seq (its count is the finished workers)
  header_exchange(*conn_, wire::MessageType::kQuery, wire::MessageType::kQueryReply, "query",
                  [&](const wire::FrameHeader& h) { most = std::max(most, h.seq); });
  return static_cast<std::uint32_t>(most);
}

std::uint32_t PsClient::leave() {
  std::uint32_t members = 0;
  header_exchange(*conn_, wire::MessageType::kLeave, wire::MessageType::kLeaveAck, "leave",
                  [&](const wire::FrameHeader& h) { members = std::max(members, h.count); });
  return members;
}

ChunkClient::ChunkClient(PsEndpoint shard0, PsClientOptions options) {
  options.hello = false;
  conn_ = std::make_unique<detail::ShardConnections>(std::vector<PsEndpoint>{std::move(shard0)}, std::move(options));
}

ChunkClient::~ChunkClient() = default;

std::vector<std::pair<std::uint32_t, std::uint32_t>> ChunkClient::claim(std::uint32_t epoch, std::uint32_t want,
                                                                        std::uint32_t acked,
                                                                        std::uint32_t chunks_per_epoch, bool release) {
  std::uint32_t body[4] = {acked, (fresh_ ? 1u : 0u) | (release ? 2u : 0u), chunks_per_epoch, want};
  std::vector<std::uint32_t> got;
  auto once = [&] {
    if (!open_) {
      conn_->open();
      open_ = true;
    }
    auto h = conn_->header(wire::MessageType::kClaim, conn_->options().rank, wire::Codec::kBytes, 16, 16);
    h.seq = epoch;
    const HeaderBytes hdr = detail::encode(h);
    conn_->exchange(
        {Request{hdr, std::as_bytes(std::span(body))}}, {1},
        [&](std::size_t s, const wire::FrameHeader& r) -> std::span<std::byte> {
          DLTRAIN_ENFORCE_EQ(r.type, wire::MessageType::kClaimReply, ProtocolError, conn_->where(s));
          if (r.codec != wire::Codec::kBytes || r.count % 8 != 0 || r.count / 8 > want) {
            throw ProtocolError(conn_->where(s) + ": a claim reply of " + std::to_string(r.count) + " bytes for " +
                                std::to_string(want) + " chunks");
          }
          got.resize(r.count / 4);
          return std::as_writable_bytes(std::span(got));
        },
        "claim");
  };
  reconnected_ = false;
  try {
    once();
  } catch (const PsConnectionLost&) {
    // The shard restarted (its dispatch may know nothing of this worker) or the reply was
    // lost: once more on a new connection, as a new process — what this worker held goes
    // back (it may be trained again: at least once) and nothing is acknowledged.
    open_ = false;
    conn_->close();
    body[0] = 0;
    body[1] |= 1u;
    reconnected_ = true;
    once();
  }
  fresh_ = false;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> out;
  for (std::size_t i = 0; i + 1 < got.size(); i += 2) out.emplace_back(got[i], got[i + 1]);
  return out;
}

void PsClient::resync(std::span<float> params) {
  require_floats(params.size(), "resync into");
  conn_->reconnect([&] {
    init(params);
    pull(params);
  });
}

std::uint64_t PsClient::seen_pushes(std::uint32_t key) const {
  if (key >= seen_pushes_.size()) {
    throw ConfigError("model", "partition " + std::to_string(key) + " out of range: the layout has " +
                                   std::to_string(seen_pushes_.size()));
  }
  return seen_pushes_[key];
}

std::uint64_t PsClient::bytes_pushed() const { return conn_->bytes_pushed(); }
std::uint64_t PsClient::bytes_pulled() const { return conn_->bytes_pulled(); }

}  // namespace dltrain::ps
