// IEEE 754 binary16 conversion for fp16 payloads (portable bit manipulation).
#pragma once

#include <cstdint>
#include <span>

namespace dltrain::compress {

/// Rounds to nearest, ties to even; overflow gives ±Inf, NaN stays NaN, values below the
/// smallest subnormal (2^-24) flush to signed zero.
std::uint16_t float_to_half(float f);
/// Exact (every binary16 value is a float).
float half_to_float(std::uint16_t h);

/// Element-wise conversions; `out.size()` must equal `in.size()`.
void to_half(std::span<const float> in, std::span<std::uint16_t> out);
void from_half(std::span<const std::uint16_t> in, std::span<float> out);

}  // namespace dltrain::compress
