// The .npy reader and writer: round trips, the exact bytes NumPy expects, and one
// test per way a file can be malformed.
#include "npy.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_align/error.hpp"

namespace kernel_align::cli {
namespace {

// A .npy file assembled by hand, independently of encode_npy: magic, version
// major.0, the header length (2 bytes for 1.x, 4 for later versions), the header
// text, then `data`.
std::vector<std::byte> npy_file(int major, std::string_view header,
                                const std::vector<std::byte>& data) {
  std::vector<std::byte> file;
  for (const unsigned char c : std::string_view("\x93NUMPY")) file.push_back(std::byte{c});
  file.push_back(static_cast<std::byte>(major));
  file.push_back(std::byte{0});
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  for (std::size_t i = 0; i < length_bytes; ++i) {
    file.push_back(static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF));
  }
  for (const char c : header) file.push_back(static_cast<std::byte>(c));
  file.insert(file.end(), data.begin(), data.end());
  return file;
}

std::vector<std::byte> counting_bytes(std::size_t n) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
  return bytes;
}

std::string header(std::string_view descr, std::string_view shape) {
  return "{'descr': '" + std::string(descr) +
         "', 'fortran_order': False, 'shape': " + std::string(shape) + ", }\n";
}

// parse_npy must throw an Error naming "--x" whose message contains every one of `parts`.
void expect_rejected(const std::vector<std::byte>& file, std::initializer_list<std::string> parts) {
  try {
    parse_npy(file, "--x", "x.npy");
    ADD_FAILURE() << "accepted a malformed file";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "--x");
    const std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << message << "\nlacks: " << part;
    }
  }
}

struct TypeCase {
  NpyType type;
  const char* descr;
  std::size_t size;
};

constexpr TypeCase kTypes[] = {{NpyType::F32, "<f4", 4},
                               {NpyType::F16, "<f2", 2},
                               {NpyType::BF16, "<u2", 2},
                               {NpyType::I32, "<i4", 4},
                               {NpyType::Bool, "|b1", 1}};

TEST(NpyTest, EncodeThenParseRoundTripsEveryTypeAndRank) {
  const std::vector<std::vector<std::int64_t>> shapes{{}, {5}, {2, 3}, {2, 1, 3}, {2, 3, 1, 4}};
  for (const TypeCase& t : kTypes) {
    for (const auto& shape : shapes) {
      NpyArray array = make_npy_array(t.type, shape);
      ASSERT_EQ(array.data.size(), static_cast<std::size_t>(array.numel()) * t.size);
      array.data = counting_bytes(array.data.size());
      const NpyArray back = parse_npy(encode_npy(array), "--x", "x.npy");
      EXPECT_EQ(back.type, t.type) << t.descr;
      EXPECT_EQ(back.shape, shape) << t.descr;
      EXPECT_EQ(back.data, array.data) << t.descr;
    }
  }
}

TEST(NpyTest, WriterEmitsVersion1WithDataAlignedTo64Bytes) {
  for (const TypeCase& t : kTypes) {
    for (const std::vector<std::int64_t>& shape :
         std::vector<std::vector<std::int64_t>>{{7}, {7145, 3}, {1, 45, 24, 128}}) {
      NpyArray array = make_npy_array(t.type, shape);
      const std::vector<std::byte> file = encode_npy(array);
      ASSERT_GE(file.size(), 10u);
      EXPECT_EQ(std::to_integer<int>(file[6]), 1);
      EXPECT_EQ(std::to_integer<int>(file[7]), 0);
      const std::size_t header_size =
          std::to_integer<std::size_t>(file[8]) | (std::to_integer<std::size_t>(file[9]) << 8);
      const std::size_t data_start = 10 + header_size;
      EXPECT_EQ(data_start % 64, 0u);
      EXPECT_EQ(file.size() - data_start, array.data.size());
      EXPECT_EQ(std::to_integer<char>(file[data_start - 1]), '\n');
    }
  }
}

TEST(NpyTest, WriterHeaderIsTheDictNumPyWrites) {
  const std::vector<std::byte> file = encode_npy(make_npy_array(NpyType::F32, {2, 3}));
  // 10 preamble bytes + this 61-character dict + '\n' need two 64-byte blocks.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string expected = dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  ASSERT_EQ(file.size(), 128u + 6u * 4u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.data()) + 10, expected.size()),
            expected);
}

TEST(NpyTest, ReadsEveryTypeInEveryHeaderVersion) {
  for (const int major : {1, 2, 3}) {
    for (const TypeCase& t : kTypes) {
      const std::vector<std::byte> data = counting_bytes(6 * t.size);
      const NpyArray array =
          parse_npy(npy_file(major, header(t.descr, "(2, 3)"), data), "--x", "x");
      EXPECT_EQ(array.type, t.type) << major << t.descr;
      EXPECT_EQ(array.shape, (std::vector<std::int64_t>{2, 3}));
      EXPECT_EQ(array.data, data);
    }
  }
}

TEST(NpyTest, ReadsAnyKeyOrderQuotesAndSpacing) {
  const std::vector<std::byte> data = counting_bytes(4 * 4);
  const NpyArray array = parse_npy(
      npy_file(1, "{\"shape\":(4,),\"fortran_order\" : False,'descr':\"<i4\"}", data), "--x", "x");
  EXPECT_EQ(array.type, NpyType::I32);
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(array.data, data);
}

