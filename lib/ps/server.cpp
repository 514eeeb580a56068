#include "ps/server.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/secret.h"
#include "ps/dispatch.h"
#include "ps/payload.h"
#include "wire/auth.h"

namespace dltrain::ps {

namespace asio = boost::asio;
using asio::ip::tcp;

struct detail::ShardServer {
  PsServerOptions opt;
  std::shared_ptr<ShardState> state;
  // Before io: the sessions that io destroys count themselves out of it.
  std::atomic<std::int64_t> connections{0};  // sessions alive
  // Before io, for the same reason; stop() destroys its waiting pulls (and the sessions
  // they hold) while it is alive.
  std::unique_ptr<StepBarrier> barrier;
  ChunkDispatch dispatch;  // an elastic job's data dispatch (workers claim from shard 0's)
  asio::io_context io;
  asio::steady_timer expiry{io};  // ssp/sync: drops the workers a pull waited too long for
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> bytes_in{0}, bytes_out{0}, rejected{0}, refused_handshakes{0}, pulls{0};
  std::atomic<std::uint64_t> apply_ns{0};   // wall time applying pushes, nanoseconds
  std::uint16_t port = 0;
  bool started = false;

  void accept();
  void arm_expiry();
};

namespace {

// One connection. Its socket and timer share a strand (the acceptor hands each socket
// its own), so the handshake timer and the socket's handlers never run concurrently.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, detail::ShardServer& srv) : sock_(std::move(sock)), timer_(sock_.get_executor()), srv_(srv) {
    boost::system::error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);
    ++srv_.connections;
  }
  ~Session() {
    if (hello_) srv_.barrier->leave(rank_, token_);
    --srv_.connections;
  }

  void start() { send_challenge(); }

 private:
  // ---- handshake (wire/auth.h): nothing is read as a frame until it succeeds.
  void send_challenge() {
    try {
      nonce_ = wire::random_nonce();
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    wire::encode_challenge(nonce_, challenge_);
    timer_.expires_after(srv_.opt.handshake_timeout);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->authenticated_) return;
      self->refuse("no answer to the authentication challenge within " +
                   std::to_string(self->srv_.opt.handshake_timeout.count()) + " ms");
    });
    asio::async_write(sock_, asio::buffer(challenge_), [self = shared_from_this()](auto ec, std::size_t n) {
      self->srv_.bytes_out += n;
      if (self->closed_) return;
      if (ec) return self->refuse("sending the authentication challenge failed: " + ec.message());
      self->read_answer();
    });
  }

  void read_answer() {
    // Exactly one answer's bytes: whatever the peer sent after it stays unread.
    asio::async_read(sock_, asio::buffer(answer_), [self = shared_from_this()](auto ec, std::size_t n) {
      self->srv_.bytes_in += n;
      if (self->closed_) return;  // timed out: already refused
      if (ec) {
        return self->refuse(ec == asio::error::eof
                                ? "closed the connection after " + std::to_string(n) +
                                      " bytes, without a complete answer to the authentication challenge"
                                : "reading the authentication answer failed: " + ec.message());
      }
      self->check_answer();
    });
  }

  void check_answer() {
    const auto& opt = srv_.opt;
    wire::AuthAnswer a;
    try {
      a = wire::decode_answer(answer_);
    } catch (const ProtocolError& e) {
      return refuse(e.what());
    }
    // The MAC is checked for what the peer claims, so that the log can tell a stale task
    // that knows the secret from a peer that does not; only the shard's own job and
    // generation are accepted.
    bool mac_ok = false;
    try {
      mac_ok = wire::macs_equal(wire::auth_mac(opt.secret, nonce_, a.job, a.generation, wire::kWorkerContext), a.mac);
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    const std::string claim = "job " + std::to_string(a.job) + ", generation " + std::to_string(a.generation);
    if (!mac_ok) {
      return refuse("wrong HMAC in the authentication answer (claims " + claim +
                    "): the peer does not know this job's secret");
    }
    if (a.job != opt.job) {
      return refuse("authenticated for job " + std::to_string(a.job) + ", this shard serves job " +
                    std::to_string(opt.job));
    }
    if (a.generation != opt.generation) {
      return refuse("a task of generation " + std::to_string(a.generation) +
                    " of this job; this shard serves generation " + std::to_string(opt.generation) +
                    " (a stale task)");
    }
    authenticated_ = true;
    timer_.cancel();
    try {
      wire::encode_proof(wire::auth_mac(opt.secret, a.nonce, opt.job, opt.generation, wire::kShardContext), proof_);
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    asio::async_write(sock_, asio::buffer(proof_), [self = shared_from_this()](auto ec, std::size_t n) {
      self->srv_.bytes_out += n;
      if (ec) {
        spdlog::debug("ps: connection {} closed during the handshake: {}", self->peer_, ec.message());
        return;
      }
      self->read_header();
    });
  }

  // Closes a connection that failed the handshake: no reply (an unauthenticated peer
  // learns nothing), nothing more read.
  void refuse(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    ++srv_.rejected;
    ++srv_.refused_handshakes;
    spdlog::warn("ps: refused connection from {}: {}", peer_, reason);
    timer_.cancel();
    boost::system::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
  }

  // ---- frames
  void read_header() {
    asio::async_read(sock_, asio::buffer(hdr_), [self = shared_from_this()](auto ec, std::size_t n) {
      self->srv_.bytes_in += n;
      if (ec) {
        if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
          spdlog::debug("ps: connection {} closed: {}", self->peer_, ec.message());
        }
        return;
      }
      self->on_header();
    });
  }

  void on_header() {
    try {
      h_ = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(hdr_), srv_.opt.limits);
      if (h_.job != srv_.opt.job) {
        throw ProtocolError("frame job: expected " + std::to_string(srv_.opt.job) + ", got " +
                            std::to_string(h_.job));
      }
      if (h_.generation != srv_.opt.generation) {
        throw ProtocolError("frame generation: expected " + std::to_string(srv_.opt.generation) +
                            ", got " + std::to_string(h_.generation) + " (a stale task?)");
      }
    } catch (const ProtocolError& e) {
      return reject(e.what());
    }
    if (h_.payload_bytes == 0) return handle();
    // Sized only after decode_header checked payload_bytes against the limits.
    payload_.resize((h_.payload_bytes + 3) / 4);
    asio::async_read(sock_, asio::buffer(payload_.data(), h_.payload_bytes),
                     [self = shared_from_this()](auto ec, std::size_t n) {
                       self->srv_.bytes_in += n;
                       if (ec) {
                         spdlog::warn("ps: connection {} closed in a payload: {}", self->peer_,
                                      ec.message());
                         return;
                       }
                       self->handle();
                     });
  }

  void expect_codec(wire::Codec c) const {
    if (h_.codec != c) {
      throw ProtocolError(wire::to_string(h_.type) + " frame codec: expected " +
                          std::to_string(static_cast<int>(c)) + ", got " +
                          std::to_string(static_cast<int>(h_.codec)));
    }
  }

  void handle() {
    using wire::MessageType;
    auto& st = *srv_.state;
    try {
      switch (h_.type) {
        case MessageType::kHello: {
          const auto hello = decode_hello(h_, payload());
          if (hello_) throw ProtocolError("a second hello on one connection");
          token_ = srv_.barrier->join(hello.rank, hello.workers);
          rank_ = hello.rank;
          hello_ = true;
          spdlog::info("ps: worker {} of {} connected from {}", hello.rank, hello.workers, peer_);
          return reply(MessageType::kHelloAck, static_cast<std::uint32_t>(st.num_partitions()));
        }
        case MessageType::kInit:
          expect_hello();
          expect_codec(wire::Codec::kDenseF32);
          if (h_.count == 0) throw ProtocolError("init frame count: expected >= 1, got 0");
          // seq: the pushes the offered values have seen (a resyncing worker's replica).
          if (st.init(h_.key, {payload_.data(), h_.count}, h_.seq) == InitOutcome::kRebuilt) {
            spdlog::info("ps: partition {} rebuilt from worker {}'s replica, which had seen {} pushes to it", h_.key,
                         rank_, h_.seq);
          }
          return read_header();
        case MessageType::kPush: {
          expect_hello();
          const auto t0 = std::chrono::steady_clock::now();
          apply_push(st);
          srv_.apply_ns += static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
          return read_header();
        }
        case MessageType::kPull:
        case MessageType::kPullSparse:
        case MessageType::kPullHalf:
        case MessageType::kPullLowRank: {
          expect_hello();
          if (h_.type == MessageType::kPullLowRank) {
            // The partition's tiling; checked against the partition where it is answered.
            expect_codec(wire::Codec::kLowRankF32);
            pull_blocks_.resize(h_.count);
            if (h_.count != 0) std::memcpy(pull_blocks_.data(), payload_.data(), 4 * static_cast<std::size_t>(h_.count));
          } else {
            expect_codec(wire::Codec::kNone);
            if (h_.type == MessageType::kPullHalf && h_.count != 0) {
              throw ProtocolError("pull-fp16 frame count: expected 0, got " + std::to_string(h_.count));
            }
          }
          if (st.length(h_.key) < 0) {
            throw ProtocolError("pull of partition " + std::to_string(h_.key) + ", which this shard does not hold");
          }
          // ssp/sync: answered once the barrier allows; until then this connection reads
          // nothing more (the worker waits for the reply, it does not poll).
          const bool now = srv_.barrier->pull(rank_, h_.key, [self = shared_from_this()] {
            asio::post(self->sock_.get_executor(), [self] { self->answer_pull(); });
          });
          if (now) answer_pull();
          return;
        }
        case MessageType::kDone: {
          expect_hello();
          expect_codec(wire::Codec::kNone);
          const auto done = static_cast<std::uint32_t>(st.mark_done(h_.key));
          srv_.barrier->done(h_.key);
          if (srv_.opt.on_done) {
            try {
              srv_.opt.on_done();
            } catch (const std::exception& e) {
              spdlog::warn("ps: recording that worker {} finished: {}", h_.key, e.what());
            }
          }
          return reply(MessageType::kDoneAck, done);
        }
        case MessageType::kQuery:
          expect_codec(wire::Codec::kNone);
          return reply(MessageType::kQueryReply, static_cast<std::uint32_t>(st.done_count()),
                       srv_.barrier->members_training());
        case MessageType::kLeave: {
          expect_hello();
          expect_codec(wire::Codec::kNone);
          const auto members = srv_.barrier->leave_job(rank_);
          spdlog::info("ps: worker {} left the job ({} members still training)", rank_, members);
          return reply(MessageType::kLeaveAck, members);
        }
        case MessageType::kClaim:
          return answer_claim();
        default:
          throw ProtocolError("unexpected " + wire::to_string(h_.type) + " frame from a worker");
      }
    } catch (const ProtocolError& e) {
      reject(e.what());
    }
  }

  // Answers the pull in h_ (the barrier allows it now): dense, or what changed since this
  // worker's last pull (its top-k, all of it in binary16, or a low-rank approximation).
  // Errors close the connection.
  void answer_pull() {
    using wire::MessageType;
    auto& st = *srv_.state;
    try {
      wire::FrameHeader r = reply_header(MessageType::kPullReply);
      if (h_.type == MessageType::kPull) {
        const auto len = st.length(h_.key);
        out_.resize(static_cast<std::size_t>(len));
        // count = 1: the worker uses sparse pulls; remember what it now holds.
        r.seq = st.pull(h_.key, out_, h_.count == 1 ? static_cast<int>(rank_) : -1);  // the pushes they reflect
        r.codec = wire::Codec::kDenseF32;
        r.count = static_cast<std::uint32_t>(len);
        r.payload_bytes = r.count * 4;
      } else if (h_.type == MessageType::kPullHalf) {
        r.seq = st.pull_half(h_.key, static_cast<int>(rank_), half_);
        // Two binary16 values a word (out_ is the reply's float buffer).
        out_.resize((half_.size() + 1) / 2);
        std::memcpy(out_.data(), half_.data(), 2 * half_.size());
        r.codec = wire::Codec::kDenseF16;
        r.count = static_cast<std::uint32_t>(half_.size());
        r.payload_bytes = r.count * 2;
      } else if (h_.type == MessageType::kPullLowRank) {
        r.seq = st.pull_lowrank(h_.key, static_cast<int>(rank_), pull_blocks_, idx_, vals_);
        const std::size_t words = idx_.size() + vals_.size();
        out_.resize(words);
        std::memcpy(out_.data(), idx_.data(), 4 * idx_.size());
        std::memcpy(out_.data() + idx_.size(), vals_.data(), 4 * vals_.size());
        r.codec = wire::Codec::kLowRankF32;
        r.count = static_cast<std::uint32_t>(words);
        r.payload_bytes = r.count * 4;
      } else {
        r.seq = st.pull_diff(h_.key, static_cast<int>(rank_), h_.count, idx_, vals_);
        const std::size_t k = idx_.size();
        out_.resize(2 * k);
        std::memcpy(out_.data(), idx_.data(), 4 * k);
        std::memcpy(out_.data() + k, vals_.data(), 4 * k);
        r.codec = wire::Codec::kSparseF32;
        r.count = static_cast<std::uint32_t>(k);
        r.payload_bytes = r.count * 8;
      }
      ++srv_.pulls;
      write(r, true);
    } catch (const ProtocolError& e) {
      reject(e.what());
    }
  }

  void expect_hello() const {
    if (!hello_) throw ProtocolError(wire::to_string(h_.type) + " frame before hello");
  }

  wire::FrameHeader reply_header(wire::MessageType type) const {
    wire::FrameHeader r;
    r.type = type;
    r.job = srv_.opt.job;
    r.generation = srv_.opt.generation;
    r.seq = h_.seq;
    r.key = h_.key;
    return r;
  }

  // Decodes a push payload in any of the push codecs (ps/payload.h) and applies it.
  void apply_push(ShardState& st) {
    const auto len = st.length(h_.key);
    if (len < 0) {
      throw ProtocolError("push to partition " + std::to_string(h_.key) + ", which this shard does not hold");
    }
    const PushView push = decode_push(h_, payload(), static_cast<std::size_t>(len), scratch_);
    srv_.barrier->push(rank_, h_.key, push.indices, push.values, push.sparse, h_.scale);
  }

  // The payload of the current frame, as the words it was read into.
  std::span<const float> payload() const {
    return std::span<const float>(payload_).first(h_.payload_bytes == 0 ? 0 : (h_.payload_bytes + 3) / 4);
  }

  // A claim of an elastic job's training chunks (ps/dispatch.h): the reply lists them as
  // u32 pairs (epoch, chunk).
  void answer_claim() {
    if (!srv_.opt.sync.elastic) throw ProtocolError("claim: the job is not elastic");
    expect_codec(wire::Codec::kBytes);
    if (h_.count != 16) throw ProtocolError("claim frame count: expected 16, got " + std::to_string(h_.count));
    if (h_.seq > UINT32_MAX) throw ProtocolError("claim: epoch " + std::to_string(h_.seq) + " out of range");
    std::uint32_t v[4];  // acked, flags, chunks per epoch, wanted
    std::memcpy(v, payload_.data(), sizeof v);
    // The chunks of members gone without leaving (a worker lost with its machine) go back
    // before anything is handed out.
    const auto returned = srv_.dispatch.stats().returned;
    const auto chunks = srv_.dispatch.claim(h_.key, static_cast<std::uint32_t>(h_.seq), v[3], v[0], v[1], v[2],
                                            [this] { return srv_.barrier->gone(); });
    if (const auto back = srv_.dispatch.stats().returned - returned; back > 0) {
      spdlog::warn("ps: {} unfinished chunks went back to the dispatch (a member gone, or a new process of worker {})",
                   back, h_.key);
    }
    wire::FrameHeader r = reply_header(wire::MessageType::kClaimReply);
    out_.resize(2 * chunks.size());
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      std::memcpy(&out_[2 * i], &chunks[i].epoch, 4);
      std::memcpy(&out_[2 * i + 1], &chunks[i].index, 4);
    }
    r.codec = wire::Codec::kBytes;
    r.count = static_cast<std::uint32_t>(8 * chunks.size());
    r.payload_bytes = r.count;
    write(r, true);
  }

  void reply(wire::MessageType type, std::uint32_t count, std::uint64_t seq) {
    wire::FrameHeader r = reply_header(type);
    r.seq = seq;
    r.codec = wire::Codec::kNone;
    r.count = count;
    r.payload_bytes = 0;
    write(r, false);
  }

  void reply(wire::MessageType type, std::uint32_t count) {
    wire::FrameHeader r = reply_header(type);
    r.codec = wire::Codec::kNone;
    r.count = count;
    r.payload_bytes = 0;
    write(r, false);
  }

  void write(const wire::FrameHeader& r, bool with_payload) {
    wire::encode_header(r, std::span<std::byte, wire::kHeaderSize>(out_hdr_));
    std::vector<asio::const_buffer> bufs{asio::buffer(out_hdr_)};
    if (with_payload) bufs.push_back(asio::buffer(out_.data(), r.payload_bytes));
    asio::async_write(sock_, bufs, [self = shared_from_this()](auto ec, std::size_t n) {
      self->srv_.bytes_out += n;
      if (ec) {
        spdlog::warn("ps: write to {} failed: {}", self->peer_, ec.message());
        return;
      }
      self->read_header();
    });
  }

  void reject(const std::string& reason) {
    ++srv_.rejected;
    spdlog::warn("ps: closing connection {}: {}", peer_, reason);
    wire::FrameHeader r;
    r.type = wire::MessageType::kError;
    r.job = srv_.opt.job;
    r.generation = srv_.opt.generation;
    r.codec = wire::Codec::kBytes;
    err_ = reason.substr(0, 4096);
    r.count = static_cast<std::uint32_t>(err_.size());
    r.payload_bytes = r.count;
    wire::encode_header(r, std::span<std::byte, wire::kHeaderSize>(out_hdr_));
    std::vector<asio::const_buffer> bufs{asio::buffer(out_hdr_), asio::buffer(err_)};
    asio::async_write(sock_, bufs, [self = shared_from_this()](auto, std::size_t) {
      boost::system::error_code ignored;
      self->sock_.shutdown(tcp::socket::shutdown_both, ignored);
      self->sock_.close(ignored);
    });
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  detail::ShardServer& srv_;
  std::string peer_;
  wire::Nonce nonce_{};
  std::array<std::uint8_t, wire::kChallengeSize> challenge_{};
  std::array<std::uint8_t, wire::kAnswerSize> answer_{};
  std::array<std::uint8_t, wire::kProofSize> proof_{};
  bool authenticated_ = false;
  bool closed_ = false;
  std::array<std::byte, wire::kHeaderSize> hdr_{};
  std::array<std::byte, wire::kHeaderSize> out_hdr_{};
  wire::FrameHeader h_;
  std::vector<float> payload_;
  std::vector<float> out_;
  std::string err_;
  std::vector<std::uint32_t> idx_;
  std::vector<float> vals_;
  std::vector<std::uint32_t> pull_blocks_;  // a low-rank pull's block header
  std::vector<std::uint16_t> half_;         // an fp16 pull's values
  PayloadScratch scratch_;
  std::uint32_t rank_ = 0;
  std::uint64_t token_ = 0;  // the barrier's for this connection (StepBarrier::join)
  bool hello_ = false;
};

}  // namespace

