#include "group/local_group.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "ps/client.h"

namespace dltrain::group {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x474c4c44;  // "DLLG"
constexpr std::uint32_t kVersion = 1;
constexpr auto kSlice = std::chrono::milliseconds(100);

enum Op : std::uint32_t { kAllreduce = 1, kBroadcast = 2, kBroadcastBytes = 3 };

// What a member says when it joins.
struct Hello {
  std::uint32_t magic = kMagic;
  std::uint32_t version = kVersion;
  std::uint64_t job = 0;
  std::uint32_t generation = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint32_t pad = 0;
};
static_assert(sizeof(Hello) == 32);

// Member 0's answer: status 0 (welcome) or 1 (refused, followed by `length` bytes of why).
struct Welcome {
  std::uint32_t status = 0;
  std::uint32_t length = 0;
};

// Before every operation's data.
struct Header {
  std::uint32_t op = 0;
  std::uint32_t pad = 0;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
};
static_assert(sizeof(Header) == 24);

const char* op_name(std::uint32_t op) {
  switch (op) {
    case kAllreduce: return "allreduce_sum";
    case kBroadcast: return "broadcast";
    case kBroadcastBytes: return "broadcast_bytes";
    default: return "an unknown operation";
  }
}

sockaddr_un address_of(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    throw ConfigError("local_group_socket", "a Unix socket path must have 1 to " +
                                                std::to_string(sizeof(a.sun_path) - 1) + " bytes, got " +
                                                std::to_string(path.size()) + " (\"" + path + "\")");
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

void check_stop(const LocalGroupOptions& o) {
  if (o.stop_requested != nullptr && o.stop_requested->load(std::memory_order_relaxed)) {
    throw ps::StopRequested("the worker was asked to stop");
  }
}

// Waits for `events` on `fd` up to `deadline`, in slices that look at the stop flag.
// Returns false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline, const LocalGroupOptions& o) {
  for (;;) {
    check_stop(o);
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left, std::chrono::milliseconds(kSlice)).count()) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw IoError(std::string("local group: poll failed: ") + std::strerror(errno));
  }
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Reads or writes all of `bytes` on `fd`, waiting at most `timeout` for each piece.
// Returns "" or why it could not ("closed", "timeout", an errno text).
std::string io_all(int fd, std::byte* data, std::size_t n, bool write, std::chrono::milliseconds timeout,
                   const LocalGroupOptions& o) {
  std::size_t done = 0;
  auto deadline = Clock::now() + timeout;
  while (done < n) {
    if (!wait_for(fd, write ? POLLOUT : POLLIN, deadline, o)) return "timeout";
    const ssize_t r = write ? ::send(fd, data + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : ::recv(fd, data + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      deadline = Clock::now() + timeout;  // progress: the bound is on silence
      continue;
    }
    if (r == 0) return "closed";
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return "closed";
    return std::strerror(errno);
  }
  return "";
}

}  // namespace

LocalGroup::LocalGroup(LocalGroupOptions options) : opt_(std::move(options)) {}

