#include "common/toml_fields.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "common/job_spec.h"

namespace dltrain::toml_fields {
namespace {

std::string syntax_error(const toml::parse_error& e) {
  std::ostringstream os;
  os << "TOML syntax error at line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
     << e.description();
  return os.str();
}

}  // namespace

toml::table parse(const std::string& text) {
  try {
    return toml::parse(text);
  } catch (const toml::parse_error& e) {
    throw ConfigError("", syntax_error(e));
  }
}

toml::table parse_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("", path + ": cannot read it: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    throw ConfigError("", path + ": " + syntax_error(e));
  }
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::string render(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.value<std::string>().value_or("") << '"';
  } else if (n.is_integer()) {
    os << *n.value<std::int64_t>();
  } else if (n.is_floating_point()) {
    os << *n.value<double>();
  } else if (n.is_boolean()) {
    os << (*n.value<bool>() ? "true" : "false");
  } else {
    os << type_name(n);
  }
  return os.str();
}

std::int64_t get_int(const toml::node& n, const std::string& field, std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!n.is_integer()) throw ConfigError(field, "expected an integer in " + range + ", got " + type_name(n) + " " + render(n));
  const auto v = *n.value<std::int64_t>();
  if (v < lo || v > hi) throw ConfigError(field, "expected an integer in " + range + ", got " + std::to_string(v));
  return v;
}

double get_double(const toml::node& n, const std::string& field, double lo, double hi, bool lo_open, bool hi_open) {
  if (!n.is_number()) throw ConfigError(field, "expected a number, got " + type_name(n) + " " + render(n));
  const double v = *n.value<double>();
  const bool bad = !std::isfinite(v) || (lo_open ? v <= lo : v < lo) || (hi_open ? v >= hi : v > hi);
  if (bad) {
    std::ostringstream os;
    os << "expected a number in " << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]") << ", got "
       << v;
    throw ConfigError(field, os.str());
  }
  return v;
}

std::string get_choice(const toml::node& n, const std::string& field, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) list += (list.empty() ? "" : " | ") + std::string(c);
  if (!n.is_string()) throw ConfigError(field, "expected one of " + list + ", got " + type_name(n) + " " + render(n));
  const auto v = *n.value<std::string>();
  for (const char* c : choices) {
    if (v == c) return v;
  }
  throw ConfigError(field, "expected one of " + list + ", got \"" + v + "\"");
}

std::string get_string(const toml::node& n, const std::string& field, bool allow_empty) {
  if (!n.is_string()) throw ConfigError(field, "expected a string, got " + type_name(n) + " " + render(n));
  auto v = *n.value<std::string>();
  if (v.empty() && !allow_empty) throw ConfigError(field, "must not be empty");
  return v;
}

bool get_bool(const toml::node& n, const std::string& field) {
  if (!n.is_boolean()) throw ConfigError(field, "expected true or false, got " + type_name(n) + " " + render(n));
  return *n.value<bool>();
}

double get_duration(const toml::node& n, const std::string& field, const char* example) {
  if (!n.is_string()) {
    throw ConfigError(field, std::string("expected a duration string such as \"") + example + "\", got " +
                                 type_name(n) + " " + render(n));
  }
  return parse_duration_seconds(*n.value<std::string>(), field);
}

const toml::table& get_table(const toml::node& n, const std::string& field) {
  if (!n.is_table()) throw ConfigError(field, "expected a table, got " + type_name(n));
  return *n.as_table();
}

}  // namespace dltrain::toml_fields
