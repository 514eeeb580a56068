// Reading TOML (job files, agent configurations, the client's configuration) with one set
// of checks, so that every file dltrain reads rejects a bad value with the same kind of
// message: the dotted key, what was expected, and what was found ("batch_size: expected
// an integer in [1, 65536], got -3"). toml++ does the parsing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "common/enum_names.h"
#include "common/errors.h"

namespace dltrain::toml_fields {

/// Parses TOML text. Throws ConfigError("", "TOML syntax error at line L, column C: ...")
/// for a syntax error. Thread-safe (as is every function here).
toml::table parse(const std::string& text);

/// Parses a TOML file. Throws ConfigError("", "<path>: cannot read it: <reason>") when it
/// cannot be read and ConfigError("", "<path>: TOML syntax error at line L, column C: ...")
/// for a syntax error.
toml::table parse_file(const std::string& path);

/// "a string", "an integer", "a float", "a boolean", "a table", "an array", "a date/time".
std::string type_name(const toml::node& n);

/// The value as written in TOML ("\"two\"", "3", "true"), or its type name for tables etc.
std::string render(const toml::node& n);

/// An integer in [lo, hi]. Throws ConfigError(field, "expected an integer in [lo, hi], got ...").
std::int64_t get_int(const toml::node& n, const std::string& field, std::int64_t lo, std::int64_t hi);

/// A number (integer or float) in the interval from lo to hi, each end open or closed.
/// Throws ConfigError(field, "expected a number in [lo, hi), got ...") or
/// ConfigError(field, "expected a number, got ...").
double get_double(const toml::node& n, const std::string& field, double lo, double hi, bool lo_open,
                  bool hi_open);

/// One of `choices`. Throws ConfigError(field, "expected one of a | b, got \"c\"").
std::string get_choice(const toml::node& n, const std::string& field, std::initializer_list<const char*> choices);

/// A string; an empty one only when `allow_empty`. Throws ConfigError(field, "expected a
/// string, got ...") or ConfigError(field, "must not be empty").
std::string get_string(const toml::node& n, const std::string& field, bool allow_empty = false);

/// true or false. Throws ConfigError(field, "expected true or false, got ...").
bool get_bool(const toml::node& n, const std::string& field);

/// A duration string ("90s", "30m", "1h30m", "500ms") in seconds (the caller checks its
/// range). Throws ConfigError(field, "expected a duration string such as \"<example>\",
/// got ...") for another type, and as parse_duration_seconds (below) does.
double get_duration(const toml::node& n, const std::string& field, const char* example = "30s");

/// A table. Throws ConfigError(field, "expected a table, got ...").
const toml::table& get_table(const toml::node& n, const std::string& field);

/// How one key of a TOML table is read into a `T`: checks `value` and stores it, or
/// throws ConfigError(field, ...). `field` is the dotted key ("compression.ratio").
template <typename T>
using KeyReader = std::function<void(T& out, const toml::node& value, const std::string& field)>;

/// One key a table may hold; `table` marks a key whose value is itself a table (listed
/// as "[key]" in the unknown-key message).
template <typename T>
struct Key {
  std::string name;
  KeyReader<T> read;
  bool table = false;
};

/// Every key of one kind of table, in the order the unknown-key message lists them: the
/// one list of those keys (the job file's tables, job/job_spec.cpp; the agent's
/// configuration has the same form as a map, config/options.cpp).
template <typename T>
using KeyTable = std::vector<Key<T>>;

/// Reads every key of `t` into `out` with its reader from `keys`; `prefix` is the dotted
/// path of `t` ("optimizer." or "" at the top). Throws ConfigError(prefix + key,
/// "unknown key (expected a, b, [c])") for a key `keys` lacks, and what a reader throws.
/// Keys are read in the order toml++ holds them (sorted by name).
template <typename T>
void read_keys(const toml::table& t, const std::string& prefix, const KeyTable<T>& keys, T& out) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const auto it = std::find_if(keys.begin(), keys.end(), [&](const Key<T>& e) { return e.name == k; });
    if (it == keys.end()) {
      std::string expected;
      for (const auto& e : keys) {
        if (!expected.empty()) expected += ", ";
        expected += e.table ? "[" + e.name + "]" : e.name;
      }
      throw ConfigError(prefix + k, "unknown key (expected " + expected + ")");
    }
    it->read(out, node, prefix + k);
  }
}

/// A reader storing an integer in [lo, hi] (get_int) in member `f`.
template <typename T, typename M>
KeyReader<T> int_key(M T::*f, std::int64_t lo, std::int64_t hi) {
  return [f, lo, hi](T& o, const toml::node& n, const std::string& k) { o.*f = static_cast<M>(get_int(n, k, lo, hi)); };
}

/// A reader storing a number in the interval from lo to hi (get_double) in member `f`.
template <typename T>
KeyReader<T> double_key(double T::*f, double lo, double hi, bool lo_open, bool hi_open) {
  return [=](T& o, const toml::node& n, const std::string& k) { o.*f = get_double(n, k, lo, hi, lo_open, hi_open); };
}

/// A reader storing true or false (get_bool) in member `f`.
template <typename T>
KeyReader<T> bool_key(bool T::*f) {
  return [f](T& o, const toml::node& n, const std::string& k) { o.*f = get_bool(n, k); };
}

/// A reader storing one of the names of enum E (common/enum_names.h) in member `f`. Throws
/// ConfigError(field, "expected one of a | b, got \"c\"") for another string or type.
template <typename T, NamedEnum E>
KeyReader<T> enum_key(E T::*f) {
  return [f](T& o, const toml::node& n, const std::string& k) {
    if (!n.is_string()) {
      throw ConfigError(k, "expected one of " + enum_choices<E>() + ", got " + type_name(n) + " " + render(n));
    }
    o.*f = parse_enum<E>(*n.value<std::string>(), k);
  };
}

/// A reader for a key whose value is a table of `keys`, read into member `f`.
template <typename T, typename M>
KeyReader<T> table_key(M T::*f, const KeyTable<M>& keys) {
  return [f, &keys](T& o, const toml::node& n, const std::string& k) { read_keys(get_table(n, k), k + ".", keys, o.*f); };
}

}  // namespace dltrain::toml_fields

namespace dltrain {

/// Parses a duration such as "90s", "30m", "2h", "1h30m", "500ms" into seconds (finite,
/// >= 0). Throws ConfigError(field, ...) on anything else, a number that does not parse
/// ("1.2.3s") and a total too large for a double.
double parse_duration_seconds(const std::string& text, const std::string& field);

/// A duration in words for a person, rounded up: "24 s" under two minutes, else "7 min"
/// (negative counts as 0). For messages and the client's tables.
std::string rough_duration(double seconds);

}  // namespace dltrain
