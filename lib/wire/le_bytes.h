#pragma once
// Fixed-width fields at byte offsets of a wire buffer: the PS frames' header
// (wire/frame.cpp) and the PS authentication messages (wire/auth.cpp).

#include <bit>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace dltrain::wire {

static_assert(std::endian::native == std::endian::little,
              "dltrain's wire format is little-endian; big-endian hosts need byte swaps here");

/// Writes `v`'s sizeof(T) bytes, little-endian, at `out + off`. The caller guarantees
/// that the buffer holds off + sizeof(T) bytes (the formats' fixed offsets do). No
/// alignment is needed. Thread-safe on distinct buffers.
template <typename T, typename Byte>
  requires(sizeof(Byte) == 1 && std::is_trivially_copyable_v<T>)
void store_le(Byte* out, std::size_t off, T v) {
  std::memcpy(out + off, &v, sizeof(T));
}

/// Reads a little-endian T from sizeof(T) bytes at `in + off`; the caller guarantees that
/// they are there. No alignment is needed.
template <typename T, typename Byte>
  requires(sizeof(Byte) == 1 && std::is_trivially_copyable_v<T>)
T load_le(const Byte* in, std::size_t off) {
  T v;
  std::memcpy(&v, in + off, sizeof(T));
  return v;
}

}  // namespace dltrain::wire
