// What every fuzz target shares: a check that says what went wrong and aborts, so that
// libFuzzer records the input as a crash (a plain assert would vanish under NDEBUG).
//
// A target catches only the errors its parser documents (ProtocolError, ConfigError, ...);
// anything else escaping it (std::out_of_range, a nlohmann exception where a dltrain error
// is promised) is uncaught, and libFuzzer reports that as a crash too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

/// Aborts with `what` and the source line unless `cond` holds.
#define FUZZ_CHECK(cond, what)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   what, #cond);                                                           \
      std::abort();                                                                        \
    }                                                                                      \
  } while (false)

namespace dltrain::fuzz {

/// Two floats are the same value: the same bits, or both NaN (payloads may differ).
inline bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// How deeply `j` nests: 0 for a scalar, 1 + the deepest element for an array or object.
inline int depth_of(const nlohmann::json& j) {
  int d = 0;
  if (j.is_structured()) {
    for (const auto& e : j) d = std::max(d, depth_of(e));
    return d + 1;
  }
  return 0;
}

}  // namespace dltrain::fuzz
