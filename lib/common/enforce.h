// Checks that say what they saw (gloo's GLOO_ENFORCE_EQ): a failed check throws a typed
// dltrain error whose message names the context, the value expected and the value found.
//
//   DLTRAIN_ENFORCE_EQ(h.count, p.length, ProtocolError, where(s), ": pull-reply of partition ", p.key,
//                      ": element count");
//   // throws ProtocolError("PS shard 1 (10.0.0.2:7000): pull-reply of partition 3: element count:
//   //                       expected 1024, got 512")
//
// Message forms (the context pieces are concatenated as written):
//   DLTRAIN_ENFORCE_EQ(found, expected, E, ctx...)  "<ctx>: expected <expected>, got <found>"
//   DLTRAIN_ENFORCE_LE(found, bound, E, ctx...)     "<ctx>: expected at most <bound>, got <found>"
//   DLTRAIN_ENFORCE_GE(found, bound, E, ctx...)     "<ctx>: expected at least <bound>, got <found>"
//
// `found` and `expected` are each evaluated once; the context only when the check fails,
// so building it costs nothing on the hot path. Integers of different signedness are
// compared by value (std::cmp_equal and friends), never by wrapping conversion. Values are
// printed as: integers in decimal; enumerations by an ADL-visible `to_string(e)` when
// there is one (wire::MessageType prints "pull-reply"), else their underlying number;
// anything else through `operator<<`. `E` is any dltrain error constructible from one
// std::string (ProtocolError, IoError, TimeoutError, Error); the check throws nothing
// else. Thread-safe (no state).
#pragma once

#include <concepts>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/errors.h"

namespace dltrain::detail {

/// Text of one value in an ENFORCE message (see the file comment).
template <typename T>
std::string enforce_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_enum_v<T>) {
    if constexpr (requires { { to_string(v) } -> std::convertible_to<std::string>; }) {
      return to_string(v);
    } else {
      return std::to_string(static_cast<std::underlying_type_t<T>>(v));
    }
  } else {
    std::ostringstream out;
    out << v;
    return out.str();
  }
}

template <typename T>
inline constexpr bool kEnforceInteger = std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                        !std::is_same_v<T, char> && !std::is_same_v<T, char8_t> &&
                                        !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t> &&
                                        !std::is_same_v<T, wchar_t>;

template <typename A, typename B>
constexpr bool enforce_eq(const A& a, const B& b) {
  if constexpr (kEnforceInteger<A> && kEnforceInteger<B>) {
    return std::cmp_equal(a, b);
  } else {
    return a == b;
  }
}

template <typename A, typename B>
constexpr bool enforce_le(const A& a, const B& b) {
  if constexpr (kEnforceInteger<A> && kEnforceInteger<B>) {
    return std::cmp_less_equal(a, b);
  } else {
    return a <= b;
  }
}

/// Builds "<context>: expected <relation><expected>, got <found>" and throws it as `E`.
template <typename E, typename F, typename X, typename... Context>
[[noreturn]] void enforce_fail(const char* relation, const F& found, const X& expected, const Context&... context) {
  static_assert(std::is_base_of_v<Error, E> && std::is_constructible_v<E, std::string>,
                "DLTRAIN_ENFORCE_*: the error type must be a dltrain error constructible from one message");
  std::ostringstream out;
  (out << ... << context);
  throw E(out.str() + ": expected " + relation + enforce_value(expected) + ", got " + enforce_value(found));
}

}  // namespace dltrain::detail

/// Throws `ErrorType` unless `found == expected` (see the file comment for the message).
#define DLTRAIN_ENFORCE_EQ(found, expected, ErrorType, ...)                                   \
  do {                                                                                        \
    const auto& dltrain_enforce_f_ = (found);                                                 \
    const auto& dltrain_enforce_x_ = (expected);                                              \
    if (!::dltrain::detail::enforce_eq(dltrain_enforce_f_, dltrain_enforce_x_)) {             \
      ::dltrain::detail::enforce_fail<ErrorType>("", dltrain_enforce_f_, dltrain_enforce_x_,  \
                                                 __VA_ARGS__);                                \
    }                                                                                         \
  } while (false)

/// Throws `ErrorType` unless `found <= bound`.
#define DLTRAIN_ENFORCE_LE(found, bound, ErrorType, ...)                                            \
  do {                                                                                              \
    const auto& dltrain_enforce_f_ = (found);                                                       \
    const auto& dltrain_enforce_x_ = (bound);                                                       \
    if (!::dltrain::detail::enforce_le(dltrain_enforce_f_, dltrain_enforce_x_)) {                   \
      ::dltrain::detail::enforce_fail<ErrorType>("at most ", dltrain_enforce_f_, dltrain_enforce_x_, \
                                                 __VA_ARGS__);                                      \
    }                                                                                               \
  } while (false)

/// Throws `ErrorType` unless `found >= bound`.
#define DLTRAIN_ENFORCE_GE(found, bound, ErrorType, ...)                                             \
  do {                                                                                               \
    const auto& dltrain_enforce_f_ = (found);                                                        \
    const auto& dltrain_enforce_x_ = (bound);                                                        \
    if (!::dltrain::detail::enforce_le(dltrain_enforce_x_, dltrain_enforce_f_)) {                    \
      ::dltrain::detail::enforce_fail<ErrorType>("at least ", dltrain_enforce_f_, dltrain_enforce_x_, \
                                                 __VA_ARGS__);                                       \
    }                                                                                                \
  } while (false)
