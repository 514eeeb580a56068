#include "common/toml_fields.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <map>
#include <string>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace dltrain::toml_fields {
namespace {

std::string syntax_error(const toml::parse_error& e) {
  std::ostringstream os;
  os << "TOML syntax error at line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
     << e.description();
  return os.str();
}

// toml++ 3.3 (Debian 12's) reaches __builtin_unreachable() — undefined behaviour — when
// it asks whether some non-ASCII characters are whitespace: its generated table misses
// U+00A1–U+0499 and others (marzer/tomlplusplus issues 190 and 295, fixed upstream after
// 3.3). It asks in many places of its grammar, some only on malformed text (a value
// followed by a quote, `a = 0"é"`, reads the quote and what follows as part of the value),
// so no check of where a character stands can follow it everywhere; the long fuzz runs
// kept finding new places (docs/benchmarks/fuzzing.md, "Fuzzing"). So toml++ is given ASCII only,
// with the same meaning: a non-ASCII character in a basic string becomes its \uXXXX (or
// \UXXXXXXXX) escape; a literal string is rewritten as the basic string with the same
// value; a non-ASCII character in a comment is dropped; one anywhere else is a syntax
// error in TOML 1.0 (bare keys and values are ASCII) and is refused here with its line.
// Lines are kept, so toml++'s line numbers stay right (its columns count the escapes).
// Text that is not valid UTF-8 is refused with its line, as toml++ would. On valid TOML
// the rewritten text has the same tables, keys and values; malformed TOML stays malformed.
std::string ascii_for_toml(const std::string& text) {
  enum class In { kNothing, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } in = In::kNothing;
  int line = 1;
  const std::size_t n = text.size();
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto at = [&](std::size_t i, const char* three) { return text.compare(i, 3, three) == 0; };
  const auto refuse = [&](const std::string& what) {
    throw ConfigError("", "TOML syntax error at line " + std::to_string(line) + ": " + what);
  };
  // The code point whose UTF-8 encoding starts at text[i]; i is left on its last byte.
  const auto decode = [&](std::size_t& i) {
    const unsigned char b0 = byte(i);
    const std::size_t len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
    if (b0 < 0xC2 || b0 > 0xF4 || i + len > n) refuse("text that is not valid UTF-8");
    char32_t cp = b0 & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
    for (std::size_t k = 1; k < len; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) refuse("text that is not valid UTF-8");
      cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    const char32_t least = len == 4 ? 0x10000 : len == 3 ? 0x800 : 0x80;
    if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) refuse("text that is not valid UTF-8");
    i += len - 1;
    return cp;
  };
  std::string out;
  out.reserve(n + n / 4);
  const auto escape = [&](std::size_t& i) {
    const char32_t cp = decode(i);
    char buf[16];
    std::snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", static_cast<unsigned>(cp));
    out += buf;
  };
  // A character of a literal string, inside the basic string that replaces it.
  const auto literal_char = [&](std::size_t& i) {
    const unsigned char c = byte(i);
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x80) {
      escape(i);
    } else {
      out += static_cast<char>(c);
    }
  };
  std::size_t i = 0;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // a byte-order mark, which toml++ skips too
  for (; i < n; ++i) {
    const unsigned char c = byte(i);
    if (c == '\n') ++line;
    switch (in) {
      case In::kNothing:
        if (c == '#') {
          in = In::kComment;
          out += '#';
        } else if (at(i, "\"\"\"") || at(i, "'''")) {
          in = c == '"' ? In::kMultiBasic : In::kMultiLiteral;
          out += "\"\"\"";
          i += 2;
        } else if (c == '"' || c == '\'') {
          in = c == '"' ? In::kBasic : In::kLiteral;
          out += '"';
        } else if (c >= 0x80) {
          refuse("a non-ASCII character outside a string or comment (keys and values are ASCII; quote it)");
        } else {
          out += static_cast<char>(c);
        }
        break;
      case In::kComment:
        if (c == '\n') in = In::kNothing;
        if (c >= 0x80) {
          decode(i);  // checked, then dropped: a comment means nothing
        } else {
          out += static_cast<char>(c);
        }
        break;
      case In::kBasic:
      case In::kMultiBasic:
        if (c == '\\') {
          out += '\\';
          if (i + 1 < n) {
            if (byte(i + 1) >= 0x80) refuse("a non-ASCII character right after a backslash (not an escape)");
            if (byte(i + 1) == '\n') ++line;
            out += text[++i];  // the escaped character (or a line-ending backslash's newline)
          }
        } else if (in == In::kBasic && (c == '"' || c == '\n')) {
          in = In::kNothing;
          out += static_cast<char>(c);
        } else if (in == In::kMultiBasic && at(i, "\"\"\"")) {
          // Up to two more quotes belong to the string ("""a""""" holds a"").
          std::size_t more = 0;
          while (more < 2 && i + 3 + more < n && text[i + 3 + more] == '"') ++more;
          out.append(3 + more, '"');
          in = In::kNothing;
          i += 2 + more;
        } else if (c >= 0x80) {
          escape(i);
        } else {
          out += static_cast<char>(c);
        }
        break;
      case In::kLiteral:
        if (c == '\'') {
          in = In::kNothing;
          out += '"';
        } else if (c == '\n') {
          in = In::kNothing;  // unterminated, and left so for toml++ to report
          out += '\n';
        } else {
          literal_char(i);
        }
        break;
      case In::kMultiLiteral:
        if (at(i, "'''")) {
          // Up to two more quotes belong to the string ('''a''''' holds a'').
          std::size_t more = 0;
          while (more < 2 && i + 3 + more < n && text[i + 3 + more] == '\'') ++more;
          out.append(more, '\'');
          out += "\"\"\"";
          in = In::kNothing;
          i += 2 + more;
        } else {
          literal_char(i);
        }
        break;
    }
  }
  return out;
}

}  // namespace

