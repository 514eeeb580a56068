// Image-classification models for 28×28 single-channel inputs (LibTorch).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace dltrain::train {

/// Small CNN: three 3×3 conv blocks (16, 32, 64 channels; BatchNorm, ReLU, 2×2 max-pool)
/// then 576→64→10 fully connected; 61,450 trainable parameters. Input [N, 1, 28, 28]
/// normalised, output logits [N, 10].
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr};
  torch::nn::BatchNorm2d b1{nullptr}, b2{nullptr}, b3{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
};
TORCH_MODULE(SmallCnn);

/// MLP 784→h1→h2→10 with ReLU. Input [N, 1, 28, 28] (flattened inside), output logits
/// [N, 10]. "mlp" is 784→256→128→10 (235,146 trainable parameters); "mlp-large" is
/// 784→768→128→10 (702,602), a model whose dense exchange dominates a step on 100 Mbit/s.
struct MlpImpl : torch::nn::Module {
  MlpImpl(std::int64_t h1, std::int64_t h2);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(Mlp);

/// A model behind one interface: forward and the module for parameters().
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};

/// Builds "cnn", "mlp" or "mlp-large", initialised from torch's global generator (seed it first with
/// torch::manual_seed for identical replicas). Throws ConfigError("model", ...) for
/// another name.
Model make_model(const std::string& name);

/// Trainable parameters of `m` (sum of numel over parameters()).
std::int64_t parameter_count(const torch::nn::Module& m);

}  // namespace dltrain::train
