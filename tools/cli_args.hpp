// Command-line flags: every flag takes one value, as `--name value` or `--name=value`.
// Every malformed argument raises kernel_align::Error naming the flag.
#pragma once

#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/registry.hpp"
#include "messages.hpp"

namespace kernel_align::cli {

// "single|diffusers": the names an enumerated option of `op` accepts (its descriptor's),
// for usage lines.
std::string choices_usage(OpType op, std::string_view option);

struct FlagSpec {
  std::string_view name;  // "--x"
  bool repeatable = false;
  bool file = false;  // the value names a file the command reads or writes
};

// A flag whose value is a file path.
constexpr FlagSpec file_flag(std::string_view name) {
  return {name, false, true};
}

class Args {
 public:
  // Every token must be a flag of `flags` followed by its value.
  Args(std::span<const std::string> tokens, std::span<const FlagSpec> flags);

  bool has(std::string_view flag) const { return values_.contains(flag); }
  const std::string& required(std::string_view flag) const;
  std::optional<std::string> optional(std::string_view flag) const;
  // Every value of a repeatable flag, in command-line order; empty when absent.
  std::vector<std::string> all(std::string_view flag) const;

  // (flag, path) for every value of a file flag, in flag order.
  std::vector<std::pair<std::string, std::string>> file_paths() const;

  // The flags of `base` followed by `extra`: commands that share flags compose them.
  static std::vector<FlagSpec> flags(std::span<const FlagSpec> base,
                                     std::initializer_list<FlagSpec> extra);

 private:
  std::map<std::string, std::vector<std::string>, std::less<>> values_;
  std::vector<std::string> file_flags_;  // of the flags given, those that name files
};

// Whether all of `text` is one number, stored into `value`.
template <class Number>
bool parse_whole(std::string_view text, Number& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end;
}

// Strict number parsing: the whole text must be the number, in range.
template <class Int>
Int parse_int(std::string_view flag, std::string_view text) {
  Int value = 0;
  if (!parse_whole(text, value)) {
    throw Error(std::string(flag), "a " + std::to_string(8 * sizeof(Int)) + "-bit integer",
                single_quoted(text));
  }
  return value;
}
// A finite number that fits fp32 (kernel_align::fp32_option): its overflow or underflow
// is said as such.
float parse_finite_float(std::string_view flag, std::string_view text);
// "16,56,56"
std::vector<int> parse_int_list(std::string_view flag, std::string_view text);

// One of a fixed set of words, e.g. {{"half", Pairing::Half}, ...}.
template <class T>
T parse_choice(std::string_view flag, std::string_view text,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  throw Error(std::string(flag), "one of " + names, single_quoted(text));
}

}  // namespace kernel_align::cli