toml::table parse(const std::string& text) {
  const std::string ascii = ascii_for_toml(text);
  try {
    return toml::parse(ascii);
  } catch (const toml::parse_error& e) {
    throw ConfigError("", syntax_error(e));
  }
}

toml::table parse_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("", path + ": cannot read it: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string ascii;
  try {
    ascii = ascii_for_toml(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError("", path + ": " + e.what());
  }
  try {
    return toml::parse(ascii, path);
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

namespace dltrain {

double parse_duration_seconds(const std::string& text, const std::string& field) {
  static const std::map<std::string, double> units{
      {"ms", 1e-3}, {"s", 1.0}, {"m", 60.0}, {"h", 3600.0}, {"d", 86400.0}};
  double total = 0;
  std::size_t i = 0;
  bool any = false;
  const auto bad = [&] {
    return ConfigError(field, "expected a duration such as \"90s\", \"30m\" or \"1h30m\", got \"" + text + "\"");
  };
  while (i < text.size()) {
    std::size_t j = i;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
    std::size_t k = j;
    while (k < text.size() && std::isalpha(static_cast<unsigned char>(text[k]))) ++k;
    auto unit = units.find(text.substr(j, k - j));
    if (j == i || unit == units.end()) throw bad();
    // The whole number must parse ("1.2.3s" and ".s" do not), and fit a double.
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    if (ec != std::errc() || end != text.data() + j) throw bad();
    total += v * unit->second;
    any = true;
    i = k;
  }
  if (!any) throw ConfigError(field, "expected a duration such as \"30m\", got an empty string");
  if (!std::isfinite(total)) throw ConfigError(field, "the duration \"" + text + "\" is too long");
  return total;
}

std::string rough_duration(double seconds) {
  seconds = std::max(0.0, seconds);
  return seconds < 120 ? std::to_string(static_cast<long>(std::ceil(seconds))) + " s"
                       : std::to_string(static_cast<long>(std::ceil(seconds / 60))) + " min";
}

}  // namespace dltrain
