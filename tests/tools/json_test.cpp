// The JSON reader of trace diff: strict RFC 8259, numbers kept as written, errors placed.
#include "json.hpp"

#include <gtest/gtest.h>

#include <string>

namespace kernel_align::cli::json {
namespace {

using Kind = Value::Kind;

TEST(Json, ReadsEveryKindOfValue) {
  const Value v = parse(R"( {"n": null, "t": true, "f": false, "x": -1.5e+3, "s": "hi",
                             "a": [1, [], {}], "o": {"k": "v"}} )");
  ASSERT_EQ(v.kind, Kind::Object);
  ASSERT_EQ(v.members.size(), 7u);
  EXPECT_EQ(v.find("n")->kind, Kind::Null);
  EXPECT_EQ(v.find("t")->kind, Kind::Boolean);
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_FALSE(v.find("f")->boolean);
  EXPECT_EQ(v.find("x")->kind, Kind::Number);
  EXPECT_EQ(v.find("s")->text, "hi");
  ASSERT_EQ(v.find("a")->items.size(), 3u);
  EXPECT_EQ(v.find("a")->items[1].kind, Kind::Array);
  EXPECT_EQ(v.find("a")->items[2].kind, Kind::Object);
  EXPECT_EQ(v.find("o")->find("k")->text, "v");
  EXPECT_EQ(v.find("absent"), nullptr);
  EXPECT_EQ(v.find("s")->find("s"), nullptr);  // not an object
}

TEST(Json, KeepsMemberOrderAndNumbersAsWritten) {
  const std::string record =
      R"({"seq":3,"op":"qk_rmsnorm","eps":9.99999997e-07,"zero":-0,"big":18446744073709551616,)"
      R"("tensors":[{"name":"x","shape":[2,16,2,128]}],"fallback":null,"ftz":false})";
  const Value v = parse(record);
  ASSERT_EQ(v.members.size(), 8u);
  EXPECT_EQ(v.members[0].key, "seq");
  EXPECT_EQ(v.members[7].key, "ftz");
  EXPECT_EQ(v.find("eps")->text, "9.99999997e-07");
  EXPECT_EQ(v.find("big")->text, "18446744073709551616");
  EXPECT_EQ(compact(v), record);
  EXPECT_EQ(compact(parse(" [ 1 ,\n\t{ \"a\" : [ ] } ]\r\n")), R"([1,{"a":[]}])");
}

TEST(Json, DecodesEscapesAndEncodesThemBack) {
  const Value v = parse(R"("q\"b\\s\/ \b\f\n\r\t \u0041\u00e9\u20ac\ud83d\ude00")");
  EXPECT_EQ(v.text, "q\"b\\s/ \b\f\n\r\t A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(compact(v), R"("q\"b\\s/ \u0008\u000c\u000a\u000d\u0009 A)"
                        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
  EXPECT_EQ(parse(compact(v)).text, v.text);
}

// The error names the line and column (from 1) of the first byte that cannot be JSON.
void expect_syntax_error(const std::string& text, std::size_t line, std::size_t column,
                         const std::string& expected, const std::string& found) {
  try {
    parse(text);
    ADD_FAILURE() << "accepted " << text;
  } catch (const SyntaxError& e) {
    EXPECT_EQ(e.line(), line) << text << ": " << e.what();
    EXPECT_EQ(e.column(), column) << text << ": " << e.what();
    EXPECT_EQ(e.expected(), expected) << text;
    EXPECT_EQ(e.found(), found) << text;
  }
}

TEST(Json, PlacesErrorsByLineAndColumn) {
  expect_syntax_error("{\n  \"a\": 1,\n  \"b\" 2\n}", 3, 7, "':'", "'2'");
  expect_syntax_error(R"({"seq":1,)", 1, 10, "a string key", "the end of the text");
  expect_syntax_error("[1,\n2", 2, 2, "',' or ']'", "the end of the text");
  expect_syntax_error(R"({"a":1 "b":2})", 1, 8, "',' or '}'", "'\"'");
  expect_syntax_error("", 1, 1, "a value", "the end of the text");
  expect_syntax_error("\"tab\there\"", 1, 5, "an escape for a control character", "byte 0x09");
}

TEST(Json, RejectsWhatIsNotStrictJson) {
  expect_syntax_error("[1,]", 1, 4, "a value", "']'");
  expect_syntax_error(R"({"a":1,})", 1, 8, "a string key", "'}'");
  expect_syntax_error("{'a':1}", 1, 2, "a string key", "'''");
  expect_syntax_error("01", 1, 2, "the end of the text", "'1'");
  expect_syntax_error("1.", 1, 3, "a digit", "the end of the text");
  expect_syntax_error(".5", 1, 1, "a value", "'.'");
  expect_syntax_error("+1", 1, 1, "a value", "'+'");
  expect_syntax_error("1e", 1, 3, "a digit", "the end of the text");
  expect_syntax_error("-", 1, 2, "a digit", "the end of the text");
  expect_syntax_error("NaN", 1, 1, "a value", "'N'");
  expect_syntax_error("tru", 1, 1, "a value", "'t'");
  expect_syntax_error("nullx", 1, 5, "the end of the text", "'x'");
  expect_syntax_error("1 2", 1, 3, "the end of the text", "'2'");
  expect_syntax_error(R"("\x")", 1, 3, R"(one of \" \\ \/ \b \f \n \r \t \uXXXX)", "'x'");
  expect_syntax_error(R"("\u12g4")", 1, 6, "a hex digit", "'g'");
  expect_syntax_error(R"("\ude00")", 1, 8, "a high surrogate first", "a lone low surrogate");
  expect_syntax_error(R"("\ud83d x")", 1, 8, "a low surrogate after a high one", "' '");
  expect_syntax_error(R"("abc)", 1, 5, "a closing '\"'", "the end of the text");
  expect_syntax_error(R"({"k":1,"k":2})", 1, 8, "keys that differ", "key 'k' again");
}

TEST(Json, BoundsNesting) {
  EXPECT_NO_THROW(parse(std::string(256, '[') + std::string(256, ']')));
  expect_syntax_error(std::string(257, '[') + std::string(257, ']'), 1, 257,
                      "at most 256 nested arrays and objects", "a deeper one");
}

}  // namespace
}  // namespace kernel_align::cli::json
