#include "data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace dltrain::data {
namespace {

constexpr std::uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

struct TjCloser {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjCloser>;

TjHandle tj_decompressor() {
  TjHandle h(tjInitDecompress());
  if (!h) throw IoError(std::string("TurboJPEG: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
  return h;
}

struct PngImage {
  png_image img{};
  PngImage() {
    img.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&img); }
};

void check_limits(int h, int w, const DecodeLimits& limits, const std::string& name) {
  if (h <= 0 || w <= 0 || h > limits.max_side || w > limits.max_side ||
      static_cast<std::int64_t>(h) * w > limits.max_pixels) {
    throw CorruptImage("\"" + name + "\": image of " + std::to_string(w) + "x" + std::to_string(h) +
                       " pixels is outside the accepted size (sides 1.." + std::to_string(limits.max_side) +
                       ", at most " + std::to_string(limits.max_pixels) + " pixels)");
  }
}

std::string tj_error(void* h) { return tjGetErrorStr2(h); }

Image decode_jpeg(std::span<const std::uint8_t> bytes, int channels, const std::string& name,
                  const DecodeLimits& limits) {
  auto h = tj_decompressor();
  int w = 0, ht = 0, subsamp = 0, cs = 0;
  auto* src = const_cast<unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  if (tjDecompressHeader3(h.get(), src, size, &w, &ht, &subsamp, &cs) != 0) {
    throw CorruptImage("\"" + name + "\": not a readable JPEG: " + tj_error(h.get()));
  }
  check_limits(ht, w, limits, name);
  if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
    throw CorruptImage("\"" + name + "\": CMYK JPEG files are not supported (convert to RGB)");
  }
  const int native = cs == TJCS_GRAY ? 1 : 3;
  const int want = channels == 0 ? native : channels;
  // A colour file decoded straight to gray would use libjpeg's own luma (its Y plane);
  // decoding to RGB and converting keeps one conversion formula for every format.
  const int decode_as = native == 1 ? 1 : 3;
  Image out;
  out.height = ht;
  out.width = w;
  out.channels = decode_as;
  out.pixels.resize(static_cast<std::size_t>(ht) * w * decode_as);
  if (tjDecompress2(h.get(), src, size, out.pixels.data(), w, 0, ht, decode_as == 1 ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING) != 0) {
    throw CorruptImage("\"" + name + "\": JPEG decoding failed: " + tj_error(h.get()));
  }
  return convert_channels(std::move(out), want);
}

Image decode_png(std::span<const std::uint8_t> bytes, int channels, const std::string& name,
                 const DecodeLimits& limits) {
  PngImage p;
  if (png_image_begin_read_from_memory(&p.img, bytes.data(), bytes.size()) == 0) {
    throw CorruptImage("\"" + name + "\": not a readable PNG: " + p.img.message);
  }
  check_limits(static_cast<int>(std::min<png_uint_32>(p.img.height, 1u << 30)),
               static_cast<int>(std::min<png_uint_32>(p.img.width, 1u << 30)), limits, name);
  const int native = (p.img.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1;
  const int want = channels == 0 ? native : channels;
  p.img.format = native == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  Image out;
  out.height = static_cast<int>(p.img.height);
  out.width = static_cast<int>(p.img.width);
  out.channels = native;
  out.pixels.resize(PNG_IMAGE_SIZE(p.img));
  if (png_image_finish_read(&p.img, nullptr, out.pixels.data(), 0, nullptr) == 0) {
    throw CorruptImage("\"" + name + "\": PNG decoding failed: " + p.img.message);
  }
  return convert_channels(std::move(out), want);
}

// PIL's resampling coefficients (libImaging/Resample.c, precompute_coeffs) for the
// bilinear (triangle) filter: output i covers source [lo[i], lo[i] + n[i]) with weights w.
struct Coeffs {
  std::vector<int> lo, n;
  std::vector<double> w;  // n_max per output
  int n_max = 0;
};

Coeffs coefficients(int in, int out) {
  const double scale = static_cast<double>(in) / out;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  Coeffs c;
  c.n_max = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.lo.resize(out);
  c.n.resize(out);
  c.w.assign(static_cast<std::size_t>(out) * c.n_max, 0.0);
  for (int i = 0; i < out; ++i) {
    const double center = (i + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    xmin = std::max(xmin, 0);
    int xmax = std::min(static_cast<int>(center + support + 0.5), in);
    xmax = std::min(xmax - xmin, c.n_max);
    double total = 0;
    double* w = &c.w[static_cast<std::size_t>(i) * c.n_max];
    for (int x = 0; x < xmax; ++x) {
      const double t = (x + xmin - center + 0.5) / filterscale;
      w[x] = std::max(0.0, 1.0 - std::abs(t));
      total += w[x];
    }
    for (int x = 0; x < xmax && total != 0; ++x) w[x] /= total;
    c.lo[i] = xmin;
    c.n[i] = xmax;
  }
  return c;
}

std::uint8_t clamp_round(double v) { return static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

}  // namespace

std::string sniff_format(std::span<const std::uint8_t> bytes) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSignature, 8) == 0) return "png";
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return "jpeg";
  return "";
}

Image decode_image(std::span<const std::uint8_t> bytes, int channels, const std::string& name,
                   const DecodeLimits& limits) {
  if (channels != 0 && channels != 1 && channels != 3) {
    throw InvalidArgument("decode_image: channels must be 0, 1 or 3, got " + std::to_string(channels));
  }
  const auto fmt = sniff_format(bytes);
  if (fmt == "png") return decode_png(bytes, channels, name, limits);
  if (fmt == "jpeg") return decode_jpeg(bytes, channels, name, limits);
  if (bytes.empty()) throw CorruptImage("\"" + name + "\": empty file (0 bytes)");
  throw CorruptImage("\"" + name + "\": neither a JPEG nor a PNG file (no JPEG or PNG signature in its first bytes)");
}

ImageHeader read_image_header(std::span<const std::uint8_t> bytes, const std::string& name) {
  ImageHeader h;
  h.format = sniff_format(bytes);
  if (h.format == "png") {
    PngImage p;
    if (png_image_begin_read_from_memory(&p.img, bytes.data(), bytes.size()) == 0) {
      throw CorruptImage("\"" + name + "\": not a readable PNG: " + p.img.message);
    }
    h.width = static_cast<int>(std::min<png_uint_32>(p.img.width, 1u << 30));
    h.height = static_cast<int>(std::min<png_uint_32>(p.img.height, 1u << 30));
    h.channels = (p.img.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1;
    return h;
  }
  if (h.format == "jpeg") {
    auto t = tj_decompressor();
    int subsamp = 0, cs = 0;
    if (tjDecompressHeader3(t.get(), const_cast<unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()),
                            &h.width, &h.height, &subsamp, &cs) != 0) {
      throw CorruptImage("\"" + name + "\": not a readable JPEG: " + tj_error(t.get()));
    }
    h.channels = cs == TJCS_GRAY ? 1 : 3;
    return h;
  }
  throw CorruptImage("\"" + name + "\": " +
                     (bytes.empty() ? "empty file (0 bytes)" : "neither a JPEG nor a PNG file"));
}

Image convert_channels(Image img, int channels) {
  if (channels != 1 && channels != 3) {
    throw InvalidArgument("convert_channels: channels must be 1 or 3, got " + std::to_string(channels));
  }
  if (img.channels == channels) return img;
  const std::size_t n = static_cast<std::size_t>(img.height) * img.width;
  Image out;
  out.height = img.height;
  out.width = img.width;
  out.channels = channels;
  out.pixels.resize(n * channels);
  if (channels == 1) {
    if (img.channels != 3) throw InvalidArgument("convert_channels: expected a 3-channel input");
    for (std::size_t i = 0; i < n; ++i) {
      const auto* p = &img.pixels[i * 3];
      out.pixels[i] = static_cast<std::uint8_t>((299u * p[0] + 587u * p[1] + 114u * p[2] + 500u) / 1000u);
    }
  } else {
    if (img.channels != 1) throw InvalidArgument("convert_channels: expected a 1-channel input");
    for (std::size_t i = 0; i < n; ++i) out.pixels[i * 3] = out.pixels[i * 3 + 1] = out.pixels[i * 3 + 2] = img.pixels[i];
  }
  return out;
}

Image resize_bilinear(const Image& img, int out_height, int out_width) {
  if (out_height <= 0 || out_width <= 0 || img.height <= 0 || img.width <= 0) {
    throw InvalidArgument("resize_bilinear: sizes must be positive, got " + std::to_string(img.width) + "x" +
                          std::to_string(img.height) + " -> " + std::to_string(out_width) + "x" +
                          std::to_string(out_height));
  }
  const int c = img.channels;
  // Horizontal pass into floats (no intermediate rounding), then vertical.
  const Coeffs cx = coefficients(img.width, out_width);
  std::vector<double> tmp(static_cast<std::size_t>(img.height) * out_width * c);
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < out_width; ++x) {
      const double* w = &cx.w[static_cast<std::size_t>(x) * cx.n_max];
      for (int ch = 0; ch < c; ++ch) {
        double s = 0;
        for (int k = 0; k < cx.n[x]; ++k) s += w[k] * img.at(y, cx.lo[x] + k, ch);
        tmp[(static_cast<std::size_t>(y) * out_width + x) * c + ch] = s;
      }
    }
  }
  const Coeffs cy = coefficients(img.height, out_height);
  Image out;
  out.height = out_height;
  out.width = out_width;
  out.channels = c;
  out.pixels.resize(static_cast<std::size_t>(out_height) * out_width * c);
  for (int y = 0; y < out_height; ++y) {
    const double* w = &cy.w[static_cast<std::size_t>(y) * cy.n_max];
    for (int x = 0; x < out_width; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        double s = 0;
        for (int k = 0; k < cy.n[y]; ++k) s += w[k] * tmp[(static_cast<std::size_t>(cy.lo[y] + k) * out_width + x) * c + ch];
        out.pixels[(static_cast<std::size_t>(y) * out_width + x) * c + ch] = clamp_round(s);
      }
    }
  }
  return out;
}

