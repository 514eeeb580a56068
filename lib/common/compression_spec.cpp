#include "common/compression_spec.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace dltrain::compress {

double density_at(const CompressionSpec& spec, double epoch_pos) {
  if (spec.warmup_epochs > 0 && epoch_pos < spec.warmup_epochs) {
    if (spec.method == Method::kPowerSgd) return 1.0;
    int k = static_cast<int>(std::floor(epoch_pos));  // per_epoch: stage k is warm-up epoch k
    if (spec.warmup_schedule == WarmupSchedule::kStages) {
      k = std::min(3, static_cast<int>(std::floor(epoch_pos / (spec.warmup_epochs / 4.0))));
    }
    return std::max(spec.ratio, std::pow(0.25, k + 1));
  }
  return spec.ratio;
}

double downlink_density(const CompressionSpec& spec, double epoch_pos, int workers, double always_sent_fraction) {
  if (spec.downlink_ratio > 0) {
    CompressionSpec down = spec;
    down.ratio = spec.downlink_ratio;
    return density_at(down, epoch_pos);
  }
  if (spec.method == Method::kPowerSgd) return density_at(spec, epoch_pos);
  if (spec.method == Method::kFp16) return 1.0;
  return std::min(1.0, std::max(1, workers) * (density_at(spec, epoch_pos) + always_sent_fraction));
}

bool half_downlink(const CompressionSpec& spec) { return spec.method == Method::kFp16 && spec.downlink_ratio == 0; }

bool keeps_x_seen(const CompressionSpec& spec) { return spec.downlink_ratio < 1.0; }

}  // namespace dltrain::compress
