#include "data/augment.h"

#include <algorithm>
#include <cmath>

namespace dltrain::data {

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int uniform_int(std::mt19937_64& rng, int lo, int hi) {
  const auto span = static_cast<double>(hi) - lo + 1;
  return std::min(hi, lo + static_cast<int>(uniform01(rng) * span));
}

CropBox random_resized_crop_box(int h, int w, const AugmentSpec& spec, std::mt19937_64& rng) {
  const double area = static_cast<double>(h) * w;
  const double log_lo = std::log(spec.ratio_min), log_hi = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (spec.scale_min + uniform01(rng) * (spec.scale_max - spec.scale_min));
    const double ratio = std::exp(log_lo + uniform01(rng) * (log_hi - log_lo));
    const int cw = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int ch = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
      const int top = uniform_int(rng, 0, h - ch);
      const int left = uniform_int(rng, 0, w - cw);
      return {top, left, ch, cw};
    }
  }
  // Fallback: the whole image, cut to the ratio range, centred.
  const double in_ratio = static_cast<double>(w) / h;
  int cw = w, ch = h;
  if (in_ratio < spec.ratio_min) {
    ch = static_cast<int>(std::lround(w / spec.ratio_min));
  } else if (in_ratio > spec.ratio_max) {
    cw = static_cast<int>(std::lround(h * spec.ratio_max));
  }
  ch = std::clamp(ch, 1, h);
  cw = std::clamp(cw, 1, w);
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

Image test_transform(const Image& img, int size) { return resize_and_center_crop(img, size); }

Image train_transform(const Image& img, int size, const AugmentSpec& spec, std::mt19937_64& rng) {
  Image out;
  if (spec.random_resized_crop) {
    const auto box = random_resized_crop_box(img.height, img.width, spec, rng);
    out = resize_bilinear(crop(img, box.top, box.left, box.height, box.width), size, size);
  } else {
    out = test_transform(img, size);
  }
  if (spec.crop_padding > 0) {
    const int p = spec.crop_padding;
    const int dy = uniform_int(rng, 0, 2 * p), dx = uniform_int(rng, 0, 2 * p);
    out = crop(out, dy - p, dx - p, size, size);
  }
  if (spec.horizontal_flip && uniform01(rng) < 0.5) {
    const int c = out.channels;
    for (int y = 0; y < out.height; ++y) {
      std::uint8_t* row = &out.pixels[static_cast<std::size_t>(y) * out.width * c];
      for (int a = 0, b = out.width - 1; a < b; ++a, --b) {
        for (int ch = 0; ch < c; ++ch) std::swap(row[a * c + ch], row[b * c + ch]);
      }
    }
  }
  return out;
}

}  // namespace dltrain::data
