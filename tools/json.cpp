#include "json.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/json_text.hpp"

namespace kernel_align::cli::json {
namespace {

// Deep enough for any record; shallow enough that hostile input cannot exhaust the stack.
constexpr int kMaxDepth = 256;

// The characters after a backslash other than 'u', and what each stands for.
constexpr std::string_view kEscaped = "\"\\/bfnrt";
constexpr std::string_view kMeaning = "\"\\/\b\f\n\r\t";
// Lower case digits first: the index of a digit is its value, less 6 for upper case.
constexpr std::string_view kHexDigits = "0123456789abcdefABCDEF";

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("the end of the text", next_found());
    return v;
  }

 private:
  [[noreturn]] void fail(std::string expected, std::string found) const {
    const std::string_view before = text_.substr(0, pos_);
    const std::size_t line_start = before.rfind('\n') + 1;  // 0 when there is no newline
    throw SyntaxError(std::move(expected), std::move(found),
                      1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n')),
                      pos_ - line_start + 1);
  }

  std::string next_found() const {
    if (pos_ == text_.size()) return "the end of the text";
    const auto byte = static_cast<unsigned char>(text_[pos_]);
    if (byte >= 0x20 && byte < 0x7F) return std::string{'\'', text_[pos_], '\''};
    char hex[16];
    std::snprintf(hex, sizeof hex, "byte 0x%02x", byte);
    return hex;
  }

  // The next byte; NUL at the end, which no caller accepts as anything.
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() { pos_ = std::min(text_.find_first_not_of(" \t\n\r", pos_), text_.size()); }

  bool accept(char c) {
    if (pos_ == text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  void expect(char c, const char* expected) {
    if (!accept(c)) fail(expected, next_found());
  }

  Value value(int depth) {
    skip_space();
    const char first = peek();
    if (first == '{' || first == '[') {
      if (depth == kMaxDepth) fail("at most 256 nested arrays and objects", "a deeper one");
      return first == '{' ? object(depth + 1) : array(depth + 1);
    }
    Value v;
    if (first == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
    } else if (first == '-' || is_digit(first)) {
      v.kind = Value::Kind::Number;
      v.text = number();
    } else if (accept_word("true")) {
      v.kind = Value::Kind::Boolean;
      v.boolean = true;
    } else if (accept_word("false")) {
      v.kind = Value::Kind::Boolean;
    } else if (!accept_word("null")) {
      fail("a value", next_found());
    }
    return v;
  }

  bool accept_word(std::string_view word) {
    if (!text_.substr(pos_).starts_with(word)) return false;
    pos_ += word.size();
    return true;
  }

  Value object(int depth) {
    Value v;
    v.kind = Value::Kind::Object;
    ++pos_;  // '{'
    skip_space();
    if (accept('}')) return v;
    do {
      skip_space();
      if (peek() != '"') fail("a string key", next_found());
      const std::size_t key_pos = pos_;
      std::string key = string();
      if (v.find(key) != nullptr) {
        pos_ = key_pos;
        fail("keys that differ", "key '" + key + "' again");
      }
      skip_space();
      expect(':', "':'");
      v.members.push_back({std::move(key), value(depth)});
      skip_space();
    } while (accept(','));
    expect('}', "',' or '}'");
    return v;
  }

  Value array(int depth) {
    Value v;
    v.kind = Value::Kind::Array;
    ++pos_;  // '['
    skip_space();
    if (accept(']')) return v;
    do {
      v.items.push_back(value(depth));
      skip_space();
    } while (accept(','));
    expect(']', "',' or ']'");
    return v;
  }

  void digits() {
    if (!is_digit(peek())) fail("a digit", next_found());
    while (is_digit(peek())) ++pos_;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  std::string number() {
    const std::size_t start = pos_;
    accept('-');
    if (!accept('0')) digits();
    if (accept('.')) digits();
    if (accept('e') || accept('E')) {
      if (!accept('+')) accept('-');
      digits();
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const std::size_t digit = kHexDigits.find(peek());
      if (digit == kHexDigits.npos) fail("a hex digit", next_found());
      code = code * 16 + static_cast<unsigned>(digit < 16 ? digit : digit - 6);
    }
    return code;
  }

  // The code point of a \u escape (pos_ just after the 'u'), joining a surrogate pair.
  unsigned code_point() {
    const unsigned code = hex4();
    if (code >= 0xDC00 && code <= 0xDFFF) fail("a high surrogate first", "a lone low surrogate");
    if (code < 0xD800 || code > 0xDBFF) return code;
    if (!accept_word("\\u")) fail("a low surrogate after a high one", next_found());
    const unsigned low = hex4();
    if (low < 0xDC00 || low > 0xDFFF)
      fail("a low surrogate after a high one", "a lone high surrogate");
    return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
  }

  static void append_utf8(std::string& out, unsigned code) {
    const auto byte = [](unsigned b) { return static_cast<char>(b); };
    if (code < 0x80) {
      out += byte(code);
    } else if (code < 0x800) {
      out += {byte(0xC0 | code >> 6), byte(0x80 | (code & 0x3F))};
    } else if (code < 0x10000) {
      out += {byte(0xE0 | code >> 12), byte(0x80 | (code >> 6 & 0x3F)), byte(0x80 | (code & 0x3F))};
    } else {
      out += {byte(0xF0 | code >> 18), byte(0x80 | (code >> 12 & 0x3F)),
              byte(0x80 | (code >> 6 & 0x3F)), byte(0x80 | (code & 0x3F))};
    }
  }

  std::string string() {
    ++pos_;  // '"'
    std::string s;
    while (!accept('"')) {
      if (pos_ == text_.size()) fail("a closing '\"'", next_found());
      if (static_cast<unsigned char>(peek()) < 0x20) {
        fail("an escape for a control character", next_found());
      }
      const char c = text_[pos_++];
      if (c != '\\') {
        s += c;
        continue;
      }
      if (const std::size_t escape = kEscaped.find(peek()); escape != kEscaped.npos) {
        s += kMeaning[escape];
        ++pos_;
      } else if (accept('u')) {
        append_utf8(s, code_point());
      } else {
        fail("one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX", next_found());
      }
    }
    return s;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

void append_compact(std::string& out, const Value& v) {
  using Kind = Value::Kind;
  if (v.kind == Kind::Array || v.kind == Kind::Object) {
    const bool is_object = v.kind == Kind::Object;
    const std::size_t size = is_object ? v.members.size() : v.items.size();
    out += is_object ? '{' : '[';
    for (std::size_t i = 0; i < size; ++i) {
      if (i > 0) out += ',';
      if (is_object) {
        append_json_string(out, v.members[i].key);
        out += ':';
      }
      append_compact(out, is_object ? v.members[i].value : v.items[i]);
    }
    out += is_object ? '}' : ']';
  } else if (v.kind == Kind::String) {
    append_json_string(out, v.text);
  } else if (v.kind == Kind::Number) {
    out += v.text;
  } else {
    out += v.kind == Kind::Null ? "null" : v.boolean ? "true" : "false";
  }
}

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const Member& m : members) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

SyntaxError::SyntaxError(std::string expected, std::string found, std::size_t line,
                         std::size_t column)
    : std::runtime_error("line " + std::to_string(line) + ", column " + std::to_string(column) +
                         ": expected " + expected + ", found " + found),
      expected_(std::move(expected)),
      found_(std::move(found)),
      line_(line),
      column_(column) {}

Value parse(std::string_view text) {
  return Parser(text).document();
}

std::string compact(const Value& value) {
  std::string out;
  append_compact(out, value);
  return out;
}

}  // namespace kernel_align::cli::json
