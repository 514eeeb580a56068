#include "ps/client.h"

#include <cstring>
#include <functional>
#include <thread>

#include <boost/asio.hpp>

#include "common/errors.h"
#include "common/secret.h"
#include "compress/topk.h"
#include "wire/auth.h"

namespace dltrain::ps {

namespace asio = boost::asio;
using asio::ip::tcp;
using Header = std::array<std::byte, wire::kHeaderSize>;

struct PsClient::Impl {
  std::vector<PsEndpoint> endpoints;
  PartitionLayout layout;
  PsClientOptions opt;
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> socks;
  std::vector<std::vector<Partition>> owned;  // per shard
  std::uint64_t pushed = 0, pulled = 0, seq = 0;
  bool broken = false;

  wire::FrameHeader header(wire::MessageType t, std::uint32_t key, wire::Codec c,
                           std::uint32_t count, std::uint32_t bytes, float scale = 1.0f) {
    wire::FrameHeader h;
    h.type = t;
    h.job = opt.job;
    h.generation = opt.generation;
    h.seq = ++seq;
    h.key = key;
    h.codec = c;
    h.count = count;
    h.payload_bytes = bytes;
    h.scale = scale;
    return h;
  }

  // Runs the io_context until `pending` reaches zero, or until the shards have been
  // silent (no read or write completed) for the timeout. Handlers that are ready run
  // before the clock is looked at: a worker that was suspended (SIGSTOP, a paused VM, a
  // swapped-out process) wakes past its deadline with the replies waiting in its socket,
  // and that is not a PS that stopped answering.
  void run(const int& pending, const char* what) {
    using Clock = std::chrono::steady_clock;
    io.restart();
    auto deadline = Clock::now() + opt.timeout;
    while (pending > 0) {
      check_stop();
      std::size_t ran = io.poll();
      if (ran == 0 && pending > 0) {
        if (Clock::now() >= deadline) break;
        ran = io.run_one_until(std::min(deadline, Clock::now() + kStopCheck));
        if (ran == 0) continue;  // a slice passed: look at the stop flag and the clock again
      }
      if (ran > 0) deadline = Clock::now() + opt.timeout;
    }
    if (pending > 0) {
      close();
      throw TimeoutError(std::string("PS ") + what + ": no reply for " + std::to_string(opt.timeout.count()) +
                         " ms");
    }
  }

  static constexpr std::chrono::milliseconds kStopCheck{100};

  // Throws StopRequested (closing every connection) once the owner asked to stop.
  void check_stop() {
    if (opt.stop_requested != nullptr && opt.stop_requested->load(std::memory_order_relaxed)) {
      close();
      throw StopRequested("the worker was asked to stop while talking to the PS shards");
    }
  }

