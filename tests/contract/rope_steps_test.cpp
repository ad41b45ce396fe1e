// The rotation of multi_axis_rope: products rounded, then the sum; the backward
// is the transpose.
#include <gtest/gtest.h>

#include "kernel_align/contract/rope.hpp"

namespace kernel_align {
namespace {

// a = c = 1 + 2^-23, b = 1 + 2^-22, s = 1: a*c = 1 + 2^-22 + 2^-46 rounds to
// 1 + 2^-22 = b*s, so first = 0; a fused multiply-add would keep 2^-46.
TEST(RopeRotate, RoundsEachProductBeforeTheSum) {
  const float a = 1.0f + 0x1p-23f;
  const float b = 1.0f + 0x1p-22f;
  const contract::RotatedPair r = contract::rope_rotate(a, b, a, 1.0f);
  EXPECT_EQ(r.first, 0.0f);
  // second = a*s + b*c: b*c = 1 + 3 * 2^-23 + 2^-45 rounds to 1 + 3 * 2^-23, and
  // (1 + 2^-23) + (1 + 3 * 2^-23) = 2 + 2^-21 is exact.
  EXPECT_EQ(r.second, 2.0f + 0x1p-21f);
}

TEST(RopeRotate, ForwardAndTransposeOnExactValues) {
  // (1, 2) by (c, s) = (0.5, 0.75): first = 0.5 - 1.5, second = 0.75 + 1.
  const contract::RotatedPair f = contract::rope_rotate(1.0f, 2.0f, 0.5f, 0.75f);
  EXPECT_EQ(f.first, -1.0f);
  EXPECT_EQ(f.second, 1.75f);
  // Transpose: first = a*c + b*s = 0.5 + 1.5, second = b*c - a*s = 1 - 0.75.
  const contract::RotatedPair t = contract::rope_rotate_transpose(1.0f, 2.0f, 0.5f, 0.75f);
  EXPECT_EQ(t.first, 2.0f);
  EXPECT_EQ(t.second, 0.25f);
}

}  // namespace
}  // namespace kernel_align
