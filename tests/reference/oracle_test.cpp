// The judge judged: the oracle's rounding, its comparison rule, its exact values
// on cases known in closed form, and its bounds against the closed forms of
// docs/accuracy.md (so the table there and the code say the same).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "oracle/oracle.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kU = 0x1p-24;

TEST(OracleRounding, RoundsToNearestEvenInEachFormat) {
  EXPECT_EQ(oracle::round_to(DType::F32, 1.0 + 0x1p-24), 1.0);  // tie: even
  EXPECT_EQ(oracle::round_to(DType::F32, 1.0 + 0x1p-24 + 0x1p-50), 1.0 + 0x1p-23);
  EXPECT_EQ(oracle::round_to(DType::F32, 0x1p-150), 0.0);  // tie with the smallest subnormal
  EXPECT_EQ(oracle::round_to(DType::F32, 0x1.8p-149), 0x1p-148);
  EXPECT_EQ(oracle::round_to(DType::BF16, 1.0 + 0x1p-8), 1.0);
  EXPECT_EQ(oracle::round_to(DType::BF16, 1.0 + 0x1.8p-7), 1.0 + 0x1p-6);
  EXPECT_EQ(oracle::round_to(DType::BF16, 0x1.FFp127), kInf);  // past the largest finite
  EXPECT_EQ(oracle::round_to(DType::F16, 65519.99), 65504.0);
  EXPECT_EQ(oracle::round_to(DType::F16, 65520.0), kInf);
  EXPECT_EQ(oracle::round_to(DType::F16, -65520.0), -kInf);
  EXPECT_EQ(oracle::round_to(DType::F16, 0x1.8p-24), 0x1p-23);  // subnormal tie: even
  EXPECT_TRUE(std::signbit(oracle::round_to(DType::F16, -0x1p-26)));
  EXPECT_TRUE(std::isnan(oracle::round_to(DType::BF16, std::nan(""))));
}

TEST(OracleWithin, SpecialValuesEqualOnlyThemselves) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(oracle::within({nan, 0.0}, nan));
  EXPECT_FALSE(oracle::within({nan, 0.0}, 1.0));
  EXPECT_FALSE(oracle::within({1.0, 1.0}, nan));
  EXPECT_TRUE(oracle::within({kInf, 0.0}, kInf));
  EXPECT_FALSE(oracle::within({kInf, 0.0}, -kInf));
  EXPECT_FALSE(oracle::within({1.0, 0.5}, kInf));
  EXPECT_TRUE(oracle::within({1.0, 0.5}, 1.5));
  EXPECT_FALSE(oracle::within({1.0, 0.5}, 1.5000001));
  EXPECT_TRUE(oracle::within({1.0, kInf}, nan));  // no claim
}

TEST(OracleValues, AreTheExactFormulas) {
  // x = (3, 4): rms = 5 / sqrt(2), y = x * sqrt(2) / 5.
  const std::vector<double> x{3.0, 4.0};
  const auto y = oracle::rmsnorm_forward(x, 2, {}, 0.0, NormMode::Single, DType::F32, DType::F32);
  EXPECT_NEAR(y[0].value, 0.6 * std::sqrt(2.0), 1e-15);
  EXPECT_NEAR(y[1].value, 0.8 * std::sqrt(2.0), 1e-15);
  // Diffusers mode rounds x * rstd to the weight dtype first: 0.848528 -> bf16
  // 0.84765625, times w = 3.
  const auto yd = oracle::rmsnorm_forward(x, 2, std::vector<double>{3.0, 1.0}, 0.0,
                                          NormMode::Diffusers, DType::BF16, DType::F32);
  EXPECT_EQ(yd[0].value, 3 * 0.84765625);
  // Rope: (1, 2) by cos 0.6, sin 0.8.
  const auto r = oracle::rope(std::vector<double>{1.0, 2.0}, 1, 1, 1, 2, std::vector<double>{0.6},
                              std::vector<double>{0.8}, Pairing::Interleaved, false, DType::F32);
  EXPECT_NEAR(r[0].value, 0.6 - 1.6, 1e-15);
  EXPECT_NEAR(r[1].value, 0.8 + 1.2, 1e-15);
  const auto rt = oracle::rope(std::vector<double>{1.0, 2.0}, 1, 1, 1, 2, std::vector<double>{0.6},
                               std::vector<double>{0.8}, Pairing::Interleaved, true, DType::F32);
  EXPECT_NEAR(rt[0].value, 0.6 + 1.6, 1e-15);
  EXPECT_NEAR(rt[1].value, 1.2 - 0.8, 1e-15);
}