  // Sleeps `d` in slices, looking at the stop flag between them.
  void sleep_checking(std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    for (auto now = std::chrono::steady_clock::now(); now < until; now = std::chrono::steady_clock::now()) {
      check_stop();
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, kStopCheck));
    }
    check_stop();
  }

  // One connection attempt to shard `s`, bounded by `deadline`: a host that drops SYNs
  // would otherwise hold a blocking connect for the kernel's retry time (minutes).
  boost::system::error_code connect_once(tcp::socket& sock, const tcp::resolver::results_type& results,
                                         std::chrono::steady_clock::time_point deadline) {
    boost::system::error_code result = asio::error::would_block;
    io.restart();
    asio::async_connect(sock, results, [&](const boost::system::error_code& ec, const tcp::endpoint&) { result = ec; });
    while (result == asio::error::would_block) {
      if (opt.stop_requested != nullptr && opt.stop_requested->load(std::memory_order_relaxed)) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      io.run_one_until(std::min(deadline, now + kStopCheck));
    }
    if (result == asio::error::would_block) {
      boost::system::error_code ig;
      sock.close(ig);
      io.restart();
      io.poll();  // the cancelled handler runs and sets `result`
      check_stop();
      result = asio::error::timed_out;
    }
    return result;
  }

  void close() {
    broken = true;
    for (auto& s : socks) {
      boost::system::error_code ig;
      if (s) s->close(ig);
    }
    io.restart();
    io.poll();  // drain cancelled handlers
  }

  std::string where(std::size_t shard) const {
    return "PS shard " + std::to_string(shard) + " (" + endpoints[shard].host + ":" +
           std::to_string(endpoints[shard].port) + ")";
  }

  // The handshake of wire/auth.h with every shard at once, bounded by the timeout: read
  // the shard's challenge, answer it, and check the shard's proof.
  void authenticate() {
    struct Handshake {
      std::array<std::uint8_t, wire::kChallengeSize> challenge{};
      std::array<std::uint8_t, wire::kAnswerSize> answer{};
      std::array<std::uint8_t, wire::kProofSize> proof{};
      wire::Nonce mine{};
    };
    std::vector<Handshake> hs(socks.size());
    int pending = 0;
    std::exception_ptr failure;
    auto fail = [&](std::exception_ptr e) {
      if (!failure) failure = e;
      pending = 0;
    };
    const std::string who = "job " + std::to_string(opt.job) + " generation " + std::to_string(opt.generation);
    for (std::size_t s = 0; s < socks.size(); ++s) {
      ++pending;
      Handshake* h = &hs[s];
      asio::async_read(*socks[s], asio::buffer(h->challenge), [&, s, h](auto ec, std::size_t n) {
        pulled += n;
        if (ec) {
          return fail(std::make_exception_ptr(
              IoError(where(s) + ": no authentication challenge from the shard: " + ec.message())));
        }
        try {
          const wire::Nonce theirs = wire::decode_challenge(h->challenge);
          wire::AuthAnswer a;
          a.job = opt.job;
          a.generation = opt.generation;
          a.nonce = h->mine = wire::random_nonce();
          a.mac = wire::auth_mac(opt.secret, theirs, opt.job, opt.generation, wire::kWorkerContext);
          wire::encode_answer(a, h->answer);
        } catch (...) {
          return fail(std::current_exception());
        }
        asio::async_write(*socks[s], asio::buffer(h->answer), [&, s, h](auto ec2, std::size_t m) {
          pushed += m;
          if (ec2) {
            return fail(std::make_exception_ptr(
                IoError(where(s) + ": sending the authentication answer failed: " + ec2.message())));
          }
          asio::async_read(*socks[s], asio::buffer(h->proof), [&, s, h](auto ec3, std::size_t k) {
            pulled += k;
            if (ec3) {
              return fail(std::make_exception_ptr(IoError(
                  where(s) + " refused this worker (" + who + ") in the authentication handshake (" + ec3.message() +
                  "): a wrong job secret, or a task of another job or an older generation; the shard's log says "
                  "which")));
            }
            try {
              const wire::Mac mac = wire::decode_proof(h->proof);
              if (!wire::macs_equal(mac, wire::auth_mac(opt.secret, h->mine, opt.job, opt.generation,
                                                        wire::kShardContext))) {
                throw IoError(where(s) + " failed to prove that it knows the job secret: it is not a PS shard of " +
                              who);
              }
            } catch (...) {
              return fail(std::current_exception());
            }
            --pending;
          });
        });
      });
    }
    run(pending, "authentication handshake");
    if (failure) {
      close();
      std::rethrow_exception(failure);
    }
  }

  std::exception_ptr lost(std::size_t s, const boost::system::error_code& ec) const {
    return std::make_exception_ptr(PsConnectionLost(s, where(s) + ": connection lost: " + ec.message()));
  }

  // Closes every connection and forgets them, so that open() can start afresh.
  void reset() {
    close();
    socks.clear();
    broken = false;
  }

  // Connects to every shard (retrying refused connections until `deadline`), runs the
  // authentication handshake and says hello.
  // `bound` (the time from the first attempt to `deadline`) is for the error message.
  void open(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds bound);

  // Reads one reply frame on `shard` and hands it to `on_frame`, which may request the
  // payload be read into `dst` (returns the destination span or empty to skip).
  struct ReadOp {
    Header hdr{};
    std::vector<char> err;
  };

  // Sends `bufs` to every shard that has them, then reads `replies[s]` frames from each
  // shard, calling check(shard, header) to get where the payload goes.
  void exchange(std::vector<std::vector<asio::const_buffer>>& bufs,
                const std::vector<int>& replies,
                const std::function<std::span<std::byte>(std::size_t, const wire::FrameHeader&)>& dest,
                const char* what,
                const std::function<void(std::size_t, const wire::FrameHeader&)>& after = nullptr) {
    if (broken) throw IoError("PS client is closed after an earlier error");
    int pending = 0;
    std::exception_ptr failure;
    auto fail = [&](std::exception_ptr e) {
      if (!failure) failure = e;
      pending = 0;
    };
    std::vector<std::unique_ptr<ReadOp>> ops(socks.size());
    std::function<void(std::size_t, int)> read_next;
    read_next = [&](std::size_t s, int left) {
      if (left == 0) {
        --pending;
        return;
      }
      auto* op = ops[s].get();
      asio::async_read(*socks[s], asio::buffer(op->hdr), [&, s, left, op](auto ec, std::size_t n) {
        pulled += n;
        if (ec) return fail(lost(s, ec));
        wire::FrameHeader h;
        try {
          h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(op->hdr), opt.limits);
        } catch (...) {
          return fail(std::current_exception());
        }
        if (h.type == wire::MessageType::kError) {
          op->err.resize(h.payload_bytes);
          asio::async_read(*socks[s], asio::buffer(op->err), [&, s, op](auto, std::size_t m) {
            pulled += m;
            fail(std::make_exception_ptr(IoError(where(s) + " refused the request: " +
                                                 std::string(op->err.begin(), op->err.end()))));
          });
          return;
        }
        std::span<std::byte> d;
        try {
          d = dest(s, h);
        } catch (...) {
          return fail(std::current_exception());
        }
        if (h.payload_bytes == 0) return read_next(s, left - 1);
        if (d.size() != h.payload_bytes) {
          return fail(std::make_exception_ptr(ProtocolError(where(s) + ": reply of " + std::to_string(h.payload_bytes) +
                                                            " bytes, expected " + std::to_string(d.size()))));
        }
        asio::async_read(*socks[s], asio::buffer(d.data(), d.size()), [&, s, left, h](auto ec2, std::size_t m) {
          pulled += m;
          if (ec2) return fail(lost(s, ec2));
          if (after) {
            try {
              after(s, h);
            } catch (...) {
              return fail(std::current_exception());
            }
          }
          read_next(s, left - 1);
        });
      });
    };
    for (std::size_t s = 0; s < socks.size(); ++s) {
      ops[s] = std::make_unique<ReadOp>();
      if (!bufs[s].empty()) {
        ++pending;
        asio::async_write(*socks[s], bufs[s], [&, s](auto ec, std::size_t n) {
          pushed += n;
          if (ec) return fail(lost(s, ec));
          --pending;
        });
      }
      if (replies[s] > 0) {
        ++pending;
        read_next(s, replies[s]);
      }
    }
    try {
      run(pending, what);
    } catch (...) {
      throw;
    }
    if (failure) {
      close();
      std::rethrow_exception(failure);
    }
  }
};

