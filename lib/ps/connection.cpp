#include "ps/connection.h"

#include <thread>

#include "common/enforce.h"
#include "common/errors.h"
#include "wire/auth.h"

namespace dltrain::ps::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// How often a waiting call looks at the stop flag.
constexpr std::chrono::milliseconds kStopCheck{100};

}  // namespace

HeaderBytes encode(const wire::FrameHeader& h) {
  HeaderBytes b{};
  wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(b));
  return b;
}

ShardConnections::ShardConnections(std::vector<PsEndpoint> endpoints, PsClientOptions options)
    : endpoints_(std::move(endpoints)), opt_(std::move(options)) {}

ShardConnections::~ShardConnections() { close(); }

wire::FrameHeader ShardConnections::header(wire::MessageType type, std::uint32_t key, wire::Codec codec,
                                           std::uint32_t count, std::uint32_t payload_bytes, float scale) {
  wire::FrameHeader h;
  h.type = type;
  h.job = opt_.job;
  h.generation = opt_.generation;
  h.seq = ++seq_;
  h.key = key;
  h.codec = codec;
  h.count = count;
  h.payload_bytes = payload_bytes;
  h.scale = scale;
  return h;
}

std::string ShardConnections::where(std::size_t shard) const {
  return "PS shard " + std::to_string(shard) + " (" + endpoints_[shard].host + ":" +
         std::to_string(endpoints_[shard].port) + ")";
}

std::exception_ptr ShardConnections::lost(std::size_t s, const boost::system::error_code& ec) const {
  return std::make_exception_ptr(PsConnectionLost(s, where(s) + ": connection lost: " + ec.message()));
}

// Runs the io_context until `pending` reaches zero, or until the shards have been silent
// (no read or write completed) for the timeout. Handlers that are ready run before the
// clock is looked at: a worker that was suspended (SIGSTOP, a paused VM, a swapped-out
// process) wakes past its deadline with the replies waiting in its socket, and that is not
// a PS that stopped answering. Nor is the time this process itself did not run: a gap
// between two turns of the loop far longer than a slice (the process was stopped or
// descheduled; an epoll_wait that a SIGSTOP interrupted returns without the events that
// came meanwhile) moves the deadline by the gap, so that the shards are given their whole
// timeout of time this process could have heard them in.
void ShardConnections::run(const int& pending, const char* what) {
  io_.restart();
  auto deadline = Clock::now() + opt_.timeout;
  auto last_turn = Clock::now();
  while (pending > 0) {
    check_stop();
    std::size_t ran = io_.poll();
    const auto now = Clock::now();
    if (now - last_turn > 5 * kStopCheck) deadline += now - last_turn;
    last_turn = now;
    if (ran == 0 && pending > 0) {
      if (now >= deadline) break;
      ran = io_.run_one_until(std::min(deadline, Clock::now() + kStopCheck));
      if (ran == 0) continue;  // a slice passed: look at the stop flag and the clock again
    }
    if (ran > 0) deadline = Clock::now() + opt_.timeout;
  }
  if (pending > 0) {
    close();
    throw TimeoutError(std::string("PS ") + what + ": no reply for " + std::to_string(opt_.timeout.count()) + " ms");
  }
}

// Throws StopRequested (closing every connection) once the owner asked to stop.
void ShardConnections::check_stop() {
  if (opt_.stop_requested != nullptr && opt_.stop_requested->load(std::memory_order_relaxed)) {
    close();
    throw StopRequested("the worker was asked to stop while talking to the PS shards");
  }
}

// Sleeps `d` in slices, looking at the stop flag between them.
void ShardConnections::sleep_checking(std::chrono::milliseconds d) {
  const auto until = Clock::now() + d;
  for (auto now = Clock::now(); now < until; now = Clock::now()) {
    check_stop();
    std::this_thread::sleep_for(std::min<Clock::duration>(until - now, kStopCheck));
  }
  check_stop();
}

void ShardConnections::close() {
  broken_ = true;
  for (auto& s : socks_) {
    boost::system::error_code ig;
    if (s) s->close(ig);
  }
  io_.restart();
  io_.poll();  // drain cancelled handlers
}

// Closes every connection and forgets them, so that open_until() can start afresh.
void ShardConnections::reset() {
  close();
  socks_.clear();
  broken_ = false;
}

// One connection attempt, bounded by `deadline`: a host that drops SYNs would otherwise
// hold a blocking connect for the kernel's retry time (minutes).
boost::system::error_code ShardConnections::connect_once(Socket& sock, const tcp::resolver::results_type& results,
                                                         Clock::time_point deadline) {
  boost::system::error_code result = asio::error::would_block;
  io_.restart();
  asio::async_connect(sock, results, [&](const boost::system::error_code& ec, const tcp::endpoint&) { result = ec; });
  while (result == asio::error::would_block) {
    if (opt_.stop_requested != nullptr && opt_.stop_requested->load(std::memory_order_relaxed)) break;
    const auto now = Clock::now();
    if (now >= deadline) break;
    io_.run_one_until(std::min(deadline, now + kStopCheck));
  }
  if (result == asio::error::would_block) {
    boost::system::error_code ig;
    sock.close(ig);
    io_.restart();
    io_.poll();  // the cancelled handler runs and sets `result`
    check_stop();
    result = asio::error::timed_out;
  }
  return result;
}

