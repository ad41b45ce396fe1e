// fill_uniform draws the stream in order whatever the number of cores drawing it.
#include "cases/inputs.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_align/contract/convert.hpp"

namespace kernel_align::cases {
namespace {

class FillUniform : public ::testing::TestWithParam<DType> {};

// Enough elements for several threads' ranges (each at least 2^18 draws), and a count
// that splits unevenly.
constexpr std::size_t kElements = (std::size_t{3} << 18) + 7;

TEST_P(FillUniform, EqualsTheDrawsOneByOneAndMovesTheStreamPastThem) {
  const DType dtype = GetParam();
  const std::size_t size = dtype_size(dtype);
  std::vector<std::byte> filled(kElements * size);
  Random drawn_in_parts(42);
  drawn_in_parts.next();  // a stream not at its start
  fill_uniform(drawn_in_parts, dtype, filled, -4.0f, 8.0f);

  Random one_by_one(42);
  one_by_one.next();
  std::vector<std::byte> expected(kElements * size);
  for (std::size_t i = 0; i < kElements; ++i) {
    contract::store_output(dtype, expected.data(), static_cast<std::int64_t>(i),
                           one_by_one.uniform(-4.0f, 8.0f));
  }
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(filled[i], expected[i]) << dtype_name(dtype) << " byte " << i;
  }
  EXPECT_EQ(drawn_in_parts.next(), one_by_one.next()) << "the stream did not move past the fill";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FillUniform,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& dtype) {
                           return std::string(dtype_name(dtype.param));
                         });

TEST(SplitMix64, DiscardSkipsExactlyThatManyNumbers) {
  SplitMix64 skipped(7);
  SplitMix64 drawn(7);
  skipped.discard(1000);
  for (int i = 0; i < 1000; ++i) drawn.next();
  EXPECT_EQ(skipped.next(), drawn.next());
}

}  // namespace
}  // namespace kernel_align::cases