PsClient::PsClient(std::vector<PsEndpoint> endpoints, PartitionLayout layout, PsClientOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (endpoints.size() != static_cast<std::size_t>(layout.num_shards)) {
    throw ConfigError("ps_shards", "layout has " + std::to_string(layout.num_shards) +
                                       " shards but " + std::to_string(endpoints.size()) +
                                       " endpoints were given");
  }
  if (options.secret.size() < kMinJobSecretBytes) {
    throw ConfigError("secret", "the job secret must have at least " + std::to_string(kMinJobSecretBytes) +
                                    " bytes, got " + std::to_string(options.secret.size()));
  }
  impl_->endpoints = std::move(endpoints);
  impl_->layout = std::move(layout);
  impl_->opt = std::move(options);
  for (int s = 0; s < impl_->layout.num_shards; ++s) impl_->owned.push_back(impl_->layout.for_shard(s));
}

PsClient::~PsClient() {
  if (impl_) impl_->close();
}

void PsClient::connect() { impl_->open(std::chrono::steady_clock::now() + impl_->opt.timeout, impl_->opt.timeout); }

void PsClient::Impl::open(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds bound) {
  auto& im = *this;
  tcp::resolver resolver(im.io);
  for (std::size_t s = 0; s < im.endpoints.size(); ++s) {
    boost::system::error_code ec;
    auto results = resolver.resolve(im.endpoints[s].host, std::to_string(im.endpoints[s].port), ec);
    if (ec) throw IoError(im.where(s) + ": cannot resolve host: " + ec.message());
    for (;;) {
      im.check_stop();
      auto sock = std::make_unique<tcp::socket>(im.io);
      ec = im.connect_once(*sock, results, deadline);
      if (!ec) {
        sock->set_option(tcp::no_delay(true));
        im.socks.push_back(std::move(sock));
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw TimeoutError(im.where(s) + ": cannot connect within " + std::to_string(bound.count()) +
                           " ms: " + ec.message());
      }
      im.sleep_checking(std::chrono::milliseconds(100));
    }
  }
  im.authenticate();
  std::vector<std::vector<asio::const_buffer>> bufs(im.socks.size());
  std::vector<Header> hdrs(im.socks.size());
  const std::uint32_t hello[2] = {im.opt.rank, im.opt.num_workers};
  for (std::size_t s = 0; s < im.socks.size(); ++s) {
    wire::encode_header(im.header(wire::MessageType::kHello, 0, wire::Codec::kBytes, 8, 8),
                        std::span<std::byte, wire::kHeaderSize>(hdrs[s]));
    bufs[s] = {asio::buffer(hdrs[s]), asio::buffer(hello, 8)};
  }
  im.exchange(bufs, std::vector<int>(im.socks.size(), 1),
              [&](std::size_t s, const wire::FrameHeader& h) -> std::span<std::byte> {
                if (h.type != wire::MessageType::kHelloAck) {
                  throw ProtocolError(im.where(s) + ": expected hello-ack, got " + wire::to_string(h.type));
                }
                return {};
              },
              "hello");
}

