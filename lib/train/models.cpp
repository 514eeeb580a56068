#include "train/models.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <torch/script.h>
#include <torch/version.h>

#include "common/errors.h"

namespace dltrain::train {

namespace nn = torch::nn;

SmallCnnImpl::SmallCnnImpl(std::int64_t channels, std::int64_t classes, std::int64_t image_size) {
  const std::int64_t side = image_size / 2 / 2 / 2;  // after three 2×2 max-pools (floor)
  c1 = register_module("c1", nn::Conv2d(nn::Conv2dOptions(channels, 16, 3).padding(1).bias(false)));
  b1 = register_module("b1", nn::BatchNorm2d(16));
  c2 = register_module("c2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)));
  b2 = register_module("b2", nn::BatchNorm2d(32));
  c3 = register_module("c3", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)));
  b3 = register_module("b3", nn::BatchNorm2d(64));
  f1 = register_module("f1", nn::Linear(64 * side * side, 64));
  f2 = register_module("f2", nn::Linear(64, classes));
}

torch::Tensor SmallCnnImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(b1(c1(x))), 2);  // 14x14
  x = torch::max_pool2d(torch::relu(b2(c2(x))), 2);  // 7x7
  x = torch::max_pool2d(torch::relu(b3(c3(x))), 2);  // 3x3
  x = torch::relu(f1(x.flatten(1)));
  return f2(x);
}

MlpImpl::MlpImpl(std::int64_t in, std::int64_t h1, std::int64_t h2, std::int64_t classes) {
  l1 = register_module("l1", nn::Linear(in, h1));
  l2 = register_module("l2", nn::Linear(h1, h2));
  l3 = register_module("l3", nn::Linear(h2, classes));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(l1(x.flatten(1)));
  x = torch::relu(l2(x));
  return l3(x);
}

namespace {

nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

// He et al. 2015 ("Delving Deep into Rectifiers", §2.2) initialisation of every
// convolution (fan_out, as torchvision's ResNets), BatchNorm γ = 1, β = 0.
void init_resnet(nn::Module& m) {
  for (auto& mod : m.modules(false)) {
    if (auto* c = mod->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = mod->as<nn::BatchNorm2d>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    }
  }
}

// Stages of `blocks` basic blocks each, of the given widths; the first block of every
// stage but the first halves the feature map (stride 2). Input channels: widths[0].
nn::Sequential residual_stages(std::initializer_list<std::int64_t> widths, int blocks, bool projection) {
  nn::Sequential seq;
  std::int64_t in = *widths.begin();
  for (const std::int64_t width : widths) {
    for (int i = 0; i < blocks; ++i) {
      const std::int64_t stride = (i == 0 && width != *widths.begin()) ? 2 : 1;
      seq->push_back(BasicBlock(in, width, stride, projection));
      in = width;
    }
  }
  return seq;
}

template <typename M>
Model wrap(M m, std::string name) {
  return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(std::move(x)); }, std::move(name)};
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride, bool projection)
    : in_(in), out_(out), stride_(stride) {
  c1 = register_module("c1", conv3x3(in, out, stride));
  b1 = register_module("b1", nn::BatchNorm2d(out));
  c2 = register_module("c2", conv3x3(out, out, 1));
  b2 = register_module("b2", nn::BatchNorm2d(out));
  if (projection && (stride != 1 || in != out)) {
    downsample = register_module(
        "downsample", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                     nn::BatchNorm2d(out)));
  }
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  auto y = b2(c2(torch::relu(b1(c1(x)))));
  torch::Tensor shortcut = x;
  if (downsample) {
    shortcut = downsample->forward(x);
  } else if (stride_ != 1 || in_ != out_) {
    // Option A: x[:, :, ::stride, ::stride], zero channels appended.
    using torch::indexing::None;
    using torch::indexing::Slice;
    shortcut = x.index({Slice(), Slice(), Slice(None, None, stride_), Slice(None, None, stride_)});
    shortcut = torch::constant_pad_nd(shortcut, {0, 0, 0, 0, 0, out_ - in_});
  }
  return torch::relu(y + shortcut);
}

