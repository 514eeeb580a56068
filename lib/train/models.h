// Image-classification models (LibTorch). Input [N, channels, image_size, image_size]
// standardised, output logits [N, classes]; channels, classes and image_size come from the
// job's data set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "job/job_spec.h"

namespace dltrain::train {

/// Small CNN: three 3×3 conv blocks (16, 32, 64 channels; BatchNorm, ReLU, 2×2 max-pool)
/// then 64·⌊s/8⌋²→64→classes fully connected; 61,450 trainable parameters for
/// [N, 1, 28, 28] and 10 classes. Requires image_size >= 8.
struct SmallCnnImpl : torch::nn::Module {
  explicit SmallCnnImpl(std::int64_t channels = 1, std::int64_t classes = 10, std::int64_t image_size = 28);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr};
  torch::nn::BatchNorm2d b1{nullptr}, b2{nullptr}, b3{nullptr};
  torch::nn::Linear f1{nullptr}, f2{nullptr};
};
TORCH_MODULE(SmallCnn);

/// MLP in→h1→h2→classes with ReLU, in = channels·image_size² (flattened inside). For
/// [N, 1, 28, 28] and 10 classes "mlp" is 784→256→128→10 (235,146 trainable parameters)
/// and "mlp-large" 784→768→128→10 (702,602), a model whose dense exchange dominates a
/// step on 100 Mbit/s.
struct MlpImpl : torch::nn::Module {
  MlpImpl(std::int64_t in, std::int64_t h1, std::int64_t h2, std::int64_t classes = 10);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(Mlp);

/// The basic residual block of He et al. 2016 ("Deep Residual Learning for Image
/// Recognition", Fig. 2 left): two 3×3 conv + BatchNorm, ReLU, identity shortcut. Where
/// the shape changes (stride 2 or more channels) the shortcut is option A of §4.2
/// ("zero-padding shortcuts … all shortcuts are parameter-free": subsample by the
/// stride, pad the new channels with zeros) when `projection` is false, or option B
/// (1×1 conv + BatchNorm, torchvision's `downsample`) when true.
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride, bool projection);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::BatchNorm2d b1{nullptr}, b2{nullptr};
  torch::nn::Sequential downsample{nullptr};  ///< option B only
  std::int64_t in_ = 0, out_ = 0, stride_ = 1;
};
TORCH_MODULE(BasicBlock);

