#include "train/models.h"

#include "common/errors.h"

namespace dltrain::train {

namespace nn = torch::nn;

SmallCnnImpl::SmallCnnImpl() {
  c1 = register_module("c1", nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)));
  b1 = register_module("b1", nn::BatchNorm2d(16));
  c2 = register_module("c2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)));
  b2 = register_module("b2", nn::BatchNorm2d(32));
  c3 = register_module("c3", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)));
  b3 = register_module("b3", nn::BatchNorm2d(64));
  f1 = register_module("f1", nn::Linear(576, 64));
  f2 = register_module("f2", nn::Linear(64, 10));
}

torch::Tensor SmallCnnImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(b1(c1(x))), 2);  // 14x14
  x = torch::max_pool2d(torch::relu(b2(c2(x))), 2);  // 7x7
  x = torch::max_pool2d(torch::relu(b3(c3(x))), 2);  // 3x3
  x = torch::relu(f1(x.flatten(1)));
  return f2(x);
}

MlpImpl::MlpImpl(std::int64_t h1, std::int64_t h2) {
  l1 = register_module("l1", nn::Linear(784, h1));
  l2 = register_module("l2", nn::Linear(h1, h2));
  l3 = register_module("l3", nn::Linear(h2, 10));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(l1(x.flatten(1)));
  x = torch::relu(l2(x));
  return l3(x);
}

Model make_model(const std::string& name) {
  if (name == "cnn") {
    SmallCnn m;
    return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(std::move(x)); }};
  }
  if (name == "mlp" || name == "mlp-large") {
    Mlp m = name == "mlp" ? Mlp(256, 128) : Mlp(768, 128);
    return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(std::move(x)); }};
  }
  throw ConfigError("model", "expected cnn, mlp or mlp-large, got \"" + name + "\"");
}

std::int64_t parameter_count(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace dltrain::train
