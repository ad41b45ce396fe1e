// qk_rmsnorm through the public API: against the fp64 oracle within the bounds of
// docs/accuracy.md, against hand-computed bits, and for the invariances the
// contract promises (batch, heads, layout, strides, in place).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/ops.hpp"
#include "support/oracle_checks.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using contract::bits_of;
using test::HostTensor;
using test::logical_bits;
using test::Rng;

constexpr float kEps = 1e-6f;

// An optional weight and what the API and the oracle take of it.
struct Weight {
  std::optional<HostTensor> tensor;

  std::optional<ConstTensorView> view() const {
    if (!tensor) return std::nullopt;
    return tensor->cview();
  }
  std::vector<double> values() const { return tensor ? tensor->values() : std::vector<double>{}; }
  DType dtype() const { return tensor ? tensor->dtype() : DType::F32; }  // none: fp32 ones
};

Weight random_weight(std::optional<DType> dtype, int d, Rng& rng) {
  if (!dtype) return {};
  HostTensor w(*dtype, {d});
  for (std::int64_t i = 0; i < d; ++i) w.set(i, rng.uniform(-2.0, 2.0));
  return {std::move(w)};
}

// [rows, d] rows of several kinds: zero; far below eps (fp16 subnormals); one
// outlier; and plain rows at scales 2^-2 .. 2^2 with a spread within the row.
HostTensor norm_input(DType dtype, std::int64_t rows, int d, Rng& rng) {
  HostTensor x(dtype, {rows, d});
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < d; ++i) {
      double v = std::ldexp(rng.spread(3), static_cast<int>(r % 5) - 2);
      if (r % 8 == 3) v = 0.0;
      if (r % 8 == 5) v *= 1e-5;
      if (r % 8 == 6 && i == d / 2) v = 200.0;
      x.set(r * d + i, v);
    }
  }
  return x;
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

struct NormCase {
  DType in;
  DType out;
  std::optional<DType> weight;
  NormMode mode;
};

std::vector<NormCase> all_norm_cases() {
  std::vector<NormCase> cases;
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
  for (DType in : kDtypes) {
    for (DType out : kDtypes) {
      for (const auto& weight : weights) {
        for (NormMode mode : {NormMode::Single, NormMode::Diffusers}) {
          cases.push_back({in, out, weight, mode});
        }
      }
    }
  }
  return cases;
}

std::string case_name(const NormCase& c) {
  return std::string(dtype_name(c.in)) + "_to_" + dtype_name(c.out) + "_weight_" +
         (c.weight ? dtype_name(*c.weight) : "none") + "_" + norm_mode_name(c.mode);
}

// How gtest prints a case in failure messages.
void PrintTo(const NormCase& c, std::ostream* os) {
  *os << case_name(c);
}

class RmsNormOracle : public ::testing::TestWithParam<NormCase> {};

const int kHeadDims[] = {2, 16, 18, 128, 4096};

std::int64_t rows_for(int d) {
  return d == 4096 ? 3 : 17;
}

TEST_P(RmsNormOracle, ForwardIsWithinTheBound) {
  const NormCase c = GetParam();
  Rng rng(1);
  for (int d : kHeadDims) {
    const HostTensor x = norm_input(c.in, rows_for(d), d, rng);
    const Weight w = random_weight(c.weight, d, rng);
    HostTensor y(c.out, {rows_for(d), d});
    qk_rmsnorm_forward(x.cview(), w.view(), y.view(), {kEps, c.mode});
    const auto expected =
        oracle::rmsnorm_forward(x.values(), d, w.values(), kEps, c.mode, w.dtype(), c.out);
    EXPECT_TRUE(test::matches_oracle(expected, y.cview())) << "D = " << d;
  }
}

