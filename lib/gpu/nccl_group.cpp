#include "gpu/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "gpu/device.h"
#include "ps/client.h"

namespace dltrain::gpu {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

}  // namespace

struct NcclGroup::Impl {
  group::LocalGroup& group;
  std::chrono::milliseconds timeout;
  const std::atomic<bool>* stop = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t produced = nullptr;  ///< recorded on the producer's stream; NCCL's stream waits for it
  bool aborted = false;

  Impl(group::LocalGroup& g, std::chrono::milliseconds t, const std::atomic<bool>* s) : group(g), timeout(t), stop(s) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Releases whatever was made, also when the constructor threw half-way (NCCL's
  // unique id exchange, the communicator's creation or its wait): the communicator,
  // finalized (bounded) or aborted, then the event and the stream.
  ~Impl() {
    if (comm != nullptr && !aborted) {
      // A non-blocking communicator finalizes asynchronously: wait (bounded) for it to
      // finish before destroying it; abort it if it does not.
      (void)ncclCommFinalize(comm);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      ncclResult_t state = ncclInProgress;
      while (Clock::now() < deadline && ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (state == ncclSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    }
    if (produced != nullptr) (void)cudaEventDestroy(produced);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }

  [[noreturn]] void fail(const std::string& why) {
    if (comm != nullptr && !aborted) {
      (void)ncclCommAbort(comm);
      aborted = true;
    }
    throw group::LocalGroupError("NCCL local group of " + group.describe(group.rank()) + ": " + why);
  }

  // NCCL's stream waits, on the device, for what `producer` has queued so far.
  void after(void* producer) {
    const cudaStream_t p = producer != nullptr ? static_cast<cudaStream_t>(producer) : cudaStreamLegacy;
    check_cuda(cudaEventRecord(produced, p), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream, produced, 0), "cudaStreamWaitEvent");
  }

  // Waits until the communicator's pending work (or its initialisation) is done: polls
  // NCCL's asynchronous error, the stream, the group's sockets and the clock.
  void wait(const char* op, bool on_stream) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) fail(std::string(op) + ": ncclCommGetAsyncError failed");
      if (async != ncclSuccess && async != ncclInProgress) fail(std::string(op) + ": " + ncclGetErrorString(async));
      bool done = async == ncclSuccess;
      if (done && on_stream) {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q != cudaSuccess && q != cudaErrorNotReady) fail(std::string(op) + ": " + cudaGetErrorString(q));
        done = q == cudaSuccess;
      }
      if (done) return;
      if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
        (void)ncclCommAbort(comm);  // the others see this member end
        aborted = true;
        throw ps::StopRequested("the worker was asked to stop");
      }
      if (const auto why = group.peer_failure(); !why.empty()) fail(std::string(op) + ": " + why);
      if (Clock::now() >= deadline) {
        fail(std::string(op) + " did not complete within " + std::to_string(timeout.count() / 1000) +
             " s (a member stalled)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void call(ncclResult_t r, const char* op) {
    if (r != ncclSuccess && r != ncclInProgress) fail(std::string(op) + ": " + ncclGetErrorString(r));
  }
};

NcclGroup::NcclGroup(group::LocalGroup& group, int device, std::chrono::milliseconds timeout,
                     const std::atomic<bool>* stop_requested)
    : impl_(std::make_unique<Impl>(group, timeout, stop_requested)) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&impl_->produced, cudaEventDisableTiming), "cudaEventCreate");
  ncclUniqueId id{};
  if (group.rank() == 0) impl_->call(ncclGetUniqueId(&id), "ncclGetUniqueId");
  group.broadcast_bytes(std::as_writable_bytes(std::span(&id, 1)));  // over the group's socket
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a member's end is seen while the others wait
  impl_->call(ncclCommInitRankConfig(&impl_->comm, group.size(), id, group.rank(), &config), "ncclCommInitRankConfig");
  impl_->wait("ncclCommInitRankConfig", false);
}

NcclGroup::~NcclGroup() = default;  // Impl releases the communicator, the event and the stream

void NcclGroup::allreduce_sum(float* data, std::size_t n, void* producer) {
  impl_->after(producer);
  impl_->call(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
  impl_->wait("ncclAllReduce", true);
}

void NcclGroup::broadcast(float* data, std::size_t n, void* producer) {
  impl_->after(producer);
  impl_->call(ncclBroadcast(data, data, n, ncclFloat32, 0, impl_->comm, impl_->stream), "ncclBroadcast");
  impl_->wait("ncclBroadcast", true);
}

}  // namespace dltrain::gpu
