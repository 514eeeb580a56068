#include "train/model_io.h"

#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "data/augment.h"
#include "data/image.h"

namespace dltrain::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

template <typename T>
T meta_field(const json& meta, const char* key, const std::string& file) {
  if (!meta.contains(key)) throw ConfigError("model", file + ": \"" + key + "\" is missing");
  try {
    return meta.at(key).get<T>();
  } catch (const json::exception& e) {
    throw ConfigError("model", file + ": \"" + key + "\": " + e.what());
  }
}

}  // namespace

void load_state_dict(const Model& m, const c10::Dict<c10::IValue, c10::IValue>& state, const std::string& source) {
  torch::NoGradGuard ng;
  for (auto& [name, dst] : named_tensors(m)) {
    const auto it = state.find(c10::IValue(name));
    if (it == state.end()) throw ConfigError("state_dict", source + " has no tensor \"" + name + "\"");
    if (!it->value().isTensor()) throw ConfigError("state_dict", source + ": \"" + name + "\" is not a tensor");
    const auto src = it->value().toTensor();
    if (src.sizes() != dst.sizes()) {
      throw ConfigError("state_dict", source + ": \"" + name + "\" is " + shape_string(src) + ", the model's is " +
                                          shape_string(dst));
    }
    dst.copy_(src);
  }
}

LoadedModel load_model_dir(const std::string& dir) {
  const std::string meta_path = (fs::path(dir) / "metadata.json").string();
  std::ifstream in(meta_path);
  if (!in) {
    throw ConfigError("model", meta_path + " does not exist: a model directory is what `dltrain model get JOB -o DIR` "
                               "writes (metadata.json, state_dict.pt, model.pt)");
  }
  LoadedModel m;
  try {
    m.meta = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError("model", meta_path + " is not JSON: " + e.what());
  }
  m.name = meta_field<std::string>(m.meta, "model", meta_path);
  m.classes = meta_field<std::int64_t>(m.meta, "classes", meta_path);
  m.channels = meta_field<std::int64_t>(m.meta, "channels", meta_path);
  m.image_size = meta_field<std::int64_t>(m.meta, "image_size", meta_path);
  m.mean = meta_field<std::vector<float>>(m.meta, "mean", meta_path);
  m.std = meta_field<std::vector<float>>(m.meta, "std", meta_path);
  if (m.mean.size() != static_cast<std::size_t>(m.channels) || m.std.size() != m.mean.size()) {
    throw ConfigError("model", meta_path + ": mean and std need one value per channel (" + std::to_string(m.channels) + ")");
  }
  m.class_names = m.meta.value("class_names", std::vector<std::string>{});
  m.class_names.resize(static_cast<std::size_t>(m.classes));
  // What the metadata says the model is decides which file is read (a model.pt left in
  // the directory by another model is not this one).
  if (m.name == "torchscript") {
    m.model = load_torchscript_model((fs::path(dir) / "model.pt").string(), m.channels, m.classes, m.image_size);
  } else {
    m.model = make_model(parse_enum<ModelKind>(m.name, meta_path + ": model"), m.channels, m.classes, m.image_size);
    const std::string sd = (fs::path(dir) / "state_dict.pt").string();
    load_state_dict(m.model, read_state_dict(sd, "model", sd), sd);
  }
  m.model.module->eval();
  return m;
}

torch::Tensor image_batch(const LoadedModel& m, const std::vector<std::string>& files, std::vector<std::size_t>& kept,
                          std::vector<std::string>& errors) {
  const auto c = m.channels, s = m.image_size;
  auto x = torch::empty({static_cast<std::int64_t>(files.size()), c, s, s});
  std::int64_t n = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      const auto bytes = data::read_file_bytes(files[i]);
      const auto img = data::test_transform(data::decode_image(bytes, static_cast<int>(c), files[i]), static_cast<int>(s));
      auto hwc = torch::from_blob(const_cast<std::uint8_t*>(img.pixels.data()), {s, s, c}, torch::kUInt8);
      auto chw = hwc.permute({2, 0, 1}).to(torch::kFloat32).div(255.0);
      for (std::int64_t ch = 0; ch < c; ++ch) {
        chw[ch].sub_(m.mean[static_cast<std::size_t>(ch)]).div_(m.std[static_cast<std::size_t>(ch)]);
      }
      x[n++].copy_(chw);
      kept.push_back(i);
    } catch (const std::exception& e) {
      errors.push_back(files[i] + ": " + e.what());
    }
  }
  return x.slice(0, 0, n);
}

torch::Tensor predict_probabilities(const LoadedModel& m, const torch::Tensor& x, std::int64_t batch) {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> out;
  for (std::int64_t lo = 0; lo < x.size(0); lo += batch) {
    out.push_back(torch::softmax(m.model.forward(x.slice(0, lo, std::min(x.size(0), lo + batch))), 1));
  }
  if (out.empty()) return torch::empty({0, m.classes});
  return torch::cat(out);
}

}  // namespace dltrain::train
