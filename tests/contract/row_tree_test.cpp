// The row reduction tree: its documented order, written out by hand.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "kernel_align/contract/row_tree.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using contract::bits_of;

float tree_sum_of(const std::vector<float>& terms) {
  return contract::tree_sum(static_cast<int>(terms.size()),
                            [&](int i) { return terms[static_cast<std::size_t>(i)]; });
}

float left_to_right(const std::vector<float>& terms) {
  float sum = 0.0f;
  for (float t : terms) sum += t;
  return sum;
}

// 40 terms: lanes 0-7 hold three terms, lanes 8-15 two; then the halving levels.
TEST(RowTree, FollowsTheDocumentedOrderFor40Terms) {
  test::Rng rng(40);
  for (int trial = 0; trial < 1000; ++trial) {
    std::vector<float> t(40);
    for (float& v : t) v = static_cast<float>(rng.spread(30));
    std::array<float, 16> lane{};
    for (int j = 0; j < 8; ++j) lane[j] = ((0.0f + t[j]) + t[j + 16]) + t[j + 32];
    for (int j = 8; j < 16; ++j) lane[j] = (0.0f + t[j]) + t[j + 16];
    const float a0 = lane[0] + lane[8], a1 = lane[1] + lane[9], a2 = lane[2] + lane[10],
                a3 = lane[3] + lane[11], a4 = lane[4] + lane[12], a5 = lane[5] + lane[13],
                a6 = lane[6] + lane[14], a7 = lane[7] + lane[15];
    const float b0 = a0 + a4, b1 = a1 + a5, b2 = a2 + a6, b3 = a3 + a7;
    const float c0 = b0 + b2, c1 = b1 + b3;
    ASSERT_EQ(bits_of(tree_sum_of(t)), bits_of(c0 + c1)) << "trial " << trial;
  }
}

// tree_sum_array (contiguous terms, lane-parallel) is tree_sum: every length from 0 to 100
// (full chunks and tails), terms of spread magnitudes, zeros of both signs.
TEST(RowTree, ArrayFormIsTheSameOrder) {
  test::Rng rng(41);
  for (int n = 0; n <= 100; ++n) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> t(static_cast<std::size_t>(n));
      for (float& v : t) {
        v = static_cast<float>(rng.spread(30));
        if (rng.below(10) == 0) v = v > 0 ? 0.0f : -0.0f;
      }
      ASSERT_EQ(bits_of(contract::tree_sum_array(t.data(), n)), bits_of(tree_sum_of(t)))
          << "n " << n << " trial " << trial;
    }
  }
}

// 2^24 + 1 rounds to 2^24 (a tie, to even), so where the ones meet 2^24 decides
// the result. Row of 18: lane 0 = 2^24 + t16, lane 1 = t1 + t17.
TEST(RowTree, PaddedRowSumsLanesBeforeMeetingTheLargeTerm) {
  std::vector<float> t(18, 0.0f);
  t[0] = 0x1p24f;
  t[1] = 1.0f;
  t[17] = 1.0f;
  EXPECT_EQ(tree_sum_of(t), 16777218.0f);    // lane 1 = 2, added to lane 0 last: exact
  EXPECT_EQ(left_to_right(t), 16777216.0f);  // each 1 alone is lost
  t[16] = 1.0f;                              // joins lane 0 directly: lost
  EXPECT_EQ(tree_sum_of(t), 16777218.0f);
  EXPECT_EQ(left_to_right(t), 16777216.0f);
}

// A row of 5: lanes 0-4 only. Levels: (t0 + t4), t1, t2, t3; then
// ((t0 + t4) + t2) and (t1 + t3); then their sum.
TEST(RowTree, ShortRowFollowsTheHalvingLevels) {
  const std::vector<float> t{0x1p24f, 1.0f, 1.0f, 1.0f, 1.0f};
  // (2^24 + 1) -> 2^24, (2^24 + 1) -> 2^24, then + (1 + 1) = 2^24 + 2 exactly.
  EXPECT_EQ(tree_sum_of(t), 16777218.0f);
  EXPECT_EQ(left_to_right(t), 16777216.0f);
  EXPECT_EQ(0x1p24f + ((1.0f + 1.0f) + (1.0f + 1.0f)), 16777220.0f);  // a third order
}

TEST(RowTree, LanesStartAtPositiveZero) {
  EXPECT_EQ(bits_of(tree_sum_of({})), 0u);
  EXPECT_EQ(bits_of(tree_sum_of({-0.0f})), 0u);
  EXPECT_EQ(bits_of(tree_sum_of(std::vector<float>(33, -0.0f))), 0u);
  EXPECT_EQ(bits_of(tree_sum_of({-1.0f, 1.0f})), 0u);
}

}  // namespace
}  // namespace kernel_align