void PsClient::init(std::span<const float> params) {
  auto& im = *impl_;
  if (static_cast<std::int64_t>(params.size()) != im.layout.total_floats) {
    throw ConfigError("model", "init with " + std::to_string(params.size()) + " floats, layout has " +
                                   std::to_string(im.layout.total_floats));
  }
  std::vector<std::vector<asio::const_buffer>> bufs(im.socks.size());
  std::vector<Header> hdrs(im.layout.partitions.size());
  for (const auto& p : im.layout.partitions) {
    const auto n = static_cast<std::uint32_t>(p.length);
    wire::encode_header(im.header(wire::MessageType::kInit, p.key, wire::Codec::kDenseF32, n, n * 4),
                        std::span<std::byte, wire::kHeaderSize>(hdrs[p.key]));
    bufs[p.shard].push_back(asio::buffer(hdrs[p.key]));
    bufs[p.shard].push_back(asio::buffer(params.data() + p.offset, n * 4));
  }
  im.exchange(bufs, std::vector<int>(im.socks.size(), 0), nullptr, "init");
}

namespace {

std::span<std::byte> pull_dest(PsClient::Impl& im, std::vector<std::size_t>& next, std::size_t s,
                               const wire::FrameHeader& h, std::span<float> params) {
  const auto& parts = im.owned[s];
  if (h.type != wire::MessageType::kPullReply) {
    throw ProtocolError(im.where(s) + ": expected pull-reply, got " + wire::to_string(h.type));
  }
  if (next[s] >= parts.size() || h.key != parts[next[s]].key) {
    throw ProtocolError(im.where(s) + ": pull-reply for unexpected partition " + std::to_string(h.key));
  }
  const auto& p = parts[next[s]++];
  if (h.codec != wire::Codec::kDenseF32 || h.count != p.length) {
    throw ProtocolError(im.where(s) + ": pull-reply of partition " + std::to_string(p.key) + " has " +
                        std::to_string(h.count) + " values, expected " + std::to_string(p.length));
  }
  return std::as_writable_bytes(params.subspan(static_cast<std::size_t>(p.offset),
                                               static_cast<std::size_t>(p.length)));
}

}  // namespace

void PsClient::push_pull(std::span<const float> grad, float lr, std::span<float> params) {
  auto& im = *impl_;
  const auto total = static_cast<std::size_t>(im.layout.total_floats);
  if (grad.size() != total) {
    throw ConfigError("model", "push_pull with " + std::to_string(grad.size()) + " floats, layout has " +
                                   std::to_string(total));
  }
  std::vector<PartitionPush> pushes(im.layout.partitions.size());
  for (const auto& p : im.layout.partitions) {
    auto& pp = pushes[p.key];
    pp.codec = wire::Codec::kDenseF32;
    pp.count = static_cast<std::uint32_t>(p.length);
    pp.first = std::as_bytes(grad.subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length)));
  }
  push_pull(pushes, lr, 1.0, params);
}

