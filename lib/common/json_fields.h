// Structs with a JSON form whose field list is written once. A struct D derives from
// Fields<D> and names its fields in one static function,
//
//   template <typename S, typename V>
//   static void fields(S& s, V&& v) { v("rank", s.rank), v("loss", s.loss); }
//
// which serves both directions: D::to_json() writes every field (std::optional ones only
// when set; Nullable ones as null when empty) and D::from_json(j) reads every field that
// is present (the others keep their defaults; a null counts as absent except for Nullable
// and raw JSON fields). A wrong JSON type throws nlohmann::json::type_error. Nested
// structs that derive from Fields, std::vector of them or of plain values, enums with a
// name table (common/enum_names.h; written as their names) and nlohmann::json members are
// handled. If D has `static constexpr const char* kKind`, its
// JSON form also carries "event": kKind (task events, wire/task_events.h). An integer
// field accepts only a JSON integer, or a float with an integral value, that fits its
// type (get_value below); a type_error thrown while reading a field names it.
// Thread-safety: none needed; these are plain values.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/enum_names.h"

namespace dltrain::json_fields {

namespace detail {
/// Throws the type_error of get_value for `j`, which is not an integer in [lo, hi].
[[noreturn]] inline void not_an_integer(const nlohmann::json& j, const std::string& lo, const std::string& hi) {
  throw nlohmann::json::type_error::create(
      302, "expected an integer in [" + lo + ", " + hi + "], got " + (j.is_number() ? j.dump() : std::string(j.type_name())),
      &j);
}
}  // namespace detail

/// `j` as a T, as nlohmann's j.get<T>() but checked for integers: an integral T (not
/// bool) takes a JSON integer in T's range or a float with an integral value in T's
/// range, and anything else throws nlohmann::json::type_error (302) saying what was
/// found. nlohmann's own get<int>() converts a float with a static_cast, which is
/// undefined behaviour when the value does not fit (a peer's 1e300), and wraps integers
/// that do not fit. Other types are read by j.get<T>().
template <typename T>
T get_value(const nlohmann::json& j) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using L = std::numeric_limits<T>;
    bool fits = false;
    T v{};
    if (j.is_number_unsigned()) {
      const auto u = j.get<std::uint64_t>();
      fits = std::in_range<T>(u);
      v = static_cast<T>(u);
    } else if (j.is_number_integer()) {
      const auto i = j.get<std::int64_t>();
      fits = std::in_range<T>(i);
      v = static_cast<T>(i);
    } else if (j.is_number_float()) {
      // [min, 2^digits): both ends are exact in a double (0 or a power of two).
      const double d = j.get<double>();
      fits = std::isfinite(d) && d == std::trunc(d) && d >= static_cast<double>(L::min()) &&
             d < std::ldexp(1.0, L::digits);
      if (fits) v = static_cast<T>(d);
    }
    if (!fits) detail::not_an_integer(j, std::to_string(L::min()), std::to_string(L::max()));
    return v;
  } else {
    return j.get<T>();
  }
}

/// The message of a nlohmann exception without its "[json.exception.type_error.302] " prefix.
inline std::string message_of(const nlohmann::json::exception& e) {
  const std::string w = e.what();
  const auto end = w.find("] ");
  return w.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? w.substr(end + 2) : w;
}

/// A field written as JSON null when empty (std::optional<T> fields are left out instead).
template <typename T>
struct Nullable : std::optional<T> {
  using std::optional<T>::optional;
  Nullable& operator=(const T& v) {
    std::optional<T>::operator=(v);
    return *this;
  }
};

