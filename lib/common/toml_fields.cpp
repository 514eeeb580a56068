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

// toml++ 3.3 (Debian 12's) reaches __builtin_unreachable() — undefined behaviour — when
// it asks whether some non-ASCII characters are whitespace (its generated table misses
// U+00A1–U+0499 and others; marzer/tomlplusplus issues 190 and 295, fixed upstream after
// 3.3). It asks in two places only: outside strings and comments, where a non-ASCII
// character is a syntax error anyway, and in a multi-line basic string ("""...""") right
// after a backslash or after a line-ending backslash's whitespace. Such text is refused
// here, before toml++ sees it, with the line it is on. Strings and comments may hold any
// UTF-8 elsewhere. A third place showed up under fuzzing: a quote where no string can
// start (right after a value, as in `a = 0"é"`) is read by toml++ as part of the value
// it is parsing, and what follows is asked about too. In valid TOML a string starts only
// after `=`, `[`, `,`, `{`, `.` or at the start of a line (spaces and tabs aside), so
// after any other quote — a syntax error whatever follows — every non-ASCII character
// is refused as well.
void refuse_what_toml_mishandles(const std::string& text) {
  enum class In { kNothing, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } in = In::kNothing;
  int line = 1;
  char before = '\n';     // the last character outside strings and comments, spaces and tabs aside
  int stray_quote = 0;    // the line of the first quote where no string can start, 0 if none
  const auto string_can_start = [&] { return std::strchr("=[,{.\n", before) != nullptr; };
  const auto at = [&](std::size_t i, const char* three) { return text.compare(i, 3, three) == 0; };
  const auto refuse = [&](const char* where) {
    throw ConfigError("", "TOML syntax error at line " + std::to_string(line) + ": a non-ASCII character " + where);
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') ++line;
    if (stray_quote != 0 && c >= 0x80) {
      refuse(("after a quote where no string can start (line " + std::to_string(stray_quote) + ")").c_str());
    }
    if (in == In::kNothing && (c == '"' || c == '\'') && !string_can_start()) stray_quote = line;
    if (in == In::kNothing && c != ' ' && c != '\t') before = static_cast<char>(c);
    switch (in) {
      case In::kNothing:
        if (c == '#') {
          in = In::kComment;
        } else if (at(i, "\"\"\"")) {
          in = In::kMultiBasic;
          i += 2;
        } else if (at(i, "'''")) {
          in = In::kMultiLiteral;
          i += 2;
        } else if (c == '"') {
          in = In::kBasic;
        } else if (c == '\'') {
          in = In::kLiteral;
        } else if (c >= 0x80) {
          refuse("outside a string or comment (keys and values are ASCII; quote it)");
        }
        break;
      case In::kComment:
        if (c == '\n') in = In::kNothing, before = '\n';
        break;
      case In::kBasic:
        if (c == '\\') {
          ++i;  // an escaped character, never a quote
        } else if (c == '"' || c == '\n') {
          in = In::kNothing;
          if (c == '\n') before = '\n';
        }
        break;
      case In::kLiteral:
        if (c == '\'' || c == '\n') in = In::kNothing, before = static_cast<char>(c);
        break;
      case In::kMultiBasic:
        if (c == '\\') {
          std::size_t j = i + 1;
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) {
            if (text[j] == '\n') ++line;
            ++j;
          }
          if (j < text.size() && static_cast<unsigned char>(text[j]) >= 0x80) {
            refuse("right after a backslash or a line-ending backslash in a multi-line string (write it as \\uXXXX)");
          }
          // An escape consumes one character; a line-ending backslash its whitespace.
          i = j > i + 1 ? j - 1 : i + 1;
        } else if (at(i, "\"\"\"")) {
          in = In::kNothing;
          i += 2;
          // Up to two more quotes belong to the string (""""" ends one holding "").
          for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == '"'; ++k) ++i;
        }
        break;
      case In::kMultiLiteral:
        if (at(i, "'''")) {
          in = In::kNothing;
          i += 2;
          for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == '\''; ++k) ++i;
        }
        break;
    }
  }
}

}  // namespace

toml::table parse(const std::string& text) {
  refuse_what_toml_mishandles(text);
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
  const std::string text = ss.str();
  try {
    refuse_what_toml_mishandles(text);
  } catch (const ConfigError& e) {
    throw ConfigError("", path + ": " + e.what());
  }
  try {
    return toml::parse(text, path);
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