void PsClient::push_pull(std::span<const PartitionPush> pushes, float lr, double downlink_ratio,
                         std::span<float> params) {
  auto& im = *impl_;
  const auto total = static_cast<std::size_t>(im.layout.total_floats);
  if (params.size() != total || pushes.size() != im.layout.partitions.size()) {
    throw ConfigError("model", "push_pull with " + std::to_string(pushes.size()) + " partitions / " +
                                   std::to_string(params.size()) + " floats, layout has " +
                                   std::to_string(im.layout.partitions.size()) + " / " + std::to_string(total));
  }
  const bool sparse_pull = downlink_ratio < 1.0;
  std::vector<std::vector<asio::const_buffer>> bufs(im.socks.size());
  std::vector<Header> hdrs(im.layout.partitions.size() * 2);
  std::vector<int> replies(im.socks.size(), 0);
  for (std::size_t s = 0; s < im.owned.size(); ++s) {
    for (const auto& p : im.owned[s]) {
      const auto& pp = pushes[p.key];
      std::uint32_t bytes = 0;
      if (!wire::expected_payload_bytes(pp.codec, pp.count, bytes) || bytes != pp.first.size() + pp.second.size()) {
        throw ConfigError("compression", "push of partition " + std::to_string(p.key) + " has " +
                                             std::to_string(pp.first.size() + pp.second.size()) +
                                             " payload bytes for codec " + std::to_string(static_cast<int>(pp.codec)) +
                                             " and count " + std::to_string(pp.count));
      }
      auto& hp = hdrs[2 * p.key];
      auto h = im.header(wire::MessageType::kPush, p.key, pp.codec, pp.count, bytes, lr);
      if (pp.codec == wire::Codec::kSeededF32) h.seq = pp.seed;
      wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(hp));
      bufs[s].push_back(asio::buffer(hp));
      if (!pp.first.empty()) bufs[s].push_back(asio::buffer(pp.first.data(), pp.first.size()));
      if (!pp.second.empty()) bufs[s].push_back(asio::buffer(pp.second.data(), pp.second.size()));
    }
    for (const auto& p : im.owned[s]) {
      auto& hq = hdrs[2 * p.key + 1];
      const auto k = sparse_pull ? static_cast<std::uint32_t>(compress::k_for(static_cast<std::size_t>(p.length), downlink_ratio)) : 0u;
      wire::encode_header(im.header(sparse_pull ? wire::MessageType::kPullSparse : wire::MessageType::kPull, p.key,
                                    wire::Codec::kNone, sparse_pull ? k : (im.opt.sparse_downlink ? 1u : 0u), 0),
                          std::span<std::byte, wire::kHeaderSize>(hq));
      bufs[s].push_back(asio::buffer(hq));
      ++replies[s];
    }
  }
  std::vector<std::size_t> next(im.socks.size(), 0);
  if (!sparse_pull) {
    im.exchange(bufs, replies,
                [&](std::size_t s, const wire::FrameHeader& h) { return pull_dest(im, next, s, h, params); },
                "push/pull");
    return;
  }
  // Sparse replies: indices and values land in a per-shard scratch buffer and are added
  // to the replica once complete.
  std::vector<std::vector<float>> scratch(im.socks.size());
  std::vector<const Partition*> current(im.socks.size(), nullptr);
  im.exchange(
      bufs, replies,
      [&](std::size_t s, const wire::FrameHeader& h) -> std::span<std::byte> {
        const auto& parts = im.owned[s];
        if (h.type != wire::MessageType::kPullReply) {
          throw ProtocolError(im.where(s) + ": expected pull-reply, got " + wire::to_string(h.type));
        }
        if (next[s] >= parts.size() || h.key != parts[next[s]].key) {
          throw ProtocolError(im.where(s) + ": pull-reply for unexpected partition " + std::to_string(h.key));
        }
        const auto& p = parts[next[s]++];
        if (h.codec != wire::Codec::kSparseF32 || h.count > p.length) {
          throw ProtocolError(im.where(s) + ": sparse pull-reply of partition " + std::to_string(p.key) +
                              " has codec " + std::to_string(static_cast<int>(h.codec)) + " and " +
                              std::to_string(h.count) + " values for " + std::to_string(p.length));
        }
        current[s] = &p;
        scratch[s].resize(2 * static_cast<std::size_t>(h.count));
        return std::as_writable_bytes(std::span<float>(scratch[s]));
      },
      "push/pull",
      [&](std::size_t s, const wire::FrameHeader& h) {
        const Partition& p = *current[s];
        const auto* idx = reinterpret_cast<const std::uint32_t*>(scratch[s].data());
        const float* val = scratch[s].data() + h.count;
        float* base = params.data() + p.offset;
        for (std::uint32_t j = 0; j < h.count; ++j) {
          if (idx[j] >= p.length || (j > 0 && idx[j] <= idx[j - 1])) {
            throw ProtocolError(im.where(s) + ": sparse pull-reply of partition " + std::to_string(p.key) +
                                " has a bad index " + std::to_string(idx[j]));
          }
          base[idx[j]] += val[j];
        }
      });
}

