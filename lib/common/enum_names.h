// Names of the closed sets of a job file (sync mode, device, model, data set, learning-rate
// schedule, compression method, ...): each enum's values and their job-file names are
// written once, in a specialisation of EnumNames beside the enum, and everything that turns
// one into the other — the TOML reader (toml_fields::enum_key), the JSON forms
// (json_fields), command-line flags, messages — goes through the functions below. A new
// value is one line in its table.
//
//   enum class Device { kCpu, kCuda };
//   template <> struct EnumNames<Device> {
//     static constexpr std::array<EnumName<Device>, 2> kNames{{{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}}};
//   };
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/errors.h"

namespace dltrain {

/// One value of an enum and its name in job files and messages.
template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

/// Specialise with `static constexpr std::array<EnumName<E>, N> kNames` listing every
/// value of E once, in the order users read them in messages.
template <typename E>
struct EnumNames;

/// An enum with a name table.
template <typename E>
concept NamedEnum = std::is_enum_v<E> && requires { EnumNames<E>::kNames; };

/// The name of `v` ("cuda"); "?" for a value outside the table (a cast, never a parse).
template <NamedEnum E>
constexpr std::string_view enum_name(E v) {
  for (const auto& n : EnumNames<E>::kNames) {
    if (n.value == v) return n.name;
  }
  return "?";
}

/// The value named `s`; nullopt for any other string (names are case-sensitive).
template <NamedEnum E>
constexpr std::optional<E> enum_from_name(std::string_view s) {
  for (const auto& n : EnumNames<E>::kNames) {
    if (n.name == s) return n.value;
  }
  return std::nullopt;
}

/// Every name of E joined by `sep`, in table order ("cpu | cuda").
template <NamedEnum E>
std::string enum_choices(std::string_view sep = " | ") {
  std::string out;
  for (const auto& n : EnumNames<E>::kNames) {
    if (!out.empty()) out += sep;
    out += n.name;
  }
  return out;
}

/// Every name of E quoted as a message lists alternatives: "ps or worker", "a, b or c".
template <NamedEnum E>
std::string enum_alternatives() {
  const auto& names = EnumNames<E>::kNames;
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i].name;
  }
  return out;
}

/// The value named `s`. Throws ConfigError(field, "expected one of a | b, got \"s\"").
template <NamedEnum E>
E parse_enum(std::string_view s, const std::string& field) {
  if (const auto v = enum_from_name<E>(s)) return *v;
  throw ConfigError(field, "expected one of " + enum_choices<E>() + ", got \"" + std::string(s) + "\"");
}

}  // namespace dltrain