Image resize_and_center_crop(const Image& img, int size) {
  if (img.height == size && img.width == size) return img;
  Image r = img;
  if (std::min(img.height, img.width) != size) {
    int h = size, w = size;
    if (img.height < img.width) {
      w = static_cast<int>(std::lround(static_cast<double>(img.width) * size / img.height));
    } else {
      h = static_cast<int>(std::lround(static_cast<double>(img.height) * size / img.width));
    }
    r = resize_bilinear(img, std::max(h, size), std::max(w, size));
  }
  // torchvision's CenterCrop: top = round((H - size) / 2).
  const int top = static_cast<int>(std::lround((r.height - size) / 2.0));
  const int left = static_cast<int>(std::lround((r.width - size) / 2.0));
  return crop(r, top, left, size, size);
}

Image crop(const Image& img, int y0, int x0, int h, int w) {
  if (h <= 0 || w <= 0) throw InvalidArgument("crop: sizes must be positive");
  Image out;
  out.height = h;
  out.width = w;
  out.channels = img.channels;
  out.pixels.assign(static_cast<std::size_t>(h) * w * img.channels, 0);
  const int c = img.channels;
  for (int y = 0; y < h; ++y) {
    const int sy = y0 + y;
    if (sy < 0 || sy >= img.height) continue;
    const int xs = std::max(0, -x0), xe = std::min(w, img.width - x0);
    if (xs >= xe) continue;
    std::memcpy(&out.pixels[(static_cast<std::size_t>(y) * w + xs) * c],
                &img.pixels[(static_cast<std::size_t>(sy) * img.width + x0 + xs) * c],
                static_cast<std::size_t>(xe - xs) * c);
  }
  return out;
}