CifarResNetImpl::CifarResNetImpl(int n, std::int64_t channels, std::int64_t classes) {
  stem = register_module("stem", conv3x3(channels, 16, 1));
  stem_bn = register_module("stem_bn", nn::BatchNorm2d(16));
  stages = register_module("stages", residual_stages({16, 32, 64}, n, false));
  fc = register_module("fc", nn::Linear(64, classes));
  init_resnet(*this);
}

torch::Tensor CifarResNetImpl::forward(torch::Tensor x) {
  x = stages->forward(torch::relu(stem_bn(stem(x))));
  return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
}

ResNet18Impl::ResNet18Impl(std::int64_t channels, std::int64_t classes) {
  stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(channels, 64, 7).stride(2).padding(3).bias(false)));
  stem_bn = register_module("stem_bn", nn::BatchNorm2d(64));
  stages = register_module("stages", residual_stages({64, 128, 256, 512}, 2, true));
  fc = register_module("fc", nn::Linear(512, classes));
  init_resnet(*this);
}

torch::Tensor ResNet18Impl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(stem_bn(stem(x))), 3, 2, 1);
  x = stages->forward(x);
  return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
}

std::string exported_name(const std::string& model, const std::string& key) {
  if (model != "resnet18") return key;
  const auto starts = [&](const std::string& p) { return key.rfind(p, 0) == 0; };
  if (starts("stem.")) return "conv1." + key.substr(5);
  if (starts("stem_bn.")) return "bn1." + key.substr(8);
  if (!starts("stages.")) return key;
  const auto dot = key.find('.', 7);
  if (dot == std::string::npos) return key;
  const int k = std::stoi(key.substr(7, dot - 7));
  std::string rest = key.substr(dot + 1);
  for (const auto& [from, to] : {std::pair{"c1.", "conv1."}, {"b1.", "bn1."}, {"c2.", "conv2."}, {"b2.", "bn2."}}) {
    if (rest.rfind(from, 0) == 0) {
      rest = to + rest.substr(3);
      break;
    }
  }
  return "layer" + std::to_string(k / 2 + 1) + "." + std::to_string(k % 2) + "." + rest;
}

Model make_model(ModelKind kind, std::int64_t channels, std::int64_t classes, std::int64_t image_size) {
  const std::string name(enum_name(kind));
  switch (kind) {
    case ModelKind::kCnn:
      if (image_size < 8) {
        throw ConfigError("image_size", "the cnn model needs at least 8 pixels, got " + std::to_string(image_size));
      }
      return wrap(SmallCnn(channels, classes, image_size), name);
    case ModelKind::kMlp:
      return wrap(Mlp(channels * image_size * image_size, 256, 128, classes), name);
    case ModelKind::kMlpLarge:
      return wrap(Mlp(channels * image_size * image_size, 768, 128, classes), name);
    case ModelKind::kResnet20:
      return wrap(CifarResNet(3, channels, classes), name);
    case ModelKind::kResnet18:
      return wrap(ResNet18(channels, classes), name);
    case ModelKind::kTorchScript:
      break;
  }
  throw ConfigError("model", "a torchscript model is loaded from its file (load_torchscript_model), not built");
}

namespace {

/// A script module behind torch::nn::Module (see load_torchscript_model).
struct ScriptedModelImpl : torch::nn::Module {
  explicit ScriptedModelImpl(torch::jit::Module m) : script(std::move(m)) {
    int i = 0;
    for (const auto& p : script.named_parameters(/*recurse=*/true)) {
      // nn::Module names may not contain '.': a prefix keeps them unique and readable.
      const std::string name = "p" + std::to_string(i++) + "_" + dotless(p.name);
      if (p.value.requires_grad()) {
        register_parameter(name, p.value, /*requires_grad=*/true);
      } else {
        register_buffer(name, p.value);
      }
    }
    i = 0;
    for (const auto& b : script.named_buffers(/*recurse=*/true)) {
      register_buffer("b" + std::to_string(i++) + "_" + dotless(b.name), b.value);
    }
  }
  void train(bool on) override {
    torch::nn::Module::train(on);
    script.train(on);
  }
  torch::Tensor forward(torch::Tensor x) { return script.forward({std::move(x)}).toTensor(); }
  static std::string dotless(std::string s) {
    std::replace(s.begin(), s.end(), '.', '_');
    return s;
  }
  torch::jit::Module script;
};

/// The first line of a LibTorch error (its messages go on with a C++ backtrace).
std::string first_line(const std::string& what) {
  const auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}


}  // namespace