/// The CIFAR ResNet of He et al. 2016, §4.2, with depth 6n + 2: a 3×3 conv (16), three
/// stages of n basic blocks (16, 32, 64 filters, feature maps 32, 16, 8 for a 32×32
/// input), global average pooling, a fully connected layer; option A shortcuts.
/// n = 3 is "resnet20": 269,722 trainable parameters for 3 channels and 10 classes
/// (Table 6: 0.27M). Works for any image_size >= 8 (the pooling is global).
struct CifarResNetImpl : torch::nn::Module {
  CifarResNetImpl(int n, std::int64_t channels, std::int64_t classes);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d stem{nullptr};
  torch::nn::BatchNorm2d stem_bn{nullptr};
  torch::nn::Sequential stages{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(CifarResNet);

/// ResNet-18 in torchvision's layout (torchvision.models.resnet18; He et al. 2016,
/// Table 1): 7×7/2 conv (64), 3×3/2 max-pool, four stages of two basic blocks (64, 128,
/// 256, 512; option B shortcuts), adaptive average pooling, fully connected.
/// 11,689,512 trainable parameters for 3 channels and 1,000 classes (torchvision's
/// published figure); for 10 classes 11,181,642. Meant for images of 64 pixels and more.
struct ResNet18Impl : torch::nn::Module {
  ResNet18Impl(std::int64_t channels, std::int64_t classes);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d stem{nullptr};
  torch::nn::BatchNorm2d stem_bn{nullptr};
  torch::nn::Sequential stages{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

/// A model behind one interface: forward and the module for parameters().
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
  std::string name;  ///< make_model's name, or "torchscript"
};

/// The name a state_dict.pt gives tensor `key` of built-in model `model` (save_model_files,
/// init_from_state_dict, and dltrain-model's loader): resnet18's are torchvision's
/// (`stem.weight` → `conv1.weight`, `stem_bn.*` → `bn1.*`, `stages.K.c1.*` →
/// `layerS.B.conv1.*` with S = K/2 + 1, B = K mod 2, `b1` → `bn1`, `c2` → `conv2`, `b2` →
/// `bn2`; `downsample.*` and `fc.*` as they are), so that the file loads into
/// torchvision.models.resnet18; every other model's are its modules' own
/// (python/dltrain/networks.py defines them in PyTorch with the same names).
std::string exported_name(const std::string& model, const std::string& key);

/// Builds cnn, mlp, mlp-large, resnet20 or resnet18 for inputs
/// [N, channels, image_size, image_size] and `classes` outputs, initialised from torch's
/// global generator (seed it first with torch::manual_seed for identical replicas); the
/// Model's name is the kind's job-file name. Throws ConfigError("model", ...) for
/// kTorchScript (loaded from its file, load_torchscript_model), ConfigError("image_size",
/// …) when the CNN's input is smaller than 8 pixels.
Model make_model(ModelKind kind, std::int64_t channels = 1, std::int64_t classes = 10, std::int64_t image_size = 28);

/// A user's TorchScript model (model = "torchscript"): the archive at `path`, written by
/// torch.jit.save from torch.jit.script or torch.jit.trace, loaded with torch::jit::load
/// onto the CPU. Its parameters that require grad are the trained ones (registered on the
/// returned module, sharing storage with the script module's, so that the PS exchange and
/// the optimizer reach them exactly as a built-in model's); its buffers are registered
/// as buffers; train()/eval() reach the script module. Forward takes [N, channels,
/// image_size, image_size] and must return [N, classes].
/// Checked here, each failure a ConfigError("model_file", …) naming `path`: not readable
/// or not a TorchScript archive (LibTorch's reason); written by a newer PyTorch than this
/// LibTorch reads (both file-format versions); no parameter that requires grad; a
/// parameter that is not float32; a forward that throws on a [2, channels, image_size,
/// image_size] batch (the shape and the model's error); an output that is not [2, classes]
/// (both shapes). Initial values are the file's (every worker loads the same file).
/// `name` is what messages call the file ("" = `path`): the user's model_file when `path`
/// is the copy its agent fetched.
Model load_torchscript_model(const std::string& path, std::int64_t channels, std::int64_t classes,
                             std::int64_t image_size, const std::string& name = "");

/// The trained model as files in `dir` (created): `state_dict.pt`, the parameters and
/// buffers by name as torch.save writes a dict (torch::pickle_save; `torch.load` opens it,
/// and for a TorchScript model the names are the Python module's, so `load_state_dict`
/// takes it); for a TorchScript model also `model.pt`, the script module with these values
/// (torch.jit.load runs it as is, in PyTorch or LibTorch). Tensors are copied to the CPU.
/// Returns the files written. Throws IoError naming the file that could not be written.
std::vector<std::string> save_model_files(const Model& model, const std::string& dir);

/// "[2, 1, 28, 28]": `t`'s shape, for messages.
std::string shape_string(const torch::Tensor& t);

/// `model`'s parameters, then its buffers, each under the name its state_dict.pt gives it
/// (a TorchScript model's Python names; a built-in's exported_name), sharing storage with
/// the model's own tensors.
std::vector<std::pair<std::string, torch::Tensor>> named_tensors(const Model& model);

/// The dict of tensors in the state_dict.pt at `path` (torch::pickle_load). Throws
/// ConfigError(field, "NAME: …") when it cannot be read or is not a dict.
c10::Dict<c10::IValue, c10::IValue> read_state_dict(const std::string& path, const std::string& field,
                                                    const std::string& name);

/// Starts `model` from a trained model's state_dict.pt at `path` (init_from, fine-tuning):
/// each parameter and buffer whose name (as save_model_files writes them) and shape match
/// takes the file's values; one whose shape differs (the classifier of a data set with
/// another class count) or that the file lacks keeps its fresh initial values. Returns
/// what happened, for the log: "12 of 14 tensors from NAME; new: fc.weight [5, 512] (the
/// file's [10, 512]), fc.bias [5] (the file's [10])". Throws ConfigError("init_from", …)
/// naming `name` when the file is not a state_dict torch::pickle_load reads, or when no
/// tensor matches (another network).
std::string init_from_state_dict(const Model& model, const std::string& path, const std::string& name);

/// `model` moved to `device` (its parameters and buffers), its forward wrapped so that it
/// still takes and returns CPU tensors: the input [N, C, S, S] is copied to the device
/// (asynchronously when it is in pinned memory), the output [N, classes] copied back
/// (a few hundred bytes per batch; autograd runs through both copies). For the CPU device
/// it returns `model` unchanged.
Model to_device(Model model, const torch::Device& device);

/// The device a worker of `device` trains on: the CPU, or the first GPU
/// it sees (the agent gives it only its own through CUDA_VISIBLE_DEVICES). Throws
/// ConfigError("device", …) saying which is missing: a LibTorch built without CUDA, or no
/// CUDA device visible (with CUDA_VISIBLE_DEVICES' value). Never falls back to the CPU.
torch::Device training_device(Device device);

/// Trainable parameters of `m` (sum of numel over parameters()).
std::int64_t parameter_count(const torch::nn::Module& m);

}  // namespace dltrain::train