TEST_P(RmsNormOracle, BackwardIsWithinTheBound) {
  const NormCase c = GetParam();
  Rng rng(2);
  for (int d : kHeadDims) {
    const std::int64_t rows = rows_for(d);
    const HostTensor x = norm_input(c.in, rows, d, rng);
    const HostTensor dy = test::random_tensor(c.in, {rows, d}, rng);
    const Weight w = random_weight(c.weight, d, rng);
    // dw in fp32 and in the weight's own dtype.
    for (DType dw_dtype : {DType::F32, w.dtype()}) {
      HostTensor dx(c.out, {rows, d});
      HostTensor dw(dw_dtype, {d});
      qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(),
                          w.tensor ? std::optional<TensorView>(dw.view()) : std::nullopt,
                          {kEps, c.mode});
      const auto expected = oracle::rmsnorm_backward(x.values(), dy.values(), d, w.values(), kEps,
                                                     c.mode, w.dtype(), c.out, dw_dtype);
      EXPECT_TRUE(test::matches_oracle(expected.dx, dx.cview())) << "dx, D = " << d;
      if (w.tensor) {
        EXPECT_TRUE(test::matches_oracle(expected.dw, dw.cview()))
            << "dw " << dtype_name(dw_dtype) << ", D = " << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, RmsNormOracle, ::testing::ValuesIn(all_norm_cases()),
                         [](const ::testing::TestParamInfo<NormCase>& param) {
                           return case_name(param.param);
                         });

// ---- Hand-computed bits (exact rational arithmetic, each step rounded by hand).

std::vector<std::uint32_t> forward_bits(const HostTensor& x, const Weight& w, DType out, float eps,
                                        NormMode mode) {
  HostTensor y(out, x.shape());
  qk_rmsnorm_forward(x.cview(), w.view(), y.view(), {eps, mode});
  return logical_bits(y.cview());
}

HostTensor tensor_of(DType dtype, const std::vector<double>& values) {
  HostTensor t(dtype, {static_cast<std::int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
  return t;
}

// x = (3, 4), eps = 0: ss = 25, mean = 12.5; sqrt(12.5) = 3.5355339059... rounds to
// 0x40624630 = 3.53553390502929688; 1 / that = 0.282842712...73 rounds to
// 0x3E90D0C3 = 0.282842725515365601. y = (3 rstd, 4 rstd) = 0.84852817655 and
// 1.13137090206, which round to 0x3F593924 and 0x3F90D0C3 (4 rstd is exact);
// to bf16: 0x3F59 (0.84765625) and 0x3F91 (1.1328125).
TEST(RmsNormGolden, HeadDim2) {
  const HostTensor x = tensor_of(DType::F32, {3.0, 4.0});
  EXPECT_EQ(forward_bits(x, {}, DType::F32, 0.0f, NormMode::Single),
            (std::vector<std::uint32_t>{0x3F593924u, 0x3F90D0C3u}));
  EXPECT_EQ(forward_bits(x, {}, DType::BF16, 0.0f, NormMode::Single),
            (std::vector<std::uint32_t>{0x3F59u, 0x3F91u}));
}

// x = (1, 2, 3, 4) bf16, w = (1, 0.5, 1.375, -2) bf16, eps = 0: mean = 7.5,
// RN(sqrt 7.5) = 0x402F456F, rstd = 0x3EBAF4BA (0.365148365). x * rstd rounds to
// 0x3EBAF4BA, 0x3F3AF4BA, 0x3F8C378C (1.09544504), 0x3FBAF4BA.
// Element 2 shows the two roundings of diffusers mode: t = bf16(1.09544504) =
// 1.09375, t * 1.375 = 1.50390625 is a bf16 tie and goes to even 1.5 (0x3FC0);
// with one rounding, 1.09544504 * 1.375 = 1.50623703 rounds to 1.5078125 (0x3FC1).
TEST(RmsNormGolden, HeadDim4DiffusersRoundsTwice) {
  const HostTensor x = tensor_of(DType::BF16, {1.0, 2.0, 3.0, 4.0});
  const Weight w{tensor_of(DType::BF16, {1.0, 0.5, 1.375, -2.0})};
  EXPECT_EQ(forward_bits(x, w, DType::BF16, 0.0f, NormMode::Diffusers),
            (std::vector<std::uint32_t>{0x3EBBu, 0x3EBBu, 0x3FC0u, 0xC03Bu}));
  EXPECT_EQ(forward_bits(x, w, DType::BF16, 0.0f, NormMode::Single),
            (std::vector<std::uint32_t>{0x3EBBu, 0x3EBBu, 0x3FC1u, 0xC03Bu}));
}

// x = (2^12, 1 x 15), eps = 1/8. The row tree gives ss = 2^24 + 14 (lane 0 loses
// the 1 of lane 8 to a tie at 2^24 + 1, the ones of lanes 1-7 pair up first),
// mean + eps = 2^20 + 1 exactly, RN(sqrt) = 1024 + 2^-11 and
// rstd = 2^-10 - 2^-31 = 0x3A7FFFF8. y0 = 2^12 rstd = 4 - 2^-19 = 0x407FFFF8 and
// y_i = rstd; in bf16 they round up to 4 (0x4080) and 2^-10 (0x3A80). A sum left
// to right would give ss = 2^24 and rstd = 2^-10 exactly.
TEST(RmsNormGolden, HeadDim16FollowsTheRowTree) {
  std::vector<double> values(16, 1.0);
  values[0] = 4096.0;
  const HostTensor x = tensor_of(DType::F32, values);
  std::vector<std::uint32_t> want(16, 0x3A7FFFF8u);
  want[0] = 0x407FFFF8u;
  EXPECT_EQ(forward_bits(x, {}, DType::F32, 0.125f, NormMode::Single), want);
  std::vector<std::uint32_t> want_bf16(16, 0x3A80u);
  want_bf16[0] = 0x4080u;
  EXPECT_EQ(forward_bits(x, {}, DType::BF16, 0.125f, NormMode::Single), want_bf16);
}

// D = 18: lanes 0 and 1 take a second term (x16, x17), lanes 2-15 one.
// x = (2^12, 1 x 17), eps = 0. Lanes: L0 = 2^24 + 1 -> 2^24 (a tie, to even),
// L1 = 1 + 1 = 2, L2..L15 = 1. Halving: k = 8: L0 = 2^24 + 1 -> 2^24, L1 = 3,
// L2..L7 = 2; k = 4: L0 = 2^24 + 2, L1 = 5, L2 = L3 = 4; k = 2: L0 = 2^24 + 6,
// L1 = 9; k = 1: 2^24 + 15, a tie, to even 2^24 + 16 (left to right: 2^24).
// mean = RN(16777232 / 18 = 932068.44) = 932068.4375, RN(sqrt) = 0x44715BF6
// (965.43689), rstd = 0x3A87C3B2 (left to right it would be 0x3A87C3B6);
// y0 = 2^12 rstd = 0x4087C3B2 exactly, y_i = rstd.
TEST(RmsNormGolden, HeadDim18PadsTheTree) {
  std::vector<double> values(18, 1.0);
  values[0] = 4096.0;
  const HostTensor x = tensor_of(DType::F32, values);
  std::vector<std::uint32_t> want(18, 0x3A87C3B2u);
  want[0] = 0x4087C3B2u;
  EXPECT_EQ(forward_bits(x, {}, DType::F32, 0.0f, NormMode::Single), want);
}

// x = (2, 0), dy = (1, 0), w = (1, 1) fp32, eps = 0: rstd = RN(1/RN(sqrt 2)) =
// 0x3F3504F3, rstd^3 = 0x3EB504F2 (one unit below rstd / 2) and dot / D = 1, so
// dx0 = rstd - 2 rstd^3 = 2^-24 (exact math: 0) and dx1 = 0;
// dw = (1 * RN(2 rstd), 0) = (0x3FB504F3, 0).
TEST(RmsNormGolden, BackwardHeadDim2) {
  const HostTensor x = tensor_of(DType::F32, {2.0, 0.0});
  const HostTensor dy = tensor_of(DType::F32, {1.0, 0.0});
  const Weight w{tensor_of(DType::F32, {1.0, 1.0})};
  HostTensor dx(DType::F32, {2});
  HostTensor dw(DType::F32, {2});
  qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), dw.view(), {0.0f});
  EXPECT_EQ(logical_bits(dx.cview()), (std::vector<std::uint32_t>{0x33800000u, 0u}));
  EXPECT_EQ(logical_bits(dw.cview()), (std::vector<std::uint32_t>{0x3FB504F3u, 0u}));
}

// ---- Gradients against finite differences of the fp64 forward.

// L(x, w) = sum dy * y(x, w), y the exact forward (the oracle's value).
double loss(const std::vector<double>& x, const std::vector<double>& w,
            const std::vector<double>& dy, int d) {
  const auto y = oracle::rmsnorm_forward(x, d, w, kEps, NormMode::Single, DType::F32, DType::F32);
  double sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += dy[i] * y[i].value;
  return sum;
}

TEST(RmsNormBackward, MatchesFiniteDifferencesOfTheExactForward) {
  Rng rng(3);
  const int d = 16;
  const std::int64_t rows = 3;
  const HostTensor x = test::random_tensor(DType::F32, {rows, d}, rng, 1.0, 2);
  const HostTensor dy = test::random_tensor(DType::F32, {rows, d}, rng, 1.0, 2);
  const Weight w = random_weight(DType::F32, d, rng);
  HostTensor dx(DType::F32, {rows, d});
  HostTensor dw(DType::F32, {d});
  qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), dw.view(), {kEps});
  const auto expected =
      oracle::rmsnorm_backward(x.values(), dy.values(), d, w.values(), kEps, NormMode::Single,
                               DType::F32, DType::F32, DType::F32);
  // Central differences: truncation error ~ h^2 L''' / 6, rounding ~ 2^-53 L / h.
  const double h = 0x1p-14;
  const double tolerance = 1e-6;
  const auto central = [&](std::vector<double> a, std::vector<double> b, std::size_t i,
                           bool wrt_x) {
    std::vector<double>& v = wrt_x ? a : b;
    const double v0 = v[i];
    v[i] = v0 + h;
    const double up = loss(a, b, dy.values(), d);
    v[i] = v0 - h;
    const double down = loss(a, b, dy.values(), d);
    return (up - down) / (2 * h);
  };
  const std::vector<double> dx_stored = dx.values();
  for (std::size_t i = 0; i < dx_stored.size(); ++i) {
    const double fd = central(x.values(), w.values(), i, true);
    EXPECT_NEAR(expected.dx[i].value, fd, tolerance) << "oracle dx " << i;
    EXPECT_NEAR(dx_stored[i], fd, expected.dx[i].bound + tolerance) << "dx " << i;
  }
  const std::vector<double> dw_stored = dw.values();
  for (std::size_t i = 0; i < dw_stored.size(); ++i) {
    const double fd = central(x.values(), w.values(), i, false);
    EXPECT_NEAR(expected.dw[i].value, fd, tolerance) << "oracle dw " << i;
    EXPECT_NEAR(dw_stored[i], fd, expected.dw[i].bound + tolerance) << "dw " << i;
  }
}

