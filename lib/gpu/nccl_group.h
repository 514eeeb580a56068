// The NCCL backend of a local group (group/local_group.h; -DDLTRAIN_WITH_CUDA=ON): the
// group's members, one GPU each, sum device buffers with ncclAllReduce and receive member
// 0's with ncclBroadcast. The communicator is formed through the LocalGroup — member 0's
// ncclGetUniqueId travels over the group's Unix socket, never a fixed port — and every
// operation waits in slices that also watch the group's sockets: a member that ends or
// stalls aborts the communicator (ncclCommAbort) and the operation throws instead of
// hanging in NCCL.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>

#include "group/local_group.h"

namespace dltrain::gpu {

/// Thread-safety: one thread per instance; the LocalGroup must outlive it and must not
/// be used for its own operations while an NCCL operation runs.
class NcclGroup {
 public:
  /// Forms the communicator of `group`'s members on CUDA device `device` (of this
  /// process's visible ones). Throws group::LocalGroupError (a member ended, or forming
  /// took longer than `timeout`), CudaError, Error (an NCCL error, with its text), and
  /// ps::StopRequested once `*stop_requested` (may be null) is true while it waits.
  NcclGroup(group::LocalGroup& group, int device, std::chrono::milliseconds timeout,
            const std::atomic<bool>* stop_requested = nullptr);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  /// In place, on every member: the sum of the members' `n` floats at device pointer
  /// `data`. NCCL's own stream waits (on the device, through an event) for the work
  /// queued on `producer` before it — the cudaStream_t that wrote `data`, e.g.
  /// LibTorch's current stream; null: the legacy default stream. Returns when the result
  /// is in `data`, so that whatever the caller queues next sees it. Throws as the
  /// constructor.
  void allreduce_sum(float* data, std::size_t n, void* producer = nullptr);
  /// Member 0's `n` floats at `data` to every member, after `producer`'s work as
  /// allreduce_sum. Throws as the constructor.
  void broadcast(float* data, std::size_t n, void* producer = nullptr);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::gpu