// The bound of a plain row (eps far below mean(x^2), no underflow) in fp32 is
// (m + 11)/2 u |y| to first order, m = ceil(D/16) + 3 (docs/accuracy.md).
TEST(OracleBounds, ForwardMatchesTheClosedForm) {
  test::Rng rng(41);
  for (int d : {16, 128, 4096}) {
    std::vector<double> x(static_cast<std::size_t>(d));
    for (double& v : x) v = static_cast<float>(rng.uniform(0.5, 2.0));
    const auto y =
        oracle::rmsnorm_forward(x, d, {}, 1e-6f, NormMode::Single, DType::F32, DType::F32);
    const double m = (d + 15) / 16 + 3;
    for (const auto& e : y) {
      EXPECT_NEAR(e.bound / (kU * std::fabs(e.value)), (m + 11) / 2, 1e-3 * (m + 11) / 2)
          << "D = " << d;
    }
    // bf16 output adds at most half a bf16 spacing: 2^-9 |y| relative.
    const auto yb =
        oracle::rmsnorm_forward(x, d, {}, 1e-6f, NormMode::Single, DType::F32, DType::BF16);
    for (std::size_t i = 0; i < yb.size(); ++i) {
      EXPECT_LE(yb[i].bound - y[i].bound, 0x1p-8 * std::fabs(y[i].value) * (1 + 1e-6));
      EXPECT_GT(yb[i].bound - y[i].bound, 0x1p-10 * std::fabs(y[i].value));
    }
  }
}

// dw over N rows in fp32, single mode: ((m + 11)/2 + m_dw) u sum_rows |dy n| to
// first order, m_dw = min(N, 256) + ceil(N/256) - 2 (docs/accuracy.md): each term's
// own (m + 11)/2, then the additions within a block of 256 rows and over the blocks.
TEST(OracleBounds, DwMatchesTheClosedForm) {
  test::Rng rng(43);
  const int d = 16;
  const double m = (d + 15) / 16 + 3;
  for (std::int64_t rows : {1, 2, 255, 256, 257, 513, 3000}) {
    std::vector<double> x(static_cast<std::size_t>(rows * d));
    std::vector<double> dy(x.size());
    for (double& v : x) v = static_cast<float>(rng.uniform(0.5, 2.0));
    for (double& v : dy) v = static_cast<float>(rng.uniform(0.5, 2.0));
    const std::vector<double> w(static_cast<std::size_t>(d), 1.0);
    const auto g = oracle::rmsnorm_backward(x, dy, d, w, 1e-6f, NormMode::Single, DType::F32,
                                            DType::F32, DType::F32);
    const double m_dw =
        static_cast<double>(std::min<std::int64_t>(rows, 256) + (rows + 255) / 256 - 2);
    for (int i = 0; i < d; ++i) {
      // n = x * rstd with every element positive: sum |dy n| is dw itself.
      const double want = (m + 11) / 2 + m_dw;
      EXPECT_NEAR(
          g.dw[static_cast<std::size_t>(i)].bound / (kU * g.dw[static_cast<std::size_t>(i)].value),
          want, 1e-3 * want)
          << rows << " rows";
    }
  }
}

// Rope in fp32: u (|a c| + |b s|) + u |y| to first order.
TEST(OracleBounds, RopeMatchesTheClosedForm) {
  const double a = 1.5, b = -0.75, c = 0.6, s = 0.8;
  const auto r = oracle::rope(std::vector<double>{a, b}, 1, 1, 1, 2, std::vector<double>{c},
                              std::vector<double>{s}, Pairing::Interleaved, false, DType::F32);
  const double first = kU * (std::fabs(a * c) + std::fabs(b * s)) + kU * std::fabs(a * c - b * s);
  EXPECT_NEAR(r[0].bound / first, 1.0, 1e-3);
}

// In diffusers mode the rounding to the weight dtype costs nothing where the
// fp32 value x * rstd cannot straddle a rounding boundary of that dtype, and up
// to a spacing where it can: most elements of random rows get the small bound.
TEST(OracleBounds, DiffusersRoundingIsBracketed) {
  test::Rng rng(42);
  const int d = 128;
  std::vector<double> x(static_cast<std::size_t>(d) * 64);
  for (double& v : x) v = static_cast<float>(rng.spread(3));
  const std::vector<double> w(static_cast<std::size_t>(d), 1.0);
  const auto y =
      oracle::rmsnorm_forward(x, d, w, 1e-6f, NormMode::Diffusers, DType::BF16, DType::F32);
  int small = 0;
  for (const auto& e : y) {
    if (e.bound <= 2 * kU * std::fabs(e.value) + 1e-40) ++small;
    EXPECT_LE(e.bound, 0x1.01p-7 * std::fabs(e.value) + 1e-40);  // about one bf16 spacing
  }
  EXPECT_GT(small, static_cast<int>(y.size()) * 9 / 10);
}

TEST(OracleBounds, OverflowOfTheOutputIsInfinityOrNoClaim) {
  // 60000 * 1 - 60000 * (-1) = 120000: beyond fp16 whatever the roundings.
  const auto r =
      oracle::rope(std::vector<double>{60000.0, 60000.0}, 1, 1, 1, 2, std::vector<double>{1.0},
                   std::vector<double>{-1.0}, Pairing::Interleaved, false, DType::F16);
  EXPECT_EQ(r[0].value, kInf);
  EXPECT_EQ(r[0].bound, 0.0);
  // 65520 exactly: the fp32 result may fall either side of the threshold.
  const auto edge =
      oracle::rope(std::vector<double>{65520.0, 0.0}, 1, 1, 1, 2, std::vector<double>{1.0},
                   std::vector<double>{0.0}, Pairing::Interleaved, false, DType::F16);
  EXPECT_EQ(edge[0].bound, kInf);
}

}  // namespace
}  // namespace kernel_align