void PsClient::pull(std::span<float> params) {
  auto& im = *impl_;
  if (params.size() != static_cast<std::size_t>(im.layout.total_floats)) {
    throw ConfigError("model", "pull into " + std::to_string(params.size()) + " floats, layout has " +
                                   std::to_string(im.layout.total_floats));
  }
  std::vector<std::vector<asio::const_buffer>> bufs(im.socks.size());
  std::vector<Header> hdrs(im.layout.partitions.size());
  std::vector<int> replies(im.socks.size(), 0);
  for (std::size_t s = 0; s < im.owned.size(); ++s) {
    for (const auto& p : im.owned[s]) {
      wire::encode_header(im.header(wire::MessageType::kPull, p.key, wire::Codec::kNone, im.opt.sparse_downlink ? 1u : 0u, 0),
                          std::span<std::byte, wire::kHeaderSize>(hdrs[p.key]));
      bufs[s].push_back(asio::buffer(hdrs[p.key]));
      ++replies[s];
    }
  }
  std::vector<std::size_t> next(im.socks.size(), 0);
  im.exchange(bufs, replies,
              [&](std::size_t s, const wire::FrameHeader& h) { return pull_dest(im, next, s, h, params); },
              "pull");
}

namespace {

std::uint32_t count_exchange(PsClient::Impl& im, wire::MessageType req, wire::MessageType want,
                             const char* what) {
  std::vector<std::vector<asio::const_buffer>> bufs(im.socks.size());
  std::vector<Header> hdrs(im.socks.size());
  for (std::size_t s = 0; s < im.socks.size(); ++s) {
    wire::encode_header(im.header(req, im.opt.rank, wire::Codec::kNone, 0, 0),
                        std::span<std::byte, wire::kHeaderSize>(hdrs[s]));
    bufs[s] = {asio::buffer(hdrs[s])};
  }
  std::uint32_t least = UINT32_MAX;
  im.exchange(bufs, std::vector<int>(im.socks.size(), 1),
              [&](std::size_t s, const wire::FrameHeader& h) -> std::span<std::byte> {
                if (h.type != want) {
                  throw ProtocolError(im.where(s) + ": expected " + wire::to_string(want) + ", got " +
                                      wire::to_string(h.type));
                }
                least = std::min(least, h.count);
                return {};
              },
              what);
  return least;
}

}  // namespace

std::uint32_t PsClient::done() {
  return count_exchange(*impl_, wire::MessageType::kDone, wire::MessageType::kDoneAck, "done");
}

std::uint32_t PsClient::workers_done() {
  return count_exchange(*impl_, wire::MessageType::kQuery, wire::MessageType::kQueryReply, "query");
}

void PsClient::resync(std::span<float> params) {
  auto& im = *impl_;
  if (params.size() != static_cast<std::size_t>(im.layout.total_floats)) {
    throw ConfigError("model", "resync into " + std::to_string(params.size()) + " floats, layout has " +
                                   std::to_string(im.layout.total_floats));
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + im.opt.reconnect_timeout;
  auto delay = std::chrono::milliseconds(100);
  std::string last;
  for (int attempt = 1;; ++attempt) {
    im.reset();
    try {
      im.open(deadline, im.opt.reconnect_timeout);
      init(params);
      pull(params);
      return;
    } catch (const IoError& e) {
      last = e.what();
    } catch (const TimeoutError& e) {
      last = e.what();
    } catch (const ProtocolError& e) {
      last = e.what();
    }
    if (Clock::now() + delay >= deadline) {
      im.reset();
      throw IoError("could not reconnect to the PS shards within " + std::to_string(im.opt.reconnect_timeout.count()) +
                    " ms (" + std::to_string(attempt) + " attempts); last failure: " + last);
    }
    im.sleep_checking(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

std::uint64_t PsClient::bytes_pushed() const { return impl_->pushed; }
std::uint64_t PsClient::bytes_pulled() const { return impl_->pulled; }

}  // namespace dltrain::ps