namespace detail {
template <typename T>
concept HasJson = requires(const T& t, const nlohmann::json& j) {
  { t.to_json() } -> std::same_as<nlohmann::json>;
  { T::from_json(j) } -> std::same_as<T>;
};
template <typename T> struct IsOptional : std::false_type {};
template <typename T> struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T> struct IsNullable : std::false_type {};
template <typename T> struct IsNullable<Nullable<T>> : std::true_type {};
template <typename T> struct IsVector : std::false_type {};
template <typename T> struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
nlohmann::json to_value(const T& v) {
  if constexpr (IsNullable<T>::value) {
    return v ? to_value(*v) : nlohmann::json(nullptr);
  } else if constexpr (HasJson<T>) {
    return v.to_json();
  } else if constexpr (NamedEnum<T>) {
    return nlohmann::json(std::string(enum_name(v)));
  } else if constexpr (IsVector<T>::value) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& e : v) a.push_back(to_value(e));
    return a;
  } else {
    return nlohmann::json(v);
  }
}

template <typename T>
T from_value(const nlohmann::json& j) {
  if constexpr (std::is_same_v<T, nlohmann::json>) {
    return j;
  } else if constexpr (IsNullable<T>::value) {
    return j.is_null() ? T{} : T{from_value<typename T::value_type>(j)};
  } else if constexpr (HasJson<T>) {
    return T::from_json(j);
  } else if constexpr (NamedEnum<T>) {
    if (j.is_string()) {
      if (const auto v = enum_from_name<T>(j.template get_ref<const nlohmann::json::string_t&>())) return *v;
    }
    throw nlohmann::json::type_error::create(302, "expected one of " + enum_choices<T>() + ", got " + j.dump(), &j);
  } else if constexpr (IsVector<T>::value) {
    T out;
    for (const auto& e : j.template get_ref<const nlohmann::json::array_t&>()) {  // type_error unless an array
      out.push_back(from_value<typename T::value_type>(e));
    }
    return out;
  } else {
    return get_value<T>(j);
  }
}

/// A null that a field of type T reads as "absent" (all but Nullable and raw JSON).
template <typename T>
constexpr bool kNullIsAbsent = !IsNullable<T>::value && !std::is_same_v<T, nlohmann::json>;

/// Writes each field; std::optional ones only when set.
struct Writer {
  nlohmann::json& out;
  template <typename T>
  void operator()(const char* key, const T& v) const {
    if constexpr (IsOptional<T>::value) {
      if (v) out[key] = to_value(*v);
    } else {
      out[key] = to_value(v);
    }
  }
};

/// Reads each field that is present; the others keep their defaults. A type_error is
/// thrown again with the field's name in front of its message ("rank: expected ...").
struct Reader {
  const nlohmann::json& in;
  template <typename T>
  void operator()(const char* key, T& v) const {
    const auto it = in.find(key);
    if (it == in.end()) return;
    try {
      if constexpr (IsOptional<T>::value) {
        using U = typename T::value_type;
        if (it->is_null() && kNullIsAbsent<U>) return;
        v = from_value<U>(*it);
      } else {
        if (it->is_null() && kNullIsAbsent<T>) return;
        v = from_value<T>(*it);
      }
    } catch (const nlohmann::json::type_error& e) {
      throw nlohmann::json::type_error::create(e.id, std::string(key) + ": " + message_of(e), &*it);
    }
  }
};
}  // namespace detail

/// Gives `D` (whose static `fields(self, visit)` names every field once, in one place)
/// its builder and reader. An event kind (D::kKind non-null) also writes "event".
template <typename D>
struct Fields {
  /// Every field, and "event" for an event kind.
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    if constexpr (requires { D::kKind; }) j["event"] = D::kKind;
    D::fields(static_cast<const D&>(*this), detail::Writer{j});
    return j;
  }
  /// Throws nlohmann::json::type_error when `j` is not an object or a field has the
  /// wrong type.
  static D from_json(const nlohmann::json& j) {
    D d;
    j.template get_ref<const nlohmann::json::object_t&>();  // type_error unless an object
    D::fields(d, detail::Reader{j});
    return d;
  }
};

}  // namespace dltrain::json_fields
