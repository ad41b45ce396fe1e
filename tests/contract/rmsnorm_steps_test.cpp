// The steps of qk_rmsnorm in contract/rmsnorm.hpp: each rounded once, in the
// documented order.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_align/contract/rmsnorm.hpp"
#include "oracle/oracle.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using contract::bits_of;

// fp32 operands, the operation in fp64, then one rounding to fp32: for + - * /
// and sqrt this is the correctly rounded fp32 operation (fp64 has more than
// 2 * 24 + 2 significand bits, so the double rounding is innocuous).
float rn(double v) {
  return static_cast<float>(oracle::round_to(DType::F32, v));
}

TEST(RmsRstd, EachStepIsCorrectlyRounded) {
  test::Rng rng(11);
  const int dims[] = {2, 18, 128, 4096};
  const float epsilons[] = {1e-6f, 0.0f, 1e-3f, 0x1p-20f};
  int differs_from_one_rounding = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    const float ss = rn(std::ldexp(rng.uniform(1.0, 2.0), static_cast<int>(rng.below(60)) - 40));
    const int d = dims[trial % 4];
    const float eps = epsilons[(trial / 4) % 4];
    const float mean = rn(static_cast<double>(ss) / d);
    const float shifted = rn(static_cast<double>(mean) + eps);
    const float root = rn(std::sqrt(static_cast<double>(shifted)));
    const float want = rn(1.0 / root);
    ASSERT_EQ(bits_of(contract::rms_rstd(ss, d, eps)), bits_of(want))
        << "ss " << ss << " d " << d << " eps " << eps;
    if (want != rn(1.0 / std::sqrt(static_cast<double>(shifted)))) ++differs_from_one_rounding;
  }
  // The contract is 1/sqrt in two roundings, not an rsqrt rounded once: the sweep
  // holds inputs where the two differ, so the assertion above tells them apart.
  EXPECT_GT(differs_from_one_rounding, 0);
}

// x = (2^12, 1 x 15), eps = 1/8. The tree gives ss = 2^24 + 14 (lane 0 loses the
// 1 of lane 8 to a tie, the other lanes pair their ones first; see
// row_tree_test), so mean = 1048576.875 and mean + eps = 2^20 + 1, both exact.
// sqrt(2^20 + 1) = 1024 + 2^-11 - 2^-33 - ... rounds to 1024 + 2^-11; its
// reciprocal 2^-10 (1 - 2^-21 + 2^-42 ...) rounds to 2^-10 - 2^-31: 0x3A7FFFF8.
// Summed left to right, ss would be 2^24, and rstd exactly 2^-10.
TEST(RowRstd, UsesTheRowTreeOfRoundedSquares) {
  std::vector<float> x(16, 1.0f);
  x[0] = 0x1p12f;
  const float rstd =
      contract::row_rstd(16, 0.125f, [&](int i) { return x[static_cast<std::size_t>(i)]; });
  EXPECT_EQ(bits_of(rstd), 0x3A7FFFF8u);
  EXPECT_EQ(bits_of(contract::rms_rstd(0x1p24f, 16, 0.125f)), bits_of(0x1p-10f));
}

TEST(RmsNormalized, DiffusersModeRoundsThroughTheWeightDtype) {
  const float x = 1.0f + 0x1p-10f;  // not a bf16 value; an fp16 one
  using contract::NormMode;
  EXPECT_EQ(contract::rms_normalized(x, 1.0f, NormMode::Single, DType::BF16), x);
  EXPECT_EQ(contract::rms_normalized(x, 1.0f, NormMode::Diffusers, DType::BF16), 1.0f);
  EXPECT_EQ(contract::rms_normalized(x, 1.0f, NormMode::Diffusers, DType::F16), x);
  EXPECT_EQ(contract::rms_normalized(x, 1.0f, NormMode::Diffusers, DType::F32), x);
  EXPECT_EQ(contract::rms_forward(x, 1.0f, 3.0f, NormMode::Single, DType::BF16), 3.0f + 0x1.8p-9f);
  EXPECT_EQ(contract::rms_forward(x, 1.0f, 3.0f, NormMode::Diffusers, DType::BF16), 3.0f);
}