TEST(NpyTest, ReadsAScalar) {
  const NpyArray array = parse_npy(npy_file(1, header("<f4", "()"), counting_bytes(4)), "--x", "x");
  EXPECT_TRUE(array.shape.empty());
  EXPECT_EQ(array.numel(), 1);
}

TEST(NpyTest, RejectsBadMagic) {
  std::vector<std::byte> file = npy_file(1, header("<f4", "(1,)"), counting_bytes(4));
  file[1] = std::byte{'X'};
  expect_rejected(file, {"\\x93NUMPY", "'x.npy'"});
  expect_rejected({}, {"\\x93NUMPY"});
}

TEST(NpyTest, RejectsTruncatedPreamble) {
  const std::vector<std::byte> file = npy_file(1, header("<f4", "(1,)"), counting_bytes(4));
  expect_rejected({file.begin(), file.begin() + 8}, {"truncated"});
  const std::vector<std::byte> v2 = npy_file(2, header("<f4", "(1,)"), counting_bytes(4));
  expect_rejected({v2.begin(), v2.begin() + 11}, {"truncated"});
}

TEST(NpyTest, RejectsTruncatedHeader) {
  const std::vector<std::byte> file = npy_file(1, header("<f4", "(1,)"), {});
  expect_rejected({file.begin(), file.end() - 5}, {"header of", "truncated"});
}

TEST(NpyTest, RejectsUnsupportedVersions) {
  std::vector<std::byte> file = npy_file(1, header("<f4", "(1,)"), counting_bytes(4));
  file[6] = std::byte{4};
  expect_rejected(file, {"version 1.0, 2.0 or 3.0", "4.0"});
  file[6] = std::byte{1};
  file[7] = std::byte{1};
  expect_rejected(file, {"1.1"});
}

TEST(NpyTest, RejectsMalformedHeaderDicts) {
  const char* malformed[] = {
      "",                                                                 // nothing
      "'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",           // no '{'
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)",           // no '}'
      "{'descr': '<f4', 'fortran_order': False}",                         // no shape
      "{'descr': '<f4', 'shape': (1,)}",                                  // no fortran_order
      "{'fortran_order': False, 'shape': (1,)}",                          // no descr
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",  // extra key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",  // twice
      "{'descr': '<f4', 'fortran_order': false, 'shape': (1,)}",           // not a Python bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",          // negative dim
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}",         // not an int
      "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",            // not a tuple
      "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",            // broken quoting
      "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",  // structured
      "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",            // no comma
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing",  // extra text
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
  };
  for (const char* text : malformed) {
    SCOPED_TRACE(text);
    expect_rejected(npy_file(1, text, counting_bytes(4)), {"'descr'", "'shape'", "column"});
  }
}

TEST(NpyTest, RejectsUnsupportedDescrNamingTheSupportedOnes) {
  for (const char* descr : {"<f8", "|u1", "<i8", "<u4", "=f4", "<c8"}) {
    expect_rejected(npy_file(1, header(descr, "(1,)"), counting_bytes(8)),
                    {std::string("'") + descr + "'", "'<f4'", "'<f2'", "'<u2'", "'<i4'"});
  }
}

TEST(NpyTest, RejectsBigEndian) {
  for (const char* descr : {">f4", ">f2", ">u2", ">i4"}) {
    expect_rejected(npy_file(1, header(descr, "(1,)"), counting_bytes(4)),
                    {"little-endian", "big-endian"});
  }
}

TEST(NpyTest, RejectsFortranOrder) {
  expect_rejected(
      npy_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", counting_bytes(16)),
      {"fortran_order", "True"});
}

TEST(NpyTest, RejectsEmptyArrays) {
  expect_rejected(npy_file(1, header("<f4", "(0, 3)"), {}), {"non-empty", "(0, 3)"});
  expect_rejected(npy_file(1, header("<i4", "(0,)"), {}), {"non-empty", "(0,)"});
}

TEST(NpyTest, RejectsMoreThanFourDimensions) {
  expect_rejected(npy_file(1, header("<f4", "(1, 1, 1, 1, 2)"), counting_bytes(8)),
                  {"at most 4 dimensions", "(1, 1, 1, 1, 2)"});
}

TEST(NpyTest, RejectsTruncatedAndOverlongData) {
  expect_rejected(npy_file(1, header("<f4", "(2, 3)"), counting_bytes(23)),
                  {"24 data bytes", "23", "truncated"});
  expect_rejected(npy_file(3, header("<u2", "(2, 3)"), counting_bytes(13)),
                  {"12 data bytes", "13"});
}

TEST(NpyTest, RejectsSizesThatOverflow) {
  expect_rejected(npy_file(1, header("<f4", "(4294967296, 4294967296)"), {}), {"2^60 bytes"});
}

class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ka_npy_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

TEST_F(NpyFileTest, ReadsAFileFromDisk) {
  NpyArray array = make_npy_array(NpyType::BF16, {3, 4});
  array.data = counting_bytes(array.data.size());
  const std::vector<std::byte> bytes = encode_npy(array);
  std::ofstream(dir_ / "a.npy", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const NpyArray back = read_npy(dir_ / "a.npy", "--x");
  EXPECT_EQ(back.type, NpyType::BF16);
  EXPECT_EQ(back.data, array.data);
}

TEST_F(NpyFileTest, RejectsMissingFilesAndDirectories) {
  for (const auto& path : {dir_ / "missing.npy", dir_}) {
    try {
      read_npy(path, "--weight");
      ADD_FAILURE() << "read " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "--weight");
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kernel_align::cli
