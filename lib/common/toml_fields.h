// Reading TOML (job files, agent configurations, the client's configuration) with one set
// of checks, so that every file dltrain reads rejects a bad value with the same kind of
// message: the dotted key, what was expected, and what was found ("batch_size: expected
// an integer in [1, 65536], got -3"). toml++ does the parsing.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <toml++/toml.h>

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

}  // namespace dltrain::toml_fields

namespace dltrain {

/// Parses a duration such as "90s", "30m", "2h", "1h30m", "500ms" into seconds (finite,
/// >= 0). Throws ConfigError(field, ...) on anything else, a number that does not parse
/// ("1.2.3s") and a total too large for a double.
double parse_duration_seconds(const std::string& text, const std::string& field);

}  // namespace dltrain