// dw summed by hand in the documented partition: per-row fp32 products
// RN(dy * n) with n from the contract's row steps, blocks of `block_rows` rows
// [b block_rows, min((b+1) block_rows, N)) (256 in the contract) each summed in row
// order from +0, then the block sums in block order from +0.
std::vector<float> dw_by_hand(const HostTensor& x, const HostTensor& dy, DType weight_dtype,
                              NormMode mode, int d, std::int64_t block_rows) {
  const std::int64_t rows = x.elements() / d;
  std::vector<float> total(static_cast<std::size_t>(d), 0.0f);
  for (std::int64_t b = 0; b * block_rows < rows; ++b) {
    std::vector<float> block(static_cast<std::size_t>(d), 0.0f);
    for (std::int64_t r = b * block_rows; r < std::min((b + 1) * block_rows, rows); ++r) {
      const auto xr = [&](int i) { return static_cast<float>(x.get(r * d + i)); };
      const float rstd = contract::row_rstd(d, kEps, xr);
      for (int i = 0; i < d; ++i) {
        const float n = contract::rms_normalized(xr(i), rstd, mode, weight_dtype);
        block[static_cast<std::size_t>(i)] += static_cast<float>(dy.get(r * d + i)) * n;
      }
    }
    for (int i = 0; i < d; ++i)
      total[static_cast<std::size_t>(i)] += block[static_cast<std::size_t>(i)];
  }
  return total;
}