void detail::ShardServer::accept() {
  // Each connection gets its own strand: its handlers run one at a time on any of the
  // I/O threads.
  acceptor.async_accept(asio::make_strand(io), [this](boost::system::error_code ec, tcp::socket sock) {
    if (ec) {
      if (ec != asio::error::operation_aborted) spdlog::warn("ps: accept failed: {}", ec.message());
      if (!acceptor.is_open()) return;
    } else {
      std::make_shared<Session>(std::move(sock), *this)->start();
    }
    accept();
  });
}

void detail::ShardServer::arm_expiry() {
  // A tenth of the barrier timeout, at most 100 ms: a wait ends within 10 % of it.
  const auto period = std::clamp<std::chrono::milliseconds>(opt.sync.barrier_timeout / 10,
                                                            std::chrono::milliseconds(1),
                                                            std::chrono::milliseconds(100));
  expiry.expires_after(period);
  expiry.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    for (const auto r : barrier->expire(std::chrono::steady_clock::now())) {
      spdlog::warn("ps: worker {} dropped from the {} barrier: a pull waited {} ms for it; it rejoins at the "
                   "current step with its next push",
                   r, enum_name(opt.sync.mode), opt.sync.barrier_timeout.count());
    }
    arm_expiry();
  });
}

PsServer::PsServer(PsServerOptions options, std::shared_ptr<ShardState> state)
    : impl_(std::make_unique<detail::ShardServer>()) {
  impl_->opt = std::move(options);
  impl_->state = std::move(state);
  impl_->barrier = std::make_unique<StepBarrier>(impl_->opt.sync, *impl_->state);
}

