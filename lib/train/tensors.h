// Tensor helpers shared by the worker's training loop and the benchmarks' reference
// loops (LibTorch; include only from lib/train, the worker and bench/).
#pragma once

#include <string>
#include <utility>

#include <torch/torch.h>

#include "data/idx.h"
#include "train/models.h"

namespace dltrain::train {

/// Images of `s` as a float tensor [N, 1, 28, 28], scaled to [0, 1] and standardised with
/// the dataset's training-set mean and standard deviation (docs/training.md), and labels
/// as int64 [N]. Copies; `s` may be released afterwards. Thread-safe.
std::pair<torch::Tensor, torch::Tensor> to_tensors(const data::Split& s, DatasetKind dataset);

/// The published per-pixel mean and standard deviation of an IDX data set's training
/// images (pixel/255): MNIST's 0.1307 / 0.3081, Fashion-MNIST's 0.2860 / 0.3530.
double idx_mean(DatasetKind dataset);
double idx_std(DatasetKind dataset);

/// Top-1 accuracy in [0, 1] of `model` on (x [N, C, S, S], y [N]), in eval mode, in
/// forward passes of `batch` images (the job's eval_batch_size; the last one smaller)
/// without gradients; leaves the module in train mode. Throws ConfigError for batch < 1.
/// The batch barely changes the speed when the allocator keeps large blocks
/// (docs/training.md, "Evaluation"); its memory is the activations of `batch` images.
double evaluate(torch::nn::Module& m, const Model& model, const torch::Tensor& x, const torch::Tensor& y,
                int batch);

}  // namespace dltrain::train