TEST(RmsNormBackward, DwFollowsTheDocumented256RowBlockPartition) {
  Rng rng(4);
  const int d = 32;
  for (std::int64_t rows : {5, 256, 257, 1000}) {
    const HostTensor x = norm_input(DType::BF16, rows, d, rng);
    const HostTensor dy = test::random_tensor(DType::BF16, {rows, d}, rng);
    const Weight w = random_weight(DType::BF16, d, rng);
    HostTensor dx(DType::BF16, {rows, d});
    HostTensor dw(DType::F32, {d});
    qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), dw.view(),
                        {kEps, NormMode::Diffusers});
    std::vector<std::uint32_t> want;
    for (float v : dw_by_hand(x, dy, DType::BF16, NormMode::Diffusers, d, 256)) {
      want.push_back(bits_of(v));
    }
    EXPECT_EQ(logical_bits(dw.cview()), want) << rows << " rows";
    if (rows == 1000) {
      // The partition decides bits: one block (rows in order) gives others.
      std::vector<std::uint32_t> one_block;
      for (float v : dw_by_hand(x, dy, DType::BF16, NormMode::Diffusers, d, rows)) {
        one_block.push_back(bits_of(v));
      }
      EXPECT_NE(logical_bits(dw.cview()), one_block);
    }
  }
}

