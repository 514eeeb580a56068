// The worker's copy of the model as the parts of its step share it (internal to
// lib/train): the model's parameters and gradient as flat float vectors, the partitions
// the PS shards hold, the step count. WorkerLoop owns one; PsExchange (ps_exchange.h)
// pulls into it, LocalGroupStep (group_step.h) sums and broadcasts through it.
// Not thread-safe: the training thread owns it. PsExchange's overlapped push reads a
// partition of `grads` on a thread of its own while backward writes the others; its
// pipelined pull writes a target of its own, not `params`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "ps/partition.h"

namespace dltrain::train::detail {

using Clock = std::chrono::steady_clock;

/// Seconds from `t0` to now on the steady clock.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Now, in seconds since the Unix epoch.
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Copies the model's parameters into / out of one flat float vector, in parameters() order.
class FlatParams {
 public:
  explicit FlatParams(torch::nn::Module& m) : params_(m.parameters()) {
    for (const auto& p : params_) {
      sizes_.push_back(p.numel());
      rows_.push_back(p.dim() >= 2 ? p.size(0) : 1);
    }
  }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  /// Each tensor's first dimension (1 for a vector): the rows of its matrix view.
  const std::vector<std::int64_t>& rows() const { return rows_; }
  std::vector<torch::Tensor>& tensors() { return params_; }
  void read_params(std::vector<float>& out) const { gather(out, false); }
  void read_grads(std::vector<float>& out) const { gather(out, true); }
  void write_params(const std::vector<float>& in) {
    torch::NoGradGuard ng;
    std::int64_t off = 0;
    for (auto& p : params_) {
      if (p.is_cuda()) {
        // The host floats to the parameter's device (one copy per tensor).
        p.copy_(torch::from_blob(const_cast<float*>(in.data() + off), p.sizes(), torch::kFloat32));
      } else {
        std::memcpy(p.data_ptr<float>(), in.data() + off, sizeof(float) * p.numel());
      }
      off += p.numel();
    }
  }

 private:
  void gather(std::vector<float>& out, bool grad) const {
    std::int64_t off = 0;
    for (const auto& p : params_) {
      const auto t = grad ? p.grad() : p;
      if (grad && !t.defined()) {
        std::fill(out.begin() + off, out.begin() + off + p.numel(), 0.0f);
      } else {
        auto c = t.to(torch::kCPU).contiguous();  // a device tensor is copied to the host
        std::memcpy(out.data() + off, c.data_ptr<float>(), sizeof(float) * p.numel());
      }
      off += p.numel();
    }
  }
  std::vector<torch::Tensor> params_;
  std::vector<std::int64_t> sizes_, rows_;
};

/// The model as the step's parts share it. `params` and `grads` have layout.total_floats
/// floats each, in the model's parameters() order: `params` what the shards last sent
/// (the base of a sparse pull: the worker's replica), `grads` the step's gradient.
struct ModelReplica {
  std::unique_ptr<FlatParams> flat;  ///< the model's tensors behind the flat vectors
  ps::PartitionLayout layout;        ///< the partitions the PS shards hold
  std::vector<float> params, grads;
  std::int64_t global_step = 0;  ///< steps this worker finished, over all epochs
  double pulled_at = 0;          ///< when params last took the PS's values (Unix time, s)

  /// The pulled parameters into the model.
  void write_model() { flat->write_params(params); }
};

}  // namespace dltrain::train::detail
