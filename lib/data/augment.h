// Training-time augmentation and the test-time transform of the streaming loader, on
// data/image.h's 8-bit HWC images. Seeded: the same generator state gives the same
// output. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <random>

#include "data/image.h"

namespace dltrain::data {

/// The [augment] table of a job file. Everything is off by default (a job asks for what
/// its data need; configs/jobs/ shows the usual CIFAR and ImageFolder recipes).
struct AugmentSpec {
  /// Random crop with padding (He et al. 2016, §4.2: "4 pixels are padded on each side,
  /// and a 32×32 crop is randomly sampled from the padded image"): pixels of zero padding
  /// per side, [0, 64]; 0 = off.
  int crop_padding = 0;
  /// Horizontal flip with probability 0.5.
  bool horizontal_flip = false;
  /// Random resized crop (Szegedy et al. 2015, "Going deeper with convolutions", §6;
  /// torchvision's RandomResizedCrop): a crop of a random fraction of the area in
  /// [scale_min, scale_max] and aspect ratio log-uniform in [ratio_min, ratio_max],
  /// resized to image_size × image_size; replaces the resize + centre crop in training.
  bool random_resized_crop = false;
  double scale_min = 0.08, scale_max = 1.0;       ///< (0, 1], scale_min <= scale_max
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< > 0, ratio_min <= ratio_max

  bool any() const { return crop_padding > 0 || horizontal_flip || random_resized_crop; }
};

/// Uniform double in [0, 1) from 53 bits of `rng` (the same on every platform, unlike
/// std::uniform_real_distribution).
double uniform01(std::mt19937_64& rng);
/// Uniform integer in [lo, hi] (hi >= lo) from uniform01.
int uniform_int(std::mt19937_64& rng, int lo, int hi);

/// The crop window of torchvision's RandomResizedCrop.get_params for an h × w image:
/// up to 10 draws of (area fraction, log aspect ratio) until the window fits, else the
/// whole image clamped to the ratio range, centred. Returns {top, left, height, width}.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};
CropBox random_resized_crop_box(int h, int w, const AugmentSpec& spec, std::mt19937_64& rng);

/// The test transform: resize the shorter side to `size`, centre crop size × size
/// (resize_and_center_crop).
Image test_transform(const Image& img, int size);

/// The training transform: random resized crop to size × size (when on) or
/// test_transform; then the padded random crop (when crop_padding > 0); then the flip
/// (when on). Draws from `rng` in that order.
Image train_transform(const Image& img, int size, const AugmentSpec& spec, std::mt19937_64& rng);

}  // namespace dltrain::data
