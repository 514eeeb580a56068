// Images as the data readers produce them, decoding (libjpeg-turbo's TurboJPEG API,
// libpng's simplified API), encoding (for tests, tools and benchmarks) and the resampling
// the ImageFolder pipeline needs. Plain C++ on byte buffers, no LibTorch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/errors.h"

namespace dltrain::data {

/// An 8-bit image, interleaved (height × width × channels, row-major, channel fastest:
/// HWC), 1 (gray) or 3 (RGB) channels. pixels.size() == height·width·channels.
struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<std::uint8_t> pixels;
  std::uint8_t at(int y, int x, int c) const {
    return pixels[(static_cast<std::size_t>(y) * width + x) * channels + c];
  }
};

/// An image file that cannot be decoded: not a JPEG or PNG, truncated, corrupt, an
/// unsupported colour space (CMYK JPEG), or larger than DecodeLimits. The data loader
/// skips and counts such files; it never stops training for one.
class CorruptImage : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

/// Bounds on what decode_image accepts, checked from the header before any pixel memory
/// is allocated.
struct DecodeLimits {
  int max_side = 16384;                        ///< pixels, width and height
  std::int64_t max_pixels = std::int64_t{1} << 26;  ///< width × height (64 Mpixel)
};

/// The container format of `bytes`, from its signature: "png" (89 50 4E 47 0D 0A 1A 0A),
/// "jpeg" (FF D8 FF), or "" for anything else. Never throws.
std::string sniff_format(std::span<const std::uint8_t> bytes);

/// Decodes a whole JPEG or PNG file held in `bytes` (the format from its signature, not
/// the file name) into `channels` channels: 0 = the file's own (1 for a grayscale file,
/// 3 otherwise), 1 = grayscale (an RGB file converted with convert_channels), 3 = RGB (a
/// gray file replicated). PNG: 16-bit samples are reduced to 8 bits, palettes expanded,
/// transparency composited on black (libpng's simplified API). JPEG: libjpeg-turbo with
/// its accurate integer IDCT; a warning (e.g. a truncated file) is treated as an error.
/// `name` is only used in messages. Throws CorruptImage naming `name` and the decoder's
/// reason. Thread-safe (no shared state).
Image decode_image(std::span<const std::uint8_t> bytes, int channels, const std::string& name,
                   const DecodeLimits& limits = {});

/// Width and height of a JPEG or PNG file from its header alone (no pixel decoding), and
/// its channels as decode_image(…, 0, …) would return them. Throws CorruptImage.
struct ImageHeader {
  int height = 0, width = 0, channels = 0;
  std::string format;  ///< "png" or "jpeg"
};
ImageHeader read_image_header(std::span<const std::uint8_t> bytes, const std::string& name);

/// `img` with `channels` channels (1 or 3). RGB → gray is ITU-R BT.601 luma,
/// L = (299·R + 587·G + 114·B) / 1000 rounded to nearest (PIL's convert("L"), which
/// torchvision's Grayscale uses); gray → RGB replicates the value. Throws InvalidArgument
/// for another channel count.
Image convert_channels(Image img, int channels);

/// Resamples `img` to out_height × out_width with a separable triangle (bilinear) filter
/// whose support widens with the reduction factor, so that downscaling averages every
/// source pixel (antialiased, as PIL's Image.resize(BILINEAR) and torchvision's
/// Resize(antialias=True)); pixel centres at (i + 0.5)·scale − 0.5. Results are rounded to
/// nearest and clamped to [0, 255]. Throws InvalidArgument for a zero size.
Image resize_bilinear(const Image& img, int out_height, int out_width);

/// Resizes so that the shorter side is `size` (the longer one scaled in proportion,
/// rounded to nearest), then takes the centre size × size crop (torchvision's
/// Resize(size) + CenterCrop(size)). An image already size × size is returned unchanged.
Image resize_and_center_crop(const Image& img, int size);

/// The h × w window of `img` whose top-left pixel is (y, x); parts outside the image are
/// 0 (zero padding). Throws InvalidArgument for a non-positive h or w.
Image crop(const Image& img, int y, int x, int h, int w);

/// PNG file bytes of `img` (libpng, 8-bit gray or RGB, default compression). Throws
/// IoError when libpng fails.
std::vector<std::uint8_t> encode_png(const Image& img);

/// JPEG file bytes of `img` at `quality` in [1, 100] with 4:4:4 chroma (libjpeg-turbo).
/// Throws IoError when TurboJPEG fails.
std::vector<std::uint8_t> encode_jpeg(const Image& img, int quality = 95);

/// The whole contents of a file. Throws IoError naming `path` when it cannot be opened
/// or read, or is larger than `max_bytes`.
std::vector<std::uint8_t> read_file_bytes(const std::string& path, std::int64_t max_bytes = std::int64_t{1} << 30);

}  // namespace dltrain::data