// ---- Invariances: a row's bytes depend on that row (and eps, mode, weight) only.

TEST(RmsNormInvariance, RowBytesDoNotDependOnBatchNeighboursOrPosition) {
  Rng rng(5);
  const int d = 128;
  const HostTensor target_x = norm_input(DType::BF16, 1, d, rng);
  const HostTensor target_dy = test::random_tensor(DType::BF16, {1, d}, rng);
  const Weight w = random_weight(DType::BF16, d, rng);
  const RmsNormOptions options{kEps, NormMode::Diffusers};

  const auto run = [&](const HostTensor& x, const HostTensor& dy) {
    HostTensor y(DType::BF16, x.shape());
    HostTensor dx(DType::F16, x.shape());
    qk_rmsnorm_forward(x.cview(), w.view(), y.view(), options);
    qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), std::nullopt, options);
    return std::pair{logical_bits(y.cview()), logical_bits(dx.cview())};
  };
  const auto [alone_y, alone_dx] = run(target_x, target_dy);

  for (std::int64_t batch : {2, 7, 64, 301}) {
    for (std::int64_t position : {std::int64_t{0}, batch / 2, batch - 1}) {
      HostTensor x = norm_input(DType::BF16, batch, d, rng);
      HostTensor dy = test::random_tensor(DType::BF16, {batch, d}, rng);
      for (int i = 0; i < d; ++i) {
        x.set(position * d + i, target_x.get(i));
        dy.set(position * d + i, target_dy.get(i));
      }
      const auto [y, dx] = run(x, dy);
      const auto row = [&](const std::vector<std::uint32_t>& v) {
        return std::vector<std::uint32_t>(v.begin() + position * d, v.begin() + (position + 1) * d);
      };
      EXPECT_EQ(row(y), alone_y) << "batch " << batch << " position " << position;
      EXPECT_EQ(row(dx), alone_dx) << "batch " << batch << " position " << position;
    }
  }
}

TEST(RmsNormInvariance, HeadsAreIndependent) {
  Rng rng(6);
  const std::int64_t b = 2, s = 5, h = 4, d = 64;
  HostTensor x = test::random_tensor(DType::F16, {b, s, h, d}, rng);
  const Weight w = random_weight(DType::F16, static_cast<int>(d), rng);
  HostTensor y(DType::F16, {b, s, h, d});
  qk_rmsnorm_forward(x.cview(), w.view(), y.view(), {kEps, NormMode::Diffusers});
  for (std::int64_t head = 0; head < h; ++head) {
    // x[:, :, head, :] as a rank-3 strided view, normalised on its own.
    const std::int64_t offset = head * d;
    ConstTensorView x_head = test::strided(x.cview(), {b, s, d}, {s * h * d, h * d, 1});
    x_head.data = static_cast<const std::uint16_t*>(x.data()) + offset;
    ConstTensorView y_head = test::strided(y.cview(), {b, s, d}, {s * h * d, h * d, 1});
    y_head.data = static_cast<const std::uint16_t*>(y.data()) + offset;
    HostTensor alone(DType::F16, {b, s, d});
    qk_rmsnorm_forward(x_head, w.view(), alone.view(), {kEps, NormMode::Diffusers});
    EXPECT_EQ(logical_bits(alone.cview()), logical_bits(y_head)) << "head " << head;
  }
  // Changing head 1 changes no byte of the other heads.
  for (std::int64_t i = 0; i < b * s; ++i) x.set(i * h * d + d + 3, 1000.0);
  HostTensor y2(DType::F16, {b, s, h, d});
  qk_rmsnorm_forward(x.cview(), w.view(), y2.view(), {kEps, NormMode::Diffusers});
  const auto before = logical_bits(y.cview());
  const auto after = logical_bits(y2.cview());
  for (std::size_t i = 0; i < before.size(); ++i) {
    const bool head1 = (i / d) % h == 1;
    if (!head1) {
      ASSERT_EQ(before[i], after[i]) << "element " << i;
    }
  }
  EXPECT_NE(before, after);
}