// x = (2, 0), g = (1, 0), eps = 0: rstd = RN(1/RN(sqrt 2)) = 0x3F3504F3,
// rstd^3 = RN(RN(r r) r) = 0x3EB504F2, one unit below r/2, and dot / D = 1, so
// dx0 = r - 2 rstd^3 = 2^-24 where exact math gives 0.
TEST(RmsBackward, RowConstantsAndDxFollowTheDocumentedSteps) {
  const float x[] = {2.0f, 0.0f};
  const float g[] = {1.0f, 0.0f};
  const contract::RmsBackwardRow row = contract::rms_backward_row(
      2, 0.0f, [&](int i) { return x[i]; }, [&](int i) { return g[i]; });
  EXPECT_EQ(bits_of(row.rstd), 0x3F3504F3u);
  EXPECT_EQ(bits_of(row.coef), 0x3EB504F2u);
  EXPECT_EQ(contract::rms_backward_dx(x[0], g[0], row), 0x1p-24f);
  EXPECT_EQ(bits_of(contract::rms_backward_dx(x[1], g[1], row)), 0u);
}

TEST(DwPartition, BlocksOfAFixedNumberOfRows) {
  EXPECT_EQ(contract::kDwBlockRows, 256);
  EXPECT_EQ(contract::dw_block_count(0), 0);  // no rows, no blocks
  EXPECT_EQ(contract::dw_block_count(1), 1);
  EXPECT_EQ(contract::dw_block_count(255), 1);
  EXPECT_EQ(contract::dw_block_count(256), 1);
  EXPECT_EQ(contract::dw_block_count(257), 2);
  EXPECT_EQ(contract::dw_block_count(512), 2);
  EXPECT_EQ(contract::dw_block_count(513), 3);
  EXPECT_EQ(contract::dw_block_count(171480), 670);  // 669 full blocks and 216 rows

  EXPECT_EQ(contract::dw_block_begin(1, 0), 0);
  EXPECT_EQ(contract::dw_block_end(1, 0), 1);
  EXPECT_EQ(contract::dw_block_begin(256, 0), 0);
  EXPECT_EQ(contract::dw_block_end(256, 0), 256);
  EXPECT_EQ(contract::dw_block_begin(257, 1), 256);
  EXPECT_EQ(contract::dw_block_end(257, 1), 257);  // the last block is shorter
  EXPECT_EQ(contract::dw_block_begin(171480, 669), 171264);
  EXPECT_EQ(contract::dw_block_end(171480, 669), 171480);
}

TEST(DwPartition, BlocksAreContiguousAndCoverEveryRow) {
  for (long long rows : {0LL, 1LL, 255LL, 256LL, 257LL, 511LL, 512LL, 513LL, 171480LL}) {
    const long long blocks = contract::dw_block_count(rows);
    EXPECT_EQ(blocks, (rows + 255) / 256) << rows;
    EXPECT_EQ(contract::dw_block_begin(rows, 0), 0) << rows;
    EXPECT_EQ(contract::dw_block_begin(rows, blocks), rows) << rows;
    for (long long b = 0; b < blocks; ++b) {
      EXPECT_EQ(contract::dw_block_begin(rows, b), 256 * b) << rows;
      EXPECT_EQ(contract::dw_block_end(rows, b), contract::dw_block_begin(rows, b + 1)) << rows;
      // Every block but the last holds exactly 256 rows; the last holds 1 to 256.
      const long long size = contract::dw_block_end(rows, b) - contract::dw_block_begin(rows, b);
      if (b + 1 < blocks) {
        EXPECT_EQ(size, 256) << rows;
      } else {
        EXPECT_GE(size, 1) << rows;
        EXPECT_LE(size, 256) << rows;
        EXPECT_EQ(size, rows - 256 * (blocks - 1)) << rows;
      }
    }
  }
}

}  // namespace
}  // namespace kernel_align
