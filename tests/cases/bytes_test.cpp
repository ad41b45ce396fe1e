// byte_difference: equal arrays give "", a difference anywhere (the comparison is split
// over the cores) is found and described.
#include "cases/bytes.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

namespace kernel_align::cases {
namespace {

// Large enough for the comparison to be split (1 MiB per core).
constexpr std::size_t kBytes = (std::size_t{5} << 20) + 6;

TEST(ByteDifference, EqualBytesGiveNothing) {
  const std::vector<std::byte> a(kBytes, std::byte{3});
  EXPECT_EQ(byte_difference("y", 2, a, a), "");
  EXPECT_EQ(byte_difference("y", 2, {}, {}), "");
}

TEST(ByteDifference, FindsADifferenceInEveryPartOfTheArray) {
  const std::vector<std::byte> expected(kBytes, std::byte{0});
  for (const std::size_t at : {std::size_t{0}, kBytes / 2 + 1, kBytes - 1}) {
    std::vector<std::byte> found = expected;
    found[at] = std::byte{0x80};
    const std::string element = std::to_string(at / 2);
    EXPECT_EQ(byte_difference("y", 2, expected, found),
              "y: 1 of " + std::to_string(kBytes / 2) + " elements differ, first at element " +
                  element + ": expected 0x0000, found " + (at % 2 == 0 ? "0x0080" : "0x8000"))
        << "byte " << at;
  }
}

TEST(ByteDifference, SaysWhenTheSizesDiffer) {
  const std::vector<std::byte> a(8), b(4);
  EXPECT_EQ(byte_difference("dw", 4, a, b), "dw: 8 bytes expected, 4 found");
}

}  // namespace
}  // namespace kernel_align::cases
