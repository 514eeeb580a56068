// The GPU forms of the worker's backends (train/gpu_backends.h): NCCL reduction and the
// device push encoder. Built only with CUDA; the only file of lib/train that includes
// lib/gpu.
#include "train/gpu_backends.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dltrain/config.h"
#include "gpu/device_push_encoder.h"
#include "gpu/nccl_group.h"
#if DLTRAIN_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace dltrain::train::detail {
namespace {

// The CUDA stream LibTorch queues this thread's kernels on (what wrote a gradient), for
// NCCL to wait for; null (the legacy default stream) against a LibTorch without CUDA,
// where no CUDA worker runs.
void* torch_stream(const torch::Device& device) {
#if DLTRAIN_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : 0).stream();
#else
  (void)device;
  return nullptr;
#endif
}

// The members' flat gradient on the device: each tensor's gradient (zeros without one,
// or for a skipped step) plus wd·θ, concatenated in parameters() order.
torch::Tensor flat_device_gradient(std::vector<torch::Tensor>& tensors, bool ok, float weight_decay) {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> parts;
  parts.reserve(tensors.size());
  for (auto& p : tensors) {
    torch::Tensor g = ok && p.grad().defined() ? p.grad() : torch::zeros_like(p);
    if (ok && weight_decay > 0) g = g + weight_decay * p;
    parts.push_back(g.reshape({-1}));
  }
  return torch::cat(parts).contiguous();
}

// group_step's sum with NCCL (GPU workers): the gradients are summed on the GPUs and
// member 0 copies the sum to the host for its push; the parameters it pulled go to the
// others by ncclBroadcast from its GPU (and to their hosts, for the replica they save
// when stopped). Every member has also copied its own gradient to the host in
// compute_gradient, for the NaN/Inf check.
class NcclReduction final : public GroupReduction {
 public:
  NcclReduction(group::LocalGroup& group, const torch::Device& device, std::chrono::milliseconds timeout,
                const std::atomic<bool>* stop)
      : group_(group), device_(device), nccl_(group, device.has_index() ? device.index() : 0, timeout, stop) {}

  void sum_gradients(StepGradient g) override {
    torch::Tensor flat = flat_device_gradient(g.tensors, g.ok, g.weight_decay);
    nccl_.allreduce_sum(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()), torch_stream(device_));
    if (group_.pushes()) {
      const auto host = flat.to(torch::kCPU);
      std::memcpy(g.grads.data(), host.data_ptr<float>(), sizeof(float) * g.grads.size());
    }
  }

  void broadcast_params(std::vector<float>& params) override {
    const auto n = static_cast<std::int64_t>(params.size());
    torch::Tensor shared =
        group_.pushes() ? torch::from_blob(params.data(), {n}, torch::kFloat32).to(device_)
                        : torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    nccl_.broadcast(shared.data_ptr<float>(), params.size(), torch_stream(device_));
    if (!group_.pushes()) {
      const auto host = shared.to(torch::kCPU);
      std::memcpy(params.data(), host.data_ptr<float>(), sizeof(float) * params.size());
    }
  }

 private:
  group::LocalGroup& group_;
  torch::Device device_;
  gpu::NcclGroup nccl_;
};

// A GPU worker selects its pushes on the GPU (top-k, DGC: gpu/device_push_encoder.h):
// only the selected pairs come to the host.
class GpuEncoder final : public DeviceEncoder {
 public:
  GpuEncoder(const compress::CompressionSpec& spec, const ps::PartitionLayout& layout, std::uint64_t seed)
      : encoder_(spec, layout, seed) {}

  bool gather(std::vector<torch::Tensor>& tensors, float weight_decay) override {
    grad_ = flat_device_gradient(tensors, true, weight_decay);
    return torch::isfinite(grad_).all().item<bool>();
  }

  std::span<const ps::PartitionPush> encode(double density, std::uint64_t step, double clip_limit) override {
    // Local gradient clipping (DGC §3.4) of the device gradient: GradientCompressor::clip's
    // rule, with the norm summed in float on the device (in double on the host).
    if (clip_limit > 0) {
      const double norm = grad_.norm().item<double>();
      if (norm > clip_limit) grad_.mul_(clip_limit / norm);
    }
    return encoder_.encode(grad_.data_ptr<float>(), density, step);
  }

 private:
  gpu::DevicePushEncoder encoder_;
  torch::Tensor grad_;  // the flat gradient on the GPU: the encoder's input
};

}  // namespace

std::unique_ptr<GroupReduction> make_nccl_reduction(group::LocalGroup& group, const torch::Device& device,
                                                    std::chrono::milliseconds timeout,
                                                    const std::atomic<bool>* stop_requested) {
  return std::make_unique<NcclReduction>(group, device, timeout, stop_requested);
}

bool gpu_encoder_handles(const compress::CompressionSpec& spec) { return gpu::DevicePushEncoder::handles(spec); }

std::unique_ptr<DeviceEncoder> make_gpu_device_encoder(const compress::CompressionSpec& spec,
                                                       const ps::PartitionLayout& layout, std::uint64_t seed) {
  return std::make_unique<GpuEncoder>(spec, layout, seed);
}

}  // namespace dltrain::train::detail
