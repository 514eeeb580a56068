#include "common/compression_spec.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace dltrain::compress {

Method parse_method(const std::string& name) {
  if (name == "none") return Method::kNone;
  if (name == "topk") return Method::kTopk;
  if (name == "dgc") return Method::kDgc;
  if (name == "randomk") return Method::kRandomk;
  if (name == "fp16") return Method::kFp16;
  throw ConfigError("compression.method", "expected one of none | topk | dgc | randomk | fp16, got \"" + name + "\"");
}

std::string to_string(Method m) {
  switch (m) {
    case Method::kNone: return "none";
    case Method::kTopk: return "topk";
    case Method::kDgc: return "dgc";
    case Method::kRandomk: return "randomk";
    case Method::kFp16: return "fp16";
  }
  return "?";
}

double density_at(const CompressionSpec& spec, double epoch_pos) {
  if (spec.warmup_epochs > 0 && epoch_pos < spec.warmup_epochs) {
    int k = static_cast<int>(std::floor(epoch_pos));  // per_epoch: stage k is warm-up epoch k
    if (spec.warmup_schedule == "stages") {
      k = std::min(3, static_cast<int>(std::floor(epoch_pos / (spec.warmup_epochs / 4.0))));
    }
    return std::max(spec.ratio, std::pow(0.25, k + 1));
  }
  return spec.ratio;
}

}  // namespace dltrain::compress