LocalGroup::~LocalGroup() {
  for (const int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::string LocalGroup::describe(int rank) const {
  const auto& m = opt_.members;
  const std::string name = rank >= 0 && rank < size() ? m[static_cast<std::size_t>(rank)] : "?";
  return name + " (member " + std::to_string(rank) + " of " + std::to_string(size()) + ")";
}

std::unique_ptr<LocalGroup> LocalGroup::join(const LocalGroupOptions& options) {
  const int n = static_cast<int>(options.members.size());
  if (n < 1) throw ConfigError("local_group", "a local group needs at least one member");
  if (options.rank < 0 || options.rank >= n) {
    throw ConfigError("local_group_rank", "expected [0, " + std::to_string(n) + "), got " + std::to_string(options.rank));
  }
  std::unique_ptr<LocalGroup> g(new LocalGroup(options));
  if (n > 1) g->form();
  return g;
}

void LocalGroup::form() {
  const auto addr = address_of(opt_.socket_path);
  const auto deadline = Clock::now() + opt_.timeout;
  const int n = size();
  if (opt_.rank == 0) {
    ::unlink(opt_.socket_path.c_str());  // a stale file of an earlier run of this group
    Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener.get() < 0) throw IoError(std::string("local group: socket failed: ") + std::strerror(errno));
    if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener.get(), n) != 0) {
      throw IoError("local group: cannot listen on \"" + opt_.socket_path + "\": " + std::strerror(errno));
    }
    fds_.assign(static_cast<std::size_t>(n), -1);
    int joined = 1;
    while (joined < n) {
      if (!wait_for(listener.get(), POLLIN, deadline, opt_)) {
        std::string missing;
        for (int r = 1; r < n; ++r) {
          if (fds_[static_cast<std::size_t>(r)] < 0) missing += (missing.empty() ? "" : ", ") + describe(r);
        }
        ::unlink(opt_.socket_path.c_str());
        throw LocalGroupError("local group of " + describe(0) + ": " + missing + " did not join within " +
                              fmt::format("{:g}", static_cast<double>(opt_.timeout.count()) / 1000.0) + " s");
      }
      Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c.get() < 0) continue;
      Hello h;
      if (!io_all(c.get(), reinterpret_cast<std::byte*>(&h), sizeof h, false, std::chrono::milliseconds(5000), opt_)
               .empty()) {
        continue;  // it went away before it said who it is
      }
      std::string refusal;
      if (h.magic != kMagic || h.version != kVersion) {
        refusal = "not a dltrain local-group member (or another version)";
      } else if (h.job != opt_.job || h.generation != opt_.generation) {
        refusal = "of job " + std::to_string(h.job) + " generation " + std::to_string(h.generation) +
                  ", but this group is of job " + std::to_string(opt_.job) + " generation " +
                  std::to_string(opt_.generation);
      } else if (static_cast<int>(h.size) != n) {
        refusal = "expects a group of " + std::to_string(h.size) + " members, but this one has " + std::to_string(n);
      } else if (h.rank == 0 || static_cast<int>(h.rank) >= n) {
        refusal = "rank " + std::to_string(h.rank) + " is not in [1, " + std::to_string(n) + ")";
      } else if (fds_[h.rank] >= 0) {
        refusal = "rank " + std::to_string(h.rank) + " has joined already";
      }
      Welcome w{refusal.empty() ? 0u : 1u, static_cast<std::uint32_t>(refusal.size())};
      std::vector<std::byte> reply(sizeof w + refusal.size());
      std::memcpy(reply.data(), &w, sizeof w);
      std::memcpy(reply.data() + sizeof w, refusal.data(), refusal.size());
      const auto sent = io_all(c.get(), reply.data(), reply.size(), true, std::chrono::milliseconds(5000), opt_);
      if (!refusal.empty()) {
        spdlog::warn("local group of {}: refused a member: {}", describe(0), refusal);
        continue;
      }
      if (!sent.empty()) continue;
      fds_[h.rank] = c.release();
      ++joined;
    }
    ::unlink(opt_.socket_path.c_str());  // whole: nobody else may join
    return;
  }
  // Another member: connect (member 0 may not listen yet, or a stale file is there).
  Fd c;
  bool said_waiting = false;
  for (;;) {
    check_stop(opt_);
    c.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (c.get() < 0) throw IoError(std::string("local group: socket failed: ") + std::strerror(errno));
    if (::connect(c.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    const int err = errno;
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      throw IoError("local group: cannot connect to \"" + opt_.socket_path + "\": " + std::strerror(err));
    }
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline) {
      throw LocalGroupError("local group: " + describe(0) + " did not open the group at \"" + opt_.socket_path +
                            "\" within " + fmt::format("{:g}", static_cast<double>(opt_.timeout.count()) / 1000.0) + " s (" +
                            std::strerror(err) + ")");
    }
    if (!said_waiting) {
      // Once, so that a member started before member 0 says what it waits for.
      spdlog::info("local group: waiting for {} to open the group at \"{}\" ({}; retrying for up to {:g} s)",
                   describe(0), opt_.socket_path, std::strerror(err), static_cast<double>(opt_.timeout.count()) / 1000.0);
      said_waiting = true;
    }
    c.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Hello h;
  h.job = opt_.job;
  h.generation = opt_.generation;
  h.rank = static_cast<std::uint32_t>(opt_.rank);
  h.size = static_cast<std::uint32_t>(n);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const auto timeout = std::max(left, std::chrono::milliseconds(1000));
  Welcome w;
  std::string why = io_all(c.get(), reinterpret_cast<std::byte*>(&h), sizeof h, true, timeout, opt_);
  if (why.empty()) why = io_all(c.get(), reinterpret_cast<std::byte*>(&w), sizeof w, false, timeout, opt_);
  if (!why.empty()) {
    throw LocalGroupError("local group: " + describe(0) + " did not welcome " + describe(opt_.rank) + " (" + why + ")");
  }
  if (w.status != 0) {
    std::string text(std::min<std::uint32_t>(w.length, 4096), '\0');
    (void)io_all(c.get(), reinterpret_cast<std::byte*>(text.data()), text.size(), false, timeout, opt_);
    throw LocalGroupError("local group: " + describe(0) + " refused " + describe(opt_.rank) + ": " + text);
  }
  fds_.assign(1, c.release());
}