// Connects to every shard in turn, retrying refused connections every 0.1 s until
// `deadline`. `bound` (the time from the first attempt to `deadline`) is for the message.
void ShardConnections::connect_all(Clock::time_point deadline, std::chrono::milliseconds bound) {
  tcp::resolver resolver(io_);
  for (std::size_t s = 0; s < endpoints_.size(); ++s) {
    boost::system::error_code ec;
    auto results = resolver.resolve(endpoints_[s].host, std::to_string(endpoints_[s].port), ec);
    if (ec) throw IoError(where(s) + ": cannot resolve host: " + ec.message());
    for (;;) {
      check_stop();
      auto sock = std::make_unique<Socket>(io_);
      ec = connect_once(*sock, results, deadline);
      if (!ec) {
        sock->set_option(tcp::no_delay(true));
        socks_.push_back(std::move(sock));
        break;
      }
      if (Clock::now() >= deadline) {
        throw TimeoutError(where(s) + ": cannot connect within " + std::to_string(bound.count()) +
                           " ms: " + ec.message());
      }
      sleep_checking(std::chrono::milliseconds(100));
    }
  }
}

// The handshake of wire/auth.h with every shard at once, bounded by the timeout: read the
// shard's challenge, answer it, and check the shard's proof.
void ShardConnections::authenticate() {
  struct Handshake {
    std::array<std::uint8_t, wire::kChallengeSize> challenge{};
    std::array<std::uint8_t, wire::kAnswerSize> answer{};
    std::array<std::uint8_t, wire::kProofSize> proof{};
    wire::Nonce mine{};
  };
  std::vector<Handshake> hs(socks_.size());
  int pending = 0;
  std::exception_ptr failure;
  auto fail = [&](std::exception_ptr e) {
    if (!failure) failure = e;
    pending = 0;
  };
  const std::string who = "job " + std::to_string(opt_.job) + " generation " + std::to_string(opt_.generation);
  auto check_proof = [&](std::size_t s, Handshake* h) {
    const wire::Mac mac = wire::decode_proof(h->proof);
    if (!wire::macs_equal(mac, wire::auth_mac(opt_.secret, h->mine, opt_.job, opt_.generation, wire::kShardContext))) {
      throw IoError(where(s) + " failed to prove that it knows the job secret: it is not a PS shard of " + who);
    }
  };
  auto answer = [&](Handshake* h) {
    const wire::Nonce theirs = wire::decode_challenge(h->challenge);
    wire::AuthAnswer a;
    a.job = opt_.job;
    a.generation = opt_.generation;
    a.nonce = h->mine = wire::random_nonce();
    a.mac = wire::auth_mac(opt_.secret, theirs, opt_.job, opt_.generation, wire::kWorkerContext);
    wire::encode_answer(a, h->answer);
  };
  for (std::size_t s = 0; s < socks_.size(); ++s) {
    ++pending;
    Handshake* h = &hs[s];
    asio::async_read(*socks_[s], asio::buffer(h->challenge), [&, s, h](auto ec, std::size_t n) {
      pulled_ += n;
      if (ec) {
        return fail(std::make_exception_ptr(
            IoError(where(s) + ": no authentication challenge from the shard: " + ec.message())));
      }
      try {
        answer(h);
      } catch (...) {
        return fail(std::current_exception());
      }
      asio::async_write(*socks_[s], asio::buffer(h->answer), [&, s, h](auto ec2, std::size_t m) {
        pushed_ += m;
        if (ec2) {
          return fail(std::make_exception_ptr(
              IoError(where(s) + ": sending the authentication answer failed: " + ec2.message())));
        }
        asio::async_read(*socks_[s], asio::buffer(h->proof), [&, s, h](auto ec3, std::size_t k) {
          pulled_ += k;
          if (ec3) {
            return fail(std::make_exception_ptr(IoError(
                where(s) + " refused this worker (" + who + ") in the authentication handshake (" + ec3.message() +
                "): a wrong job secret, or a task of another job or an older generation; the shard's log says "
                "which")));
          }
          try {
            check_proof(s, h);
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

// Tells every shard this worker's rank and the job's worker count.
void ShardConnections::hello() {
  const std::uint32_t ranks[2] = {opt_.rank, opt_.num_workers};
  std::vector<HeaderBytes> hdrs(socks_.size());
  std::vector<Request> requests(socks_.size());
  for (std::size_t s = 0; s < socks_.size(); ++s) {
    hdrs[s] = encode(header(wire::MessageType::kHello, 0, wire::Codec::kBytes, 8, 8));
    requests[s] = {hdrs[s], std::as_bytes(std::span(ranks))};
  }
  exchange(
      requests, std::vector<int>(socks_.size(), 1),
      [&](std::size_t s, const wire::FrameHeader& h) -> std::span<std::byte> {
        DLTRAIN_ENFORCE_EQ(h.type, wire::MessageType::kHelloAck, ProtocolError, where(s));
        return {};
      },
      "hello");
}

void ShardConnections::open_until(Clock::time_point deadline, std::chrono::milliseconds bound) {
  connect_all(deadline, bound);
  authenticate();
  if (opt_.hello) hello();
}

void ShardConnections::open() { open_until(Clock::now() + opt_.timeout, opt_.timeout); }

void ShardConnections::reconnect(const std::function<void()>& after_open) {
  const auto deadline = Clock::now() + opt_.reconnect_timeout;
  auto delay = std::chrono::milliseconds(100);
  std::string last;
  for (int attempt = 1;; ++attempt) {
    reset();
    try {
      open_until(deadline, opt_.reconnect_timeout);
      after_open();
      return;
    } catch (const IoError& e) {
      last = e.what();
    } catch (const TimeoutError& e) {
      last = e.what();
    } catch (const ProtocolError& e) {
      last = e.what();
    }
    if (Clock::now() + delay >= deadline) {
      reset();
      throw IoError("could not reconnect to the PS shards within " + std::to_string(opt_.reconnect_timeout.count()) +
                    " ms (" + std::to_string(attempt) + " attempts); last failure: " + last);
    }
    sleep_checking(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

void ShardConnections::exchange(const std::vector<Request>& requests, const std::vector<int>& replies,
                                const ReplyDest& dest, const char* what, const ReplyDone& done) {
  if (broken_) throw IoError("PS client is closed after an earlier error");
  if (socks_.size() != endpoints_.size()) throw IoError("PS client is not connected: call connect() first");
  int pending = 0;
  std::exception_ptr failure;
  auto fail = [&](std::exception_ptr e) {
    if (!failure) failure = e;
    pending = 0;
  };
  // One reply being read per shard: its header, or the text of an error frame.
  struct ReadOp {
    HeaderBytes hdr{};
    std::vector<char> err;
  };
  std::vector<ReadOp> ops(socks_.size());
  // Where the payload of a frame goes, checked against its header (a throw fails the call).
  auto payload_of = [&](std::size_t s, const wire::FrameHeader& h) {
    std::span<std::byte> d = dest(s, h);
    if (h.payload_bytes != 0) {
      DLTRAIN_ENFORCE_EQ(h.payload_bytes, d.size(), ProtocolError, where(s), ": ", wire::to_string(h.type),
                         " payload bytes");
    }
    return d;
  };
  std::function<void(std::size_t, int)> read_next = [&](std::size_t s, int left) {
    if (left == 0) {
      --pending;
      return;
    }
    ReadOp* op = &ops[s];
    asio::async_read(*socks_[s], asio::buffer(op->hdr), [&, s, left, op](auto ec, std::size_t n) {
      pulled_ += n;
      if (ec) return fail(lost(s, ec));
      wire::FrameHeader h;
      std::span<std::byte> d;
      try {
        h = wire::decode_header(std::span<const std::byte, wire::kHeaderSize>(op->hdr), opt_.limits);
        if (h.type == wire::MessageType::kError) {
          op->err.resize(h.payload_bytes);
          asio::async_read(*socks_[s], asio::buffer(op->err), [&, s, op](auto, std::size_t m) {
            pulled_ += m;
            fail(std::make_exception_ptr(
                IoError(where(s) + " refused the request: " + std::string(op->err.begin(), op->err.end()))));
          });
          return;
        }
        d = payload_of(s, h);
      } catch (...) {
        return fail(std::current_exception());
      }
      if (h.payload_bytes == 0) return read_next(s, left - 1);
      asio::async_read(*socks_[s], asio::buffer(d.data(), d.size()), [&, s, left, h](auto ec2, std::size_t m) {
        pulled_ += m;
        if (ec2) return fail(lost(s, ec2));
        if (done) {
          try {
            done(s, h);
          } catch (...) {
            return fail(std::current_exception());
          }
        }
        read_next(s, left - 1);
      });
    });
  };
  std::vector<std::vector<asio::const_buffer>> bufs(socks_.size());
  for (std::size_t s = 0; s < socks_.size(); ++s) {
    for (const auto& b : requests[s]) bufs[s].emplace_back(b.data(), b.size());
    if (!bufs[s].empty()) {
      ++pending;
      asio::async_write(*socks_[s], bufs[s], [&, s](auto ec, std::size_t n) {
        pushed_ += n;
        if (ec) return fail(lost(s, ec));
        --pending;
      });
    }
    if (replies[s] > 0) {
      ++pending;
      read_next(s, replies[s]);
    }
  }
  run(pending, what);
  if (failure) {
    close();
    std::rethrow_exception(failure);
  }
}

}  // namespace dltrain::ps::detail
