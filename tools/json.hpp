// A small, strict JSON reader (RFC 8259): what `kernel-align trace diff` needs to read
// trace records, with errors that say where the text went wrong.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kernel_align::cli::json {

struct Member;

struct Value {
  enum class Kind : unsigned char { Null, Boolean, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  // A string's characters (UTF-8), or a number as written: numbers are compared and
  // printed, never computed with, so their text is kept exactly.
  std::string text;
  std::vector<Value> items;     // an array's elements
  std::vector<Member> members;  // an object's members, in document order, keys unique

  // The member named `key`, or null (also when this is not an object).
  const Value* find(std::string_view key) const;
};

struct Member {
  std::string key;
  Value value;
};

// Where and why a text is not JSON. Line and column count from 1; the column in bytes.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(std::string expected, std::string found, std::size_t line, std::size_t column);

  const std::string& expected() const { return expected_; }
  const std::string& found() const { return found_; }
  std::size_t line() const { return line_; }
  std::size_t column() const { return column_; }

 private:
  std::string expected_;
  std::string found_;
  std::size_t line_;
  std::size_t column_;
};

// The one value `text` holds, with optional whitespace around it. Duplicate keys and
// nesting deeper than 256 levels are errors too.
Value parse(std::string_view text);

// `value` as compact JSON: no whitespace, numbers as written.
std::string compact(const Value& value);

}  // namespace kernel_align::cli::json