std::vector<std::uint8_t> encode_png(const Image& img) {
  PngImage p;
  p.img.width = static_cast<png_uint_32>(img.width);
  p.img.height = static_cast<png_uint_32>(img.height);
  p.img.format = img.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  if (png_image_write_get_memory_size(p.img, size, 0, img.pixels.data(), 0, nullptr) == 0) {
    throw IoError(std::string("libpng: cannot encode: ") + p.img.message);
  }
  std::vector<std::uint8_t> out(size);
  if (png_image_write_to_memory(&p.img, out.data(), &size, 0, img.pixels.data(), 0, nullptr) == 0) {
    throw IoError(std::string("libpng: cannot encode: ") + p.img.message);
  }
  out.resize(size);
  return out;
}

std::vector<std::uint8_t> encode_jpeg(const Image& img, int quality) {
  TjHandle h(tjInitCompress());
  if (!h) throw IoError(std::string("TurboJPEG: cannot create a compressor: ") + tjGetErrorStr2(nullptr));
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int pf = img.channels == 3 ? TJPF_RGB : TJPF_GRAY;
  const int subsamp = img.channels == 3 ? TJSAMP_444 : TJSAMP_GRAY;
  if (tjCompress2(h.get(), img.pixels.data(), img.width, 0, img.height, pf, &buf, &size, subsamp,
                  std::clamp(quality, 1, 100), TJFLAG_ACCURATEDCT) != 0) {
    tjFree(buf);
    throw IoError("TurboJPEG: cannot encode: " + tj_error(h.get()));
  }
  std::vector<std::uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
}

std::vector<std::uint8_t> read_file_bytes(const std::string& path, std::int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open \"" + path + "\": " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw IoError("cannot read \"" + path + "\" (not a regular file?)");
  if (size > max_bytes) {
    throw IoError("\"" + path + "\" is " + std::to_string(size) + " bytes, more than the " +
                  std::to_string(max_bytes) + " accepted");
  }
  in.seekg(0);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(out.data()), size)) {
    throw IoError("cannot read \"" + path + "\": " + std::strerror(errno));
  }
  return out;
}

}  // namespace dltrain::data