PsServer::~PsServer() { stop(); }

void PsServer::start() {
  auto& im = *impl_;
  if (im.opt.secret.size() < kMinJobSecretBytes) {
    throw ConfigError("secret", "the job secret must have at least " + std::to_string(kMinJobSecretBytes) +
                                    " bytes, got " + std::to_string(im.opt.secret.size()));
  }
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(im.opt.bind_address, ec);
  if (ec) throw ConfigError("bind_address", "not an IP address: \"" + im.opt.bind_address + "\"");
  tcp::endpoint ep(addr, im.opt.port);
  im.acceptor.open(ep.protocol(), ec);
  if (!ec) im.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(ep, ec);
  if (!ec) im.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw IoError("PS shard cannot listen on " + im.opt.bind_address + ":" +
                  std::to_string(im.opt.port) + ": " + ec.message());
  }
  im.port = im.acceptor.local_endpoint().port();
  im.accept();
  if (im.opt.sync.mode != SyncMode::kAsync) im.arm_expiry();
  im.started = true;
  const int n = std::max(1, im.opt.threads);
  for (int i = 0; i < n; ++i) im.threads.emplace_back([&im] { im.io.run(); });
}

void PsServer::stop() {
  if (!impl_ || !impl_->started) return;
  impl_->started = false;
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
  });
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // Pulls still waiting hold their sessions: destroy them while the barrier is alive.
  auto waiting = impl_->barrier->take_waiters();
  waiting.clear();
}

std::uint16_t PsServer::port() const { return impl_->port; }
std::uint64_t PsServer::bytes_in() const { return impl_->bytes_in; }
std::uint64_t PsServer::bytes_out() const { return impl_->bytes_out; }
std::uint64_t PsServer::rejected_connections() const { return impl_->rejected; }
std::uint64_t PsServer::refused_handshakes() const { return impl_->refused_handshakes; }
std::uint64_t PsServer::pulls() const { return impl_->pulls; }
double PsServer::apply_seconds() const { return static_cast<double>(impl_->apply_ns.load()) * 1e-9; }
std::int64_t PsServer::connections() const { return impl_->connections; }
SyncStats PsServer::sync_stats() const { return impl_->barrier->stats(); }

DispatchStats PsServer::dispatch_stats() const { return impl_->dispatch.stats(); }

}  // namespace dltrain::ps
