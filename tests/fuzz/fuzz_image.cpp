// Fuzzes the image decoders (data/image.h): decode_image through libpng's simplified
// API and libjpeg-turbo's TurboJPEG, read_image_header, and the resampling every decoded
// ImageFolder file goes through (resize_and_center_crop) — what a worker runs on each
// file of a user's image folder.
//
// Input: a whole file. The output channel count comes from the input's length (0, 1 or
// 3), the limits are tighter than the defaults (sides <= 2048, <= 1 Mpixel) so that a
// header that claims a huge image is refused quickly. Checks, beyond "no crash" and "only
// CorruptImage escapes":
//   - a decoded image has the pixels its dimensions say, and the channels asked for;
//   - read_image_header agrees with the decoded width and height;
//   - the centre crop of a decoded image is 17×17 with the same channels.
#include <cstdint>
#include <span>

#include "data/image.h"
#include "fuzz_check.h"

using namespace dltrain;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  const int channels = static_cast<int>(size % 3) == 0 ? 0 : static_cast<int>(size % 3) == 1 ? 1 : 3;
  data::DecodeLimits limits;
  limits.max_side = 2048;
  limits.max_pixels = 1 << 20;
  try {
    const auto img = data::decode_image(bytes, channels, "fuzz", limits);
    FUZZ_CHECK(img.height >= 1 && img.width >= 1 && img.height <= 2048 && img.width <= 2048, "dimensions past the limits");
    FUZZ_CHECK(channels == 0 ? (img.channels == 1 || img.channels == 3) : img.channels == channels, "wrong channel count");
    FUZZ_CHECK(img.pixels.size() == static_cast<std::size_t>(img.height) * img.width * img.channels,
               "pixels do not match height x width x channels");
    const auto h = data::read_image_header(bytes, "fuzz");
    FUZZ_CHECK(h.width == img.width && h.height == img.height, "the header disagrees with the decoded image");
    if (static_cast<std::int64_t>(img.height) * img.width <= 65536) {
      const auto c = data::resize_and_center_crop(img, 17);
      FUZZ_CHECK(c.height == 17 && c.width == 17 && c.channels == img.channels &&
                     c.pixels.size() == static_cast<std::size_t>(17 * 17 * img.channels),
                 "the centre crop has the wrong shape");
    }
  } catch (const data::CorruptImage&) {
  }
  return 0;
}
