#include "planner/compression_model.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace dltrain::planner {

using compress::Method;

MethodOption method_option(const compress::CompressionSpec& spec) {
  switch (spec.method) {
    case Method::kTopk:
    case Method::kDgc:
    case Method::kRandomk:
      return {spec.method, spec.ratio};
    case Method::kPowerSgd:
      return {spec.method, static_cast<double>(spec.rank)};
    default:
      return {spec.method, 1.0};
  }
}

std::string method_label(const MethodOption& m) {
  const std::string name(enum_name(m.method));
  char buf[64];
  switch (m.method) {
    case Method::kTopk:
    case Method::kDgc:
    case Method::kRandomk:
      std::snprintf(buf, sizeof buf, "%s %g%%", name.c_str(), 100.0 * m.setting);
      return buf;
    case Method::kPowerSgd:
      std::snprintf(buf, sizeof buf, "%s rank %g", name.c_str(), m.setting);
      return buf;
    default:
      return name;
  }
}

std::vector<MethodOption> auto_method_options() {
  return {{Method::kNone, 1.0}, {Method::kFp16, 1.0}, {Method::kDgc, 0.01}, {Method::kDgc, 0.001}};
}

std::optional<double> method_density(const MethodOption& m) {
  switch (m.method) {
    case Method::kPowerSgd:
      return std::nullopt;
    case Method::kTopk:
    case Method::kDgc:
    case Method::kRandomk:
      return m.setting;
    default:
      return 1.0;
  }
}

std::int64_t default_min_compress_bytes(const MethodOption& m) {
  return m.method == Method::kDgc ? compress::kDgcMinCompressBytes : 0;
}

std::optional<double> wire_bytes_per_step(const MethodOption& m, const std::vector<std::int64_t>& tensor_sizes,
                                          int workers, std::int64_t min_compress_bytes) {
  if (tensor_sizes.empty()) return std::nullopt;
  const double p = static_cast<double>(std::accumulate(tensor_sizes.begin(), tensor_sizes.end(), std::int64_t{0}));
  switch (m.method) {
    case Method::kNone:
      return 8.0 * p;
    case Method::kFp16:
      return 4.0 * p;
    case Method::kTopk:
    case Method::kDgc:
    case Method::kRandomk: {
      double small = 0;
      for (const auto n : tensor_sizes) {
        if (4 * n < min_compress_bytes) small += static_cast<double>(n);
      }
      const double d = m.setting;
      const double up = 8.0 * d * (p - small) + 4.0 * small;
      const double q = std::min(1.0, workers * (d + small / p));
      const double down = std::min(8.0 * q * p, 4.0 * p);
      return up + down;
    }
    default:
      return std::nullopt;
  }
}

double comm_seconds_per_image(double bytes_per_image, int workers, int shards, double link_bytes_per_sec) {
  if (link_bytes_per_sec <= 0) return 0.0;
  return bytes_per_image / (2.0 * link_bytes_per_sec * std::max(1, std::min(workers, shards)));
}

}  // namespace dltrain::planner