std::string shape_string(const torch::Tensor& t) {
  std::string out = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

std::vector<std::pair<std::string, torch::Tensor>> named_tensors(const Model& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (auto* scripted = dynamic_cast<ScriptedModelImpl*>(model.module.get())) {
    for (const auto& p : scripted->script.named_parameters(true)) out.emplace_back(p.name, p.value);
    for (const auto& b : scripted->script.named_buffers(true)) out.emplace_back(b.name, b.value);
  } else {
    for (const auto& p : model.module->named_parameters(true)) out.emplace_back(exported_name(model.name, p.key()), p.value());
    for (const auto& b : model.module->named_buffers(true)) out.emplace_back(exported_name(model.name, b.key()), b.value());
  }
  return out;
}

c10::Dict<c10::IValue, c10::IValue> read_state_dict(const std::string& path, const std::string& field,
                                                    const std::string& name) {
  const auto refuse = [&](const std::string& why) { throw ConfigError(field, name + ": " + why); };
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse("cannot read " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    refuse("not a state_dict that torch::pickle_load reads: " + first_line(e.what()));
  }
  if (!v.isGenericDict()) refuse("not a dict of tensors");
  return v.toGenericDict();
}

Model load_torchscript_model(const std::string& path, std::int64_t channels, std::int64_t classes,
                             std::int64_t image_size, const std::string& name) {
  const std::string shown = name.empty() ? path : name;
  const auto refuse = [&](const std::string& why) { throw ConfigError("model_file", "\"" + shown + "\": " + why); };
  const std::string libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  torch::jit::Module script;
  try {
    script = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    // caffe2's reader: "Attempted to read a PyTorch file with version N, but the maximum
    // supported version for reading is M. Your PyTorch installation may be too old."
    const auto v = what.find("Attempted to read a PyTorch file with version");
    if (v != std::string::npos) {
      refuse("written by a newer PyTorch than this LibTorch " + libtorch + " reads: " + first_line(what.substr(v)) +
             " (script and save the model with PyTorch " + libtorch + ", e.g. Debian 12's python3-torch)");
    }
    refuse("not a TorchScript archive that this LibTorch " + libtorch + " can load: " + first_line(what));
  } catch (const std::exception& e) {
    refuse(std::string("cannot be read: ") + e.what());
  }
  auto module = std::make_shared<ScriptedModelImpl>(std::move(script));
  std::int64_t trainable = 0;
  for (const auto& p : module->named_parameters()) {
    if (p.value().scalar_type() != torch::kFloat32) {
      refuse("parameter " + p.key() + " is " + std::string(c10::toString(p.value().scalar_type())) +
             "; dltrain trains float32 parameters (call .float() on the model before scripting it)");
    }
    trainable += p.value().numel();
  }
  if (trainable == 0) refuse("has no trainable parameters (none requires grad)");
  // One forward on a batch of the job's shape, in eval mode (BatchNorm's running
  // statistics stay as they are).
  const std::vector<std::int64_t> in_shape{2, channels, image_size, image_size};
  torch::Tensor out;
  {
    torch::NoGradGuard ng;
    module->train(false);
    try {
      out = module->forward(torch::zeros(in_shape));
    } catch (const std::exception& e) {
      refuse("forward fails on the job's input shape " + shape_string(torch::zeros(in_shape)) + ": " + first_line(e.what()));
    }
    module->train(true);
  }
  if (out.dim() != 2 || out.size(0) != 2 || out.size(1) != classes) {
    refuse("forward returns " + shape_string(out) + " for input " + shape_string(torch::zeros(in_shape)) + "; expected [2, " +
           std::to_string(classes) + "] (batch, classes: one logit per class of the data set)");
  }
  Model m;
  m.module = module;
  m.forward = [module](torch::Tensor x) { return module->forward(std::move(x)); };
  m.name = "torchscript";
  return m;
}

std::vector<std::string> save_model_files(const Model& model, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create " + dir + ": " + ec.message());
  std::vector<std::string> written;
  c10::Dict<std::string, torch::Tensor> state;
  auto* scripted = dynamic_cast<ScriptedModelImpl*>(model.module.get());
  torch::NoGradGuard ng;
  for (const auto& [key, t] : named_tensors(model)) state.insert(key, t.detach().cpu());
  const auto write = [&](const std::string& name, const std::vector<char>& bytes) {
    const std::string path = (fs::path(dir) / name).string();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out) throw IoError("cannot write " + tmp);
    }
    fs::rename(tmp, path, ec);
    if (ec) throw IoError("cannot rename " + tmp + " to " + path + ": " + ec.message());
    written.push_back(path);
  };
  write("state_dict.pt", torch::pickle_save(c10::IValue(state)));
  if (scripted != nullptr) {
    const std::string path = (fs::path(dir) / "model.pt").string();
    try {
      scripted->script.save(path + ".tmp");
    } catch (const c10::Error& e) {
      throw IoError("cannot write " + path + ": " + first_line(e.what()));
    }
    fs::rename(path + ".tmp", path, ec);
    if (ec) throw IoError("cannot rename " + path + ".tmp: " + ec.message());
    written.push_back(path);
  }
  return written;
}

