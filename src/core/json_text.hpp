// JSON string literals, for the trace writer (src/trace) and the CLI's JSON output
// (tools/json.cpp): quotes and backslashes escaped, control characters as \u00XX.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace kernel_align {

inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace kernel_align
