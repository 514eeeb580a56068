// A local group: the workers of one job on one machine, which sum their gradients inside
// the machine before one of them (member 0) pushes the sum to the PS shards and shares
// the parameters it pulls (docs/gpu.md, "Local groups"; BytePS's split of synchronous
// reduction inside a machine and asynchronous, sparse exchange between machines: Jiang et
// al. 2020, "A Unified Architecture for Accelerating Distributed DNN Training in
// Heterogeneous GPU/CPU Clusters", §4).
//
// LocalGroup is the group's logic — who belongs, who pushes, how a member that dies or
// stalls ends the others instead of hanging them — over a Unix socket that member 0
// listens on (its path chosen by the agent; never a TCP port). It is also the CPU
// backend: allreduce_sum and broadcast move host floats over those sockets, member 0
// summing in rank order. The NCCL backend (gpu/nccl_group.h, built with
// DLTRAIN_WITH_CUDA) is formed through a LocalGroup, which carries its unique id, and
// keeps watching the group's sockets for a member's end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/errors.h"

namespace dltrain::group {

/// A member of the group ended, left, stalled past the timeout, or spoke out of turn.
/// what() names the member (its task name and rank) and the operation.
class LocalGroupError : public Error {
 public:
  using Error::Error;
};

/// How a worker joins its local group.
struct LocalGroupOptions {
  std::string socket_path;            ///< the rendezvous (≤ 107 bytes); member 0 listens there
  int rank = 0;                       ///< this member, [0, members.size())
  std::vector<std::string> members;   ///< task names by rank, for messages; size() = group size
  std::uint64_t job = 0;              ///< checked at join: every member must be of this job …
  std::uint32_t generation = 0;       ///< … and generation
  /// Bound on forming the group and on any one wait for another member within an
  /// operation; past it the operation throws LocalGroupError naming the member.
  std::chrono::milliseconds timeout{60000};
  /// Checked every 100 ms while waiting: when it becomes true, the wait throws
  /// ps::StopRequested (the worker was asked to stop). May be null.
  const std::atomic<bool>* stop_requested = nullptr;
};

/// One member's end of its local group. Every member must call the same operations, with
/// buffers of the same length, in the same order (each operation carries a sequence
/// number and its length, and a mismatch is a LocalGroupError). Not thread-safe: one
/// thread uses a LocalGroup.
class LocalGroup {
 public:
  /// Forms the group: member 0 removes a stale socket file, listens at
  /// options.socket_path and accepts the other members (each proves job, generation,
  /// rank and group size; a wrong or repeated rank is refused and named), then removes
  /// the file; the others connect, retrying every 50 ms while the file is absent or
  /// refuses. Throws LocalGroupError when the group is not whole within
  /// options.timeout (naming the members missing), ConfigError for a bad path or rank,
  /// ps::StopRequested when asked to stop. A group of one member has no socket at all.
  static std::unique_ptr<LocalGroup> join(const LocalGroupOptions& options);

  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int rank() const { return opt_.rank; }
  int size() const { return static_cast<int>(opt_.members.size()); }
  /// Member 0 pushes the group's sum and pulls; the others only reduce and receive.
  bool pushes() const { return opt_.rank == 0; }
  /// "worker-2 (member 2 of 3)": how messages name member `rank`.
  std::string describe(int rank) const;

  /// Replaces `data` on every member with the element-wise sum over the members, added
  /// in rank order (member 0's values, plus member 1's, …), so every member holds the
  /// same floats. O(size × n) on member 0; each other member sends and receives n floats.
  /// Throws LocalGroupError (a member ended, stalled past the timeout, or sent another
  /// length or operation), ps::StopRequested.
  void allreduce_sum(std::span<float> data);

  /// Member 0's `data` to every member (its own unchanged). Throws as allreduce_sum.
  void broadcast(std::span<float> data);
  /// broadcast() of raw bytes (the NCCL unique id).
  void broadcast_bytes(std::span<std::byte> data);

  /// Whether a member has ended (its socket closed or failed) without waiting: for a
  /// backend that waits on something else (NCCL on a stream) and must not hang when a
  /// member is gone. Returns the message of the LocalGroupError it would throw, or "".
  std::string peer_failure();

 private:
  explicit LocalGroup(LocalGroupOptions options);
  void form();
  void send_to(int member, std::span<const std::byte> bytes, const char* op);
  void recv_from(int member, std::span<std::byte> bytes, const char* op);
  /// send_to / recv_from: all `n` bytes to or from `member`, or LocalGroupError saying
  /// how it failed (closed, stalled, an errno), ps::StopRequested when asked to stop.
  void transfer(int member, std::byte* data, std::size_t n, bool write, const char* op);
  void check_header(int member, std::uint32_t op, std::uint64_t count, const char* name);
  void exchange_header(std::uint32_t op, std::uint64_t count, const char* name);

  LocalGroupOptions opt_;
  std::vector<int> fds_;        ///< member 0: one per member (its own: -1); others: [0] = member 0
  std::uint64_t seq_ = 0;       ///< operations done so far
  std::vector<float> scratch_;  ///< member 0: one member's floats while summing
};

}  // namespace dltrain::group
