// One training step of the main job's CNN on LibTorch's CUDA device against the same
// step on the CPU (same seed, same batch): the loss before and after an SGD step agrees to
// 1e-4. TF32 is turned off for the comparison: on Ampere and Hopper cuDNN may run the
// convolutions in TF32 (10-bit mantissa, relative error ~1e-3 per product), which is
// LibTorch's default for convolutions and would make the bound a property of the GPU,
// not of the step. Built only against a CUDA-enabled LibTorch; skipped, saying "no CUDA
// device", where there is none.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "train/models.h"

using namespace dltrain;

namespace {

// The loss on (x, y), then one plain SGD step (lr 0.1), then the loss again.
std::pair<double, double> step(const torch::Device& device, const torch::Tensor& x, const torch::Tensor& y) {
  torch::manual_seed(1);
  auto model = train::to_device(train::make_model(ModelKind::kCnn, 1, 10, 28), device);
  model.module->train(true);
  auto loss = torch::nn::functional::cross_entropy(model.forward(x), y);
  const double before = loss.item<double>();
  loss.backward();
  {
    torch::NoGradGuard ng;
    for (auto& p : model.module->parameters()) p.sub_(0.1 * p.grad());
  }
  const double after = torch::nn::functional::cross_entropy(model.forward(x), y).item<double>();
  return {before, after};
}

}  // namespace

TEST(CudaStep, TheSmallCnnsLossOnTheGpuMatchesTheCpuStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (torch::cuda::is_available() is false)";
  // Full FP32 on the GPU, as on the CPU (restored after the test).
  auto& ctx = at::globalContext();
  const bool cudnn_tf32 = ctx.allowTF32CuDNN(), cublas_tf32 = ctx.allowTF32CuBLAS();
  ctx.setAllowTF32CuDNN(false);
  ctx.setAllowTF32CuBLAS(false);
  torch::manual_seed(7);
  const auto x = torch::randn({64, 1, 28, 28});
  const auto y = torch::randint(0, 10, {64}, torch::kInt64);
  const auto cpu = step(torch::Device(torch::kCPU), x, y);
  const auto gpu = step(train::training_device(Device::kCuda), x.pin_memory(), y);
  EXPECT_NEAR(gpu.first, cpu.first, 1e-4);
  EXPECT_NEAR(gpu.second, cpu.second, 1e-4);
  EXPECT_LT(cpu.second, cpu.first);  // the step lowered the loss: it was a real step
  ctx.setAllowTF32CuDNN(cudnn_tf32);
  ctx.setAllowTF32CuBLAS(cublas_tf32);
}
