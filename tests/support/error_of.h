// The message of what `f` throws, for tests that check an error's wording.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace dltrain::testing {

/// what() of the exception `f` throws; "" when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// what() of the exception of type E that `f` throws; "" when it throws nothing. Any
/// other exception passes through (and fails the test, naming itself).
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace dltrain::testing