// The same logical [B, S, H, D] tensor stored as [B, H, S, D] (a permuted view of
// one buffer, and a physically transposed copy) normalises to the same bytes.
TEST(RmsNormInvariance, LayoutDoesNotChangeBytes) {
  Rng rng(7);
  const std::int64_t b = 2, s = 3, h = 4, d = 32;
  const HostTensor x = test::random_tensor(DType::BF16, {b, s, h, d}, rng);
  HostTensor y(DType::BF16, {b, s, h, d});
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view(), {});

  // Permuted view: shape [B, H, S, D] of the BSHD buffer.
  const ConstTensorView x_bhsd = test::strided(x.cview(), {b, h, s, d}, {s * h * d, d, h * d, 1});
  HostTensor y_bhsd(DType::BF16, {b, h, s, d});
  qk_rmsnorm_forward(x_bhsd, std::nullopt, y_bhsd.view(), {});
  // Read back in BSHD order through the inverse permutation.
  const ConstTensorView y_back =
      test::strided(y_bhsd.cview(), {b, s, h, d}, {h * s * d, d, s * d, 1});
  EXPECT_EQ(logical_bits(y_back), logical_bits(y.cview()));

  // Physical copy in BHSD order.
  HostTensor x_copy(DType::BF16, {b, h, s, d});
  test::copy_into(x_bhsd, x_copy.view());
  HostTensor y_copy(DType::BF16, {b, h, s, d});
  qk_rmsnorm_forward(x_copy.cview(), std::nullopt, y_copy.view(), {});
  EXPECT_EQ(logical_bits(y_copy.cview()), logical_bits(y_bhsd.cview()));
}

