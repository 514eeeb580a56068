// The one place where the worker's backends are chosen (train/backends.h): the CPU forms
// here, the GPU forms in gpu_backends.cpp, which is built only with CUDA.
#include "train/backends.h"

#include "dltrain/config.h"
#if DLTRAIN_WITH_CUDA
#include "train/gpu_backends.h"
#endif

namespace dltrain::train::detail {
namespace {

// The group's sum and broadcast over its Unix sockets, on host floats (member 0 sums in
// rank order: group/local_group.h).
class SocketReduction final : public GroupReduction {
 public:
  explicit SocketReduction(group::LocalGroup& group) : group_(group) {}
  void sum_gradients(StepGradient g) override {
    if (!g.ok) {
      std::fill(g.grads.begin(), g.grads.end(), 0.0f);
    } else if (g.weight_decay > 0) {
      for (std::size_t i = 0; i < g.grads.size(); ++i) g.grads[i] += g.weight_decay * g.params[i];
    }
    group_.allreduce_sum(g.grads);
  }
  void broadcast_params(std::vector<float>& params) override { group_.broadcast(params); }

 private:
  group::LocalGroup& group_;
};

}  // namespace

std::unique_ptr<GroupReduction> make_group_reduction(group::LocalGroup& group, const torch::Device& device,
                                                     std::chrono::milliseconds timeout,
                                                     const std::atomic<bool>* stop_requested) {
#if DLTRAIN_WITH_CUDA
  // GPU workers reduce on their GPUs with NCCL, formed through the group's socket.
  if (device.is_cuda() && group.size() > 1) return make_nccl_reduction(group, device, timeout, stop_requested);
#else
  (void)device, (void)timeout, (void)stop_requested;
#endif
  return std::make_unique<SocketReduction>(group);
}

std::unique_ptr<DeviceEncoder> make_device_encoder(const compress::CompressionSpec& spec,
                                                   const ps::PartitionLayout& layout, std::uint64_t seed,
                                                   const torch::Device& device, bool overlap, bool in_local_group) {
#if DLTRAIN_WITH_CUDA
  // Not with overlap (partition pushes from the backward hooks) nor in a local group
  // (member 0 pushes the group's sum).
  if (device.is_cuda() && !overlap && !in_local_group && gpu_encoder_handles(spec)) {
    return make_gpu_device_encoder(spec, layout, seed);
  }
#else
  (void)spec, (void)layout, (void)seed, (void)device, (void)overlap, (void)in_local_group;
#endif
  return nullptr;
}

}  // namespace dltrain::train::detail