void LocalGroup::send_to(int member, std::span<const std::byte> bytes, const char* op) {
  transfer(member, const_cast<std::byte*>(bytes.data()), bytes.size(), true, op);
}

void LocalGroup::recv_from(int member, std::span<std::byte> bytes, const char* op) {
  transfer(member, bytes.data(), bytes.size(), false, op);
}

void LocalGroup::transfer(int member, std::byte* data, std::size_t n, bool write, const char* op) {
  const int fd = fds_[opt_.rank == 0 ? static_cast<std::size_t>(member) : 0];
  const auto why = io_all(fd, data, n, write, opt_.timeout, opt_);
  if (why.empty()) return;
  check_stop(opt_);  // stopped with the others (a re-assignment): a stop, not a failure
  if (why == "closed") {
    throw LocalGroupError("local group: " + describe(member) + " left the group during " + op +
                          " (its connection closed: the worker ended)");
  }
  if (why == "timeout") {
    throw LocalGroupError("local group: " + describe(member) + (write ? " took nothing for " : " sent nothing for ") +
                          fmt::format("{:g}", static_cast<double>(opt_.timeout.count()) / 1000.0) + " s during " +
                          op + " (stalled)");
  }
  throw LocalGroupError("local group: " + std::string(write ? "sending to " : "receiving from ") + describe(member) +
                        " during " + op + " failed: " + why);
}

void LocalGroup::check_header(int member, std::uint32_t op, std::uint64_t count, const char* name) {
  Header h;
  recv_from(member, std::as_writable_bytes(std::span(&h, 1)), name);
  if (h.op != op || h.seq != seq_ || h.count != count) {
    throw LocalGroupError("local group: " + describe(member) + " is at operation " + std::to_string(h.seq) + " (" +
                          op_name(h.op) + " of " + std::to_string(h.count) + " elements), " + describe(opt_.rank) +
                          " at " + std::to_string(seq_) + " (" + name + " of " + std::to_string(count) +
                          "): the members disagree");
  }
}

void LocalGroup::exchange_header(std::uint32_t op, std::uint64_t count, const char* name) {
  const Header h{op, 0, seq_, count};
  const auto bytes = std::as_bytes(std::span(&h, 1));
  if (opt_.rank == 0) {
    for (int r = 1; r < size(); ++r) send_to(r, bytes, name);
  } else {
    check_header(0, op, count, name);
  }
}

void LocalGroup::allreduce_sum(std::span<float> data) {
  if (size() == 1) return;
  const char* name = op_name(kAllreduce);
  const auto bytes = std::as_writable_bytes(data);
  if (opt_.rank == 0) {
    scratch_.resize(data.size());
    const auto in = std::as_writable_bytes(std::span<float>(scratch_));
    for (int r = 1; r < size(); ++r) {
      check_header(r, kAllreduce, data.size(), name);
      recv_from(r, in, name);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] += scratch_[i];
    }
    exchange_header(kAllreduce, data.size(), name);
    for (int r = 1; r < size(); ++r) send_to(r, bytes, name);
  } else {
    const Header h{kAllreduce, 0, seq_, data.size()};
    send_to(0, std::as_bytes(std::span(&h, 1)), name);
    send_to(0, bytes, name);
    exchange_header(kAllreduce, data.size(), name);
    recv_from(0, bytes, name);
  }
  ++seq_;
}

void LocalGroup::broadcast(std::span<float> data) {
  if (size() == 1) return;
  const char* name = op_name(kBroadcast);
  exchange_header(kBroadcast, data.size(), name);
  const auto bytes = std::as_writable_bytes(data);
  if (opt_.rank == 0) {
    for (int r = 1; r < size(); ++r) send_to(r, bytes, name);
  } else {
    recv_from(0, bytes, name);
  }
  ++seq_;
}

void LocalGroup::broadcast_bytes(std::span<std::byte> data) {
  if (size() == 1) return;
  const char* name = op_name(kBroadcastBytes);
  exchange_header(kBroadcastBytes, data.size(), name);
  if (opt_.rank == 0) {
    for (int r = 1; r < size(); ++r) send_to(r, data, name);
  } else {
    recv_from(0, data, name);
  }
  ++seq_;
}

std::string LocalGroup::peer_failure() {
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    if (fds_[i] < 0) continue;
    pollfd p{fds_[i], POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) continue;
    const int member = opt_.rank == 0 ? static_cast<int>(i) : 0;
    char c;
    const ssize_t r = ::recv(fds_[i], &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if ((p.revents & (POLLHUP | POLLERR)) != 0 || r == 0) {
      return "local group: " + describe(member) + " left the group (its connection closed: the worker ended)";
    }
  }
  return "";
}

}  // namespace dltrain::group