TEST(RmsNormInvariance, StridedInputsAndOutputsGiveTheContiguousBytes) {
  Rng rng(8);
  const std::int64_t rows = 6, d = 48;
  const HostTensor x = norm_input(DType::F16, rows, static_cast<int>(d), rng);
  const HostTensor dy = test::random_tensor(DType::F16, {rows, d}, rng);
  const Weight w = random_weight(DType::BF16, static_cast<int>(d), rng);
  const RmsNormOptions options{kEps, NormMode::Diffusers};

  HostTensor y(DType::F32, {rows, d});
  HostTensor dx(DType::BF16, {rows, d});
  HostTensor dw(DType::F32, {d});
  qk_rmsnorm_forward(x.cview(), w.view(), y.view(), options);
  qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), dw.view(), options);

  // Every tensor as [2, 3, d] with an element stride of 2 and padded rows, in a
  // buffer whose other bytes are a sentinel that must survive.
  const std::int64_t row_stride = 2 * d + 6;
  const auto spread_out = [&](DType dtype) {
    HostTensor buffer(dtype, {2 * 3 * row_stride + 9});
    buffer.fill_bytes(std::byte{0xA5});
    return buffer;
  };
  const auto view_in = [&](HostTensor& buffer) {
    return test::strided(buffer.view(), {2, 3, d}, {3 * row_stride + 9, row_stride, 2});
  };
  HostTensor xs = spread_out(DType::F16);
  HostTensor dys = spread_out(DType::F16);
  HostTensor ys = spread_out(DType::F32);
  HostTensor dxs = spread_out(DType::BF16);
  test::copy_into(test::strided(x.cview(), {2, 3, d}, {3 * d, d, 1}), view_in(xs));
  test::copy_into(test::strided(dy.cview(), {2, 3, d}, {3 * d, d, 1}), view_in(dys));
  const HostTensor ys_before = ys;
  const HostTensor dxs_before = dxs;
  HostTensor dw_strided(DType::F32, {2 * d});
  const TensorView dw_view = test::strided(dw_strided.view(), {d}, {2});

  qk_rmsnorm_forward(view_in(xs), w.view(), view_in(ys), options);
  qk_rmsnorm_backward(view_in(xs), view_in(dys), w.view(), view_in(dxs), dw_view, options);

  EXPECT_EQ(logical_bits(view_in(ys)), logical_bits(y.cview()));
  EXPECT_EQ(logical_bits(view_in(dxs)), logical_bits(dx.cview()));
  EXPECT_EQ(logical_bits(dw_view), logical_bits(dw.cview()));
  // Bytes outside the views untouched: copy the view's elements back over the
  // "before" buffers and compare the whole buffers.
  HostTensor ys_expected = ys_before;
  HostTensor dxs_expected = dxs_before;
  test::copy_into(view_in(ys), view_in(ys_expected));
  test::copy_into(view_in(dxs), view_in(dxs_expected));
  EXPECT_TRUE(ys == ys_expected);
  EXPECT_TRUE(dxs == dxs_expected);
}

TEST(RmsNormInvariance, InPlaceGivesTheOutOfPlaceBytes) {
  Rng rng(9);
  const std::int64_t rows = 9, d = 128;
  for (DType dtype : kDtypes) {
    const HostTensor x = norm_input(dtype, rows, static_cast<int>(d), rng);
    const HostTensor dy = test::random_tensor(dtype, {rows, d}, rng);
    const Weight w = random_weight(DType::BF16, static_cast<int>(d), rng);
    const RmsNormOptions options{kEps, NormMode::Diffusers};

    HostTensor y(dtype, {rows, d});
    qk_rmsnorm_forward(x.cview(), w.view(), y.view(), options);
    HostTensor inplace = x;
    qk_rmsnorm_forward(inplace.cview(), w.view(), inplace.view(), options);
    EXPECT_TRUE(inplace == y) << dtype_name(dtype);

    HostTensor dx(dtype, {rows, d});
    qk_rmsnorm_backward(x.cview(), dy.cview(), w.view(), dx.view(), std::nullopt, options);
    HostTensor dx_over_dy = dy;
    qk_rmsnorm_backward(x.cview(), dx_over_dy.cview(), w.view(), dx_over_dy.view(), std::nullopt,
                        options);
    EXPECT_TRUE(dx_over_dy == dx) << "dx = dy, " << dtype_name(dtype);
    HostTensor dx_over_x = x;
    qk_rmsnorm_backward(dx_over_x.cview(), dy.cview(), w.view(), dx_over_x.view(), std::nullopt,
                        options);
    EXPECT_TRUE(dx_over_x == dx) << "dx = x, " << dtype_name(dtype);
  }
}

// NaN rows store the positive canonical NaN everywhere; an Inf element makes the
// row's rstd 0: Inf * 0 is NaN, every other element a zero.
TEST(RmsNormSpecialValues, NaNAndInfinityPropagateAndNaNIsCanonical) {
  const int d = 4;
  HostTensor x(DType::F32, {2, d});
  for (int i = 0; i < 2 * d; ++i) x.set(i, 1.0 + i);
  static_cast<float*>(x.data())[1] = contract::float_of(0xFFC01234u);  // -NaN with payload
  x.set(d + 2, -std::numeric_limits<double>::infinity());
  HostTensor y(DType::BF16, {2, d});
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view(), {});
  EXPECT_EQ(logical_bits(y.cview()),
            (std::vector<std::uint32_t>{0x7FC0u, 0x7FC0u, 0x7FC0u, 0x7FC0u, 0u, 0u, 0x7FC0u, 0u}));
}

}  // namespace
}  // namespace kernel_align