std::string init_from_state_dict(const Model& model, const std::string& path, const std::string& name) {
  const auto state = read_state_dict(path, "init_from", name + "'s state_dict.pt");
  auto targets = named_tensors(model);
  torch::NoGradGuard ng;
  std::size_t taken = 0;
  std::string fresh;
  for (auto& [key, dst] : targets) {
    const auto it = state.find(c10::IValue(key));
    if (it == state.end() || !it->value().isTensor()) {
      fresh += (fresh.empty() ? "" : ", ") + key + " (not in the file)";
      continue;
    }
    const auto src = it->value().toTensor();
    if (src.sizes() != dst.sizes()) {
      fresh += (fresh.empty() ? "" : ", ") + key + " " + shape_string(dst) + " (the file's " + shape_string(src) + ")";
      continue;
    }
    dst.copy_(src.to(dst.dtype()));
    ++taken;
  }
  if (taken == 0) {
    throw ConfigError("init_from", name + ": none of its tensors fits this job's network (another model?)");
  }
  return std::to_string(taken) + " of " + std::to_string(targets.size()) + " tensors from " + name +
         (fresh.empty() ? "" : "; new: " + fresh);
}

Model to_device(Model model, const torch::Device& device) {
  if (device.is_cpu()) return model;
  model.module->to(device);
  auto forward = std::move(model.forward);
  model.forward = [forward, device](torch::Tensor x) {
    return forward(x.to(device, /*non_blocking=*/x.is_pinned())).to(torch::kCPU);
  };
  return model;
}

torch::Device training_device(Device device) {
  if (device == Device::kCpu) return torch::Device(torch::kCPU);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string seen = visible == nullptr ? "unset" : "\"" + std::string(visible) + "\"";
  if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
  // LibTorch's CUDA half is its own library: loaded when this worker was linked with a
  // CUDA-enabled LibTorch, absent from a CPU-only one (Debian's libtorch-dev).
  void* cuda_lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (cuda_lib == nullptr) {
    throw ConfigError("device", "device = \"cuda\", but this worker's LibTorch was built without CUDA (a CPU-only "
                                "LibTorch such as Debian's libtorch-dev; CUDA_VISIBLE_DEVICES=" + seen +
                                "): build dltrain against a CUDA-enabled LibTorch (docs/gpu.md), or set device = "
                                "\"cpu\"");
  }
  dlclose(cuda_lib);
  throw ConfigError("device", "device = \"cuda\", but no CUDA device is visible to this worker "
                              "(CUDA_VISIBLE_DEVICES=" + seen + "; the agent names the GPUs the leader gave it): is "
                              "the driver loaded and the GPU healthy (nvidia-smi)?");
}

std::int64_t parameter_count(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace dltrain::train
