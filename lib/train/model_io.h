// A trained model as dltrain hands it out (`dltrain model get`: metadata.json,
// state_dict.pt and, for a TorchScript model, model.pt), loaded back into LibTorch to
// predict and evaluate (daemon/model_main.cpp, `dltrain predict` / `dltrain evaluate`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "train/models.h"

namespace dltrain::train {

/// A model directory loaded: its metadata and the network, in eval mode, on the CPU.
struct LoadedModel {
  nlohmann::json meta;                   ///< metadata.json as written by the job's worker 0
  Model model;
  std::string name;                      ///< "cnn", "torchscript", …
  std::int64_t classes = 0;              ///< outputs
  std::int64_t channels = 0;             ///< 1 or 3
  std::int64_t image_size = 0;           ///< input side, pixels
  std::vector<float> mean, std;          ///< per channel, of pixel/255 (the job's normalisation)
  std::vector<std::string> class_names;  ///< by label; "" where unknown
};

/// Loads the model in `dir`: model.pt with torch::jit::load when it is there (a
/// TorchScript job), else the built-in network of metadata's "model" with state_dict.pt's
/// values (torch::pickle_load; every parameter and buffer must be there, with its
/// shape). Throws ConfigError naming the file and what is wrong (missing, not JSON, a
/// field absent, a tensor missing or of another shape) and what load_torchscript_model
/// throws.
LoadedModel load_model_dir(const std::string& dir);

/// `state`'s values copied into built-in `m`'s parameters and buffers by name (the names
/// save_model_files writes: exported_name). Throws ConfigError("state_dict", …) naming a
/// missing name or a shape that differs (both shapes); `source` names the file in messages.
void load_state_dict(const Model& m, const c10::Dict<c10::IValue, c10::IValue>& state, const std::string& source);

/// The images in `files` as the job's test transform makes them: decoded (JPEG, PNG)
/// into the model's channels, resized so that the shorter side is image_size and centre
/// cropped, scaled to [0, 1] and standardised with the model's mean and std:
/// [N, channels, image_size, image_size] float. A file that cannot be read or decoded is
/// left out and named in `errors` ("FILE: reason"); `kept` gets the indices of the others.
torch::Tensor image_batch(const LoadedModel& m, const std::vector<std::string>& files, std::vector<std::size_t>& kept,
                          std::vector<std::string>& errors);

/// Class probabilities [N, classes] (softmax of the logits) of `x` [N, C, S, S], in
/// batches of `batch`, without gradients.
torch::Tensor predict_probabilities(const LoadedModel& m, const torch::Tensor& x, std::int64_t batch = 256);

}  // namespace dltrain::train
