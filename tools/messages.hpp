// Helpers for the text of error messages.
#pragma once

#include <string>
#include <string_view>

namespace kernel_align::cli {

// 'text', as messages show a value the user gave. (Appended piece by piece: g++ 12
// at -O2 and above raises a false -Wrestrict on "'" + std::string.)
inline std::string single_quoted(std::string_view text) {
  std::string quoted;
  quoted.reserve(text.size() + 2);
  quoted += '\'';
  quoted += text;
  quoted += '\'';
  return quoted;
}

}  // namespace kernel_align::cli
