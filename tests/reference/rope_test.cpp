// multi_axis_rope through the public API: against the fp64 oracle within the
// bounds of docs/accuracy.md, against hand-computed bits, and for the invariances
// the contract promises (batch, heads, layout, strides, in place, round trip).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernel_align/ops.hpp"
#include "support/oracle_checks.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using contract::float_of;
using test::HostTensor;
using test::logical_bits;
using test::Rng;

struct Tables {
  HostTensor cos;
  HostTensor sin;
};

// cos and sin of random angles: rotations, as real tables are.
Tables random_tables(std::int64_t seq, std::int64_t d, Rng& rng) {
  Tables t{HostTensor(DType::F32, {seq, d / 2}), HostTensor(DType::F32, {seq, d / 2})};
  for (std::int64_t i = 0; i < seq * d / 2; ++i) {
    const double angle = rng.uniform(-100.0, 100.0);
    t.cos.set(i, std::cos(angle));
    t.sin.set(i, std::sin(angle));
  }
  return t;
}

// The shape of a logical [B, S, H, D] tensor stored in `layout`.
std::vector<std::int64_t> stored_shape(Layout layout, std::int64_t b, std::int64_t s,
                                       std::int64_t h, std::int64_t d) {
  return layout == Layout::BSHD ? std::vector<std::int64_t>{b, s, h, d}
                                : std::vector<std::int64_t>{b, h, s, d};
}

// A view in `layout` seen as [B, S, H, D], the oracle's order.
ConstTensorView as_bshd(ConstTensorView v, Layout layout) {
  if (layout == Layout::BHSD) {
    std::swap(v.shape[1], v.shape[2]);
    std::swap(v.strides[1], v.strides[2]);
  }
  return v;
}

void rope(bool backward, const ConstTensorView& in, const Tables& t, const TensorView& out,
          const RopeOptions& options) {
  if (backward) {
    multi_axis_rope_backward(in, t.cos.cview(), t.sin.cview(), out, options);
  } else {
    multi_axis_rope_forward(in, t.cos.cview(), t.sin.cview(), out, options);
  }
}

struct RopeCase {
  DType in;
  DType out;
  Pairing pairing;
  Layout layout;
  bool backward;
};

std::vector<RopeCase> all_rope_cases() {
  std::vector<RopeCase> cases;
  for (DType in : {DType::F32, DType::BF16, DType::F16}) {
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
        for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
          for (bool backward : {false, true}) cases.push_back({in, out, pairing, layout, backward});
        }
      }
    }
  }
  return cases;
}

std::string case_name(const RopeCase& c) {
  return std::string(dtype_name(c.in)) + "_to_" + dtype_name(c.out) + "_" +
         pairing_name(c.pairing) + "_" + layout_name(c.layout) + "_" +
         (c.backward ? "backward" : "forward");
}

// How gtest prints a case in failure messages.
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << case_name(c);
}

class RopeOracle : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeOracle, IsWithinTheBound) {
  const RopeCase c = GetParam();
  Rng rng(21);
  const std::int64_t b = 2, s = 7, h = 3;
  for (std::int64_t d : {2, 18, 128}) {
    const HostTensor x = test::random_tensor(c.in, stored_shape(c.layout, b, s, h, d), rng);
    const Tables t = random_tables(s, d, rng);
    HostTensor y(c.out, x.shape());
    rope(c.backward, x.cview(), t, y.view(), {c.pairing, c.layout});
    const auto expected = oracle::rope(test::logical_values(as_bshd(x.cview(), c.layout)), b, s, h,
                                       static_cast<int>(d), t.cos.values(), t.sin.values(),
                                       c.pairing, c.backward, c.out);
    EXPECT_TRUE(test::matches_oracle(expected, as_bshd(y.cview(), c.layout))) << "D = " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, RopeOracle, ::testing::ValuesIn(all_rope_cases()),
                         [](const ::testing::TestParamInfo<RopeCase>& param) {
                           return case_name(param.param);
                         });

// ---- Hand-computed bits.

HostTensor rows_of(DType dtype, std::int64_t seq, std::int64_t d,
                   const std::vector<double>& values) {
  HostTensor t(dtype, {1, seq, 1, d});
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
  return t;
}

Tables tables_of(std::int64_t seq, const std::vector<double>& cos, const std::vector<double>& sin) {
  const auto columns = static_cast<std::int64_t>(cos.size()) / seq;
  Tables t{HostTensor(DType::F32, {seq, columns}), HostTensor(DType::F32, {seq, columns})};
  for (std::size_t i = 0; i < cos.size(); ++i) {
    t.cos.set(static_cast<std::int64_t>(i), cos[i]);
    t.sin.set(static_cast<std::int64_t>(i), sin[i]);
  }
  return t;
}

std::vector<double> run_values(bool backward, const HostTensor& x, const Tables& t,
                               Pairing pairing) {
  HostTensor y(DType::F32, x.shape());
  rope(backward, x.cview(), t, y.view(), {pairing, Layout::BSHD});
  return y.values();
}

// x = (1, 2, 3, 4), cos = (0.5, 0.25), sin = (0.75, -1): every product and sum is
// exact, so the bits are the values; they show which elements pair with which
// column and the sign convention of each direction.
TEST(RopeGolden, PairingAndDirection) {
  const HostTensor x = rows_of(DType::F32, 1, 4, {1, 2, 3, 4});
  const Tables t = tables_of(1, {0.5, 0.25}, {0.75, -1.0});
  // Interleaved: (1, 2) by column 0 -> (0.5 - 1.5, 0.75 + 1); (3, 4) by column 1
  // -> (0.75 + 4, -3 + 1).
  EXPECT_EQ(run_values(false, x, t, Pairing::Interleaved),
            (std::vector<double>{-1.0, 1.75, 4.75, -2.0}));
  // Half: (x0, x2) = (1, 3) by column 0 -> (0.5 - 2.25, 0.75 + 1.5); (x1, x3) =
  // (2, 4) by column 1 -> (0.5 + 4, -2 + 1).
  EXPECT_EQ(run_values(false, x, t, Pairing::Half), (std::vector<double>{-1.75, 4.5, 2.25, -1.0}));
  // Backward (transpose): a' = a c + b s, b' = b c - a s.
  EXPECT_EQ(run_values(true, x, t, Pairing::Interleaved),
            (std::vector<double>{2.0, 0.25, -3.25, 4.0}));
  EXPECT_EQ(run_values(true, x, t, Pairing::Half), (std::vector<double>{2.75, -3.5, 0.75, 3.0}));
}

// The table row is the token's sequence index: token 1 uses row 1.
TEST(RopeGolden, SequenceIndexSelectsTheTableRow) {
  const HostTensor x = rows_of(DType::F32, 2, 2, {1, 2, 1, 2});
  const Tables t = tables_of(2, {1.0, 0.0}, {0.0, 1.0});
  EXPECT_EQ(run_values(false, x, t, Pairing::Interleaved),
            (std::vector<double>{1.0, 2.0, -2.0, 1.0}));
}

// a = c = 1 + 2^-23, b = 1 + 2^-22, s = 1: a c = 1 + 2^-22 + 2^-46 rounds to
// 1 + 2^-22 = b s, so a' = 0 (a fused multiply-add would give 2^-46).
// b' = a + RN(b c) = (1 + 2^-23) + (1 + 3 * 2^-23) = 2 + 2^-21 exactly; stored as
// bf16 it rounds to 2 (0x4000), as fp16 to 2 (0x4000).
TEST(RopeGolden, RoundsEachProductAndOnceToTheOutput) {
  const double a = 1.0 + 0x1p-23;
  const HostTensor x = rows_of(DType::F32, 1, 2, {a, 1.0 + 0x1p-22});
  const Tables t = tables_of(1, {a}, {1.0});
  EXPECT_EQ(run_values(false, x, t, Pairing::Interleaved),
            (std::vector<double>{0.0, 2.0 + 0x1p-21}));
  for (DType out : {DType::BF16, DType::F16}) {
    HostTensor y(out, x.shape());
    multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
    EXPECT_EQ(logical_bits(y.cview()), (std::vector<std::uint32_t>{0u, 0x4000u}))
        << dtype_name(out);
  }
}

// ---- Invariances.

TEST(RopeInvariance, RowBytesDoNotDependOnBatchNeighboursOrPosition) {
  Rng rng(22);
  const std::int64_t s = 5, h = 3, d = 64;
  const Tables t = random_tables(s, d, rng);
  const HostTensor target = test::random_tensor(DType::BF16, {1, s, h, d}, rng);
  HostTensor alone(DType::BF16, target.shape());
  multi_axis_rope_forward(target.cview(), t.cos.cview(), t.sin.cview(), alone.view(), {});
  const auto want = logical_bits(alone.cview());
  for (std::int64_t batch : {2, 5}) {
    for (std::int64_t position : {std::int64_t{0}, batch - 1}) {
      HostTensor x = test::random_tensor(DType::BF16, {batch, s, h, d}, rng);
      const std::int64_t item = s * h * d;
      for (std::int64_t i = 0; i < item; ++i) x.set(position * item + i, target.get(i));
      HostTensor y(DType::BF16, x.shape());
      multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
      const auto all = logical_bits(y.cview());
      EXPECT_EQ(std::vector<std::uint32_t>(all.begin() + position * item,
                                           all.begin() + (position + 1) * item),
                want)
          << "batch " << batch << " position " << position;
    }
  }
}

TEST(RopeInvariance, HeadsAreIndependent) {
  Rng rng(23);
  const std::int64_t b = 2, s = 4, h = 3, d = 16;
  const Tables t = random_tables(s, d, rng);
  HostTensor x = test::random_tensor(DType::F16, {b, s, h, d}, rng);
  HostTensor y(DType::F16, x.shape());
  multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
  for (std::int64_t head = 0; head < h; ++head) {
    ConstTensorView x_head = test::strided(x.cview(), {b, s, 1, d}, {s * h * d, h * d, d, 1});
    x_head.data = static_cast<const std::uint16_t*>(x.data()) + head * d;
    ConstTensorView y_head = test::strided(y.cview(), {b, s, 1, d}, {s * h * d, h * d, d, 1});
    y_head.data = static_cast<const std::uint16_t*>(y.data()) + head * d;
    HostTensor alone(DType::F16, {b, s, 1, d});
    multi_axis_rope_forward(x_head, t.cos.cview(), t.sin.cview(), alone.view(), {});
    EXPECT_EQ(logical_bits(alone.cview()), logical_bits(y_head)) << "head " << head;
  }
}

// One logical [B, S, H, D] tensor: stored BSHD, as a permuted BHSD view of the
// same buffer, and as a physically transposed BHSD copy: the same bytes.
TEST(RopeInvariance, LayoutDoesNotChangeBytes) {
  Rng rng(24);
  const std::int64_t b = 2, s = 6, h = 4, d = 32;  // S != H, so a wrong table row shows
  const Tables t = random_tables(s, d, rng);
  for (bool backward : {false, true}) {
    const HostTensor x = test::random_tensor(DType::BF16, {b, s, h, d}, rng);
    HostTensor y(DType::BF16, x.shape());
    rope(backward, x.cview(), t, y.view(), {Pairing::Interleaved, Layout::BSHD});
    const auto want = logical_bits(y.cview());

    const ConstTensorView x_bhsd = test::strided(x.cview(), {b, h, s, d}, {s * h * d, d, h * d, 1});
    HostTensor y_view(DType::BF16, {b, h, s, d});
    rope(backward, x_bhsd, t, y_view.view(), {Pairing::Interleaved, Layout::BHSD});
    EXPECT_EQ(logical_bits(as_bshd(y_view.cview(), Layout::BHSD)), want);

    HostTensor x_copy(DType::BF16, {b, h, s, d});
    test::copy_into(x_bhsd, x_copy.view());
    HostTensor y_copy(DType::BF16, {b, h, s, d});
    rope(backward, x_copy.cview(), t, y_copy.view(), {Pairing::Interleaved, Layout::BHSD});
    EXPECT_EQ(logical_bits(as_bshd(y_copy.cview(), Layout::BHSD)), want);
  }
}

TEST(RopeInvariance, StridedInputsOutputsAndTablesGiveTheContiguousBytes) {
  Rng rng(25);
  const std::int64_t b = 2, s = 3, h = 2, d = 8;
  const Tables t = random_tables(s, d, rng);
  const HostTensor x = test::random_tensor(DType::F32, {b, s, h, d}, rng);
  HostTensor y(DType::F16, x.shape());
  multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(),
                          {Pairing::Half, Layout::BSHD});

  // Element stride 3, padded heads and tokens; tables with padded rows and
  // element stride 2; sentinel bytes around the output elements.
  const std::vector<std::int64_t> strides{s * (h * (3 * d + 1) + 5), h * (3 * d + 1) + 5, 3 * d + 1,
                                          3};
  const std::int64_t size = b * strides[0];
  const auto view_in = [&](HostTensor& buffer) {
    TensorView v = buffer.view();
    v.rank = 4;
    v.shape = {b, s, h, d};
    v.strides = {strides[0], strides[1], strides[2], strides[3]};
    return v;
  };
  HostTensor xs(DType::F32, {size});
  HostTensor ys(DType::F16, {size});
  ys.fill_bytes(std::byte{0x5A});
  test::copy_into(x.cview(), view_in(xs));
  Tables ts{HostTensor(DType::F32, {s * (d + 3)}), HostTensor(DType::F32, {s * (d + 3)})};
  const auto table_view = [&](HostTensor& buffer) {
    return test::strided(buffer.view(), {s, d / 2}, {d + 3, 2});
  };
  test::copy_into(t.cos.cview(), table_view(ts.cos));
  test::copy_into(t.sin.cview(), table_view(ts.sin));
  HostTensor ys_expected = ys;

  multi_axis_rope_forward(view_in(xs), table_view(ts.cos), table_view(ts.sin), view_in(ys),
                          {Pairing::Half, Layout::BSHD});
  EXPECT_EQ(logical_bits(view_in(ys)), logical_bits(y.cview()));
  test::copy_into(view_in(ys), view_in(ys_expected));
  EXPECT_TRUE(ys == ys_expected);  // nothing written outside the view
}

TEST(RopeInvariance, InPlaceGivesTheOutOfPlaceBytes) {
  Rng rng(26);
  const std::int64_t b = 1, s = 9, h = 2, d = 128;
  const Tables t = random_tables(s, d, rng);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (bool backward : {false, true}) {
      const HostTensor x = test::random_tensor(dtype, {b, s, h, d}, rng);
      HostTensor y(dtype, x.shape());
      rope(backward, x.cview(), t, y.view(), {});
      HostTensor inplace = x;
      rope(backward, inplace.cview(), t, inplace.view(), {});
      EXPECT_TRUE(inplace == y) << dtype_name(dtype) << (backward ? " backward" : " forward");
    }
  }
}

template <class Vector>
auto at(const Vector& v, std::int64_t i) {
  return v[static_cast<std::size_t>(i)];
}

// Forward then backward is R^T R x = (c^2 + s^2) x up to the roundings:
//   |x'' - x| <= |c^2 + s^2 - 1| |x| + |R^T e1| + e2
// with e1 the forward's bound (on the stored y) and e2 the backward's (on the
// stored x''), both from the oracle; docs/accuracy.md, "Round trip".
TEST(RopeRoundTrip, BackwardUndoesForwardWithinTheComposedBound) {
  Rng rng(27);
  const std::int64_t b = 2, s = 11, h = 3, d = 128;
  const Tables t = random_tables(s, d, rng);
  const auto cos = t.cos.values();
  const auto sin = t.sin.values();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
      const HostTensor x = test::random_tensor(dtype, {b, s, h, d}, rng);
      HostTensor y(dtype, x.shape());
      HostTensor x2(dtype, x.shape());
      multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {pairing});
      multi_axis_rope_backward(y.cview(), t.cos.cview(), t.sin.cview(), x2.view(), {pairing});
      const auto xv = x.values();
      const auto x2v = x2.values();
      const auto e1 =
          oracle::rope(xv, b, s, h, static_cast<int>(d), cos, sin, pairing, false, dtype);
      const auto e2 =
          oracle::rope(y.values(), b, s, h, static_cast<int>(d), cos, sin, pairing, true, dtype);
      const std::int64_t pairs = d / 2;
      double worst = 0.0;  // largest |x'' - x| / (|a| + |b|), for the fp32 claim below
      for (std::int64_t row = 0; row < b * s * h; ++row) {
        const std::int64_t token = (row / h) % s;
        for (std::int64_t k = 0; k < pairs; ++k) {
          const std::int64_t ia = row * d + (pairing == Pairing::Half ? k : 2 * k);
          const std::int64_t ib = row * d + (pairing == Pairing::Half ? k + pairs : 2 * k + 1);
          const double c = at(cos, token * pairs + k);
          const double sn = at(sin, token * pairs + k);
          const double norm_error = std::fabs(c * c + sn * sn - 1.0) + 0x1p-50;
          const double ea = at(e1, ia).bound;
          const double eb = at(e1, ib).bound;
          const double bound_a = norm_error * std::fabs(at(xv, ia)) + std::fabs(c) * ea +
                                 std::fabs(sn) * eb + at(e2, ia).bound;
          const double bound_b = norm_error * std::fabs(at(xv, ib)) + std::fabs(sn) * ea +
                                 std::fabs(c) * eb + at(e2, ib).bound;
          ASSERT_LE(std::fabs(at(x2v, ia) - at(xv, ia)), bound_a) << "element " << ia;
          ASSERT_LE(std::fabs(at(x2v, ib) - at(xv, ib)), bound_b) << "element " << ib;
          const double scale = std::fabs(at(xv, ia)) + std::fabs(at(xv, ib));
          if (scale > 0) {
            worst = std::max(worst, std::max(std::fabs(at(x2v, ia) - at(xv, ia)),
                                             std::fabs(at(x2v, ib) - at(xv, ib))) /
                                        scale);
          }
        }
      }
      // In fp32 the round trip is the identity to a few units of 2^-24.
      if (dtype == DType::F32) {
        EXPECT_LT(worst, 0x1p-21) << pairing_name(pairing);
      }
    }
  }
}

TEST(RopeSpecialValues, NaNIsStoredCanonical) {
  HostTensor x(DType::F32, {1, 1, 1, 4});
  static_cast<float*>(x.data())[0] = float_of(0xFFC0BEEFu);  // -NaN with payload
  x.set(1, 1.0);
  x.set(2, std::numeric_limits<double>::infinity());
  x.set(3, 0.0);
  const Tables t = tables_of(1, {0.5, 0.0}, {0.5, 1.0});
  HostTensor y(DType::F16, x.shape());
  multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
  // Pair 0 holds a NaN: both NaN. Pair 1: (Inf * 0 - 0 * 1, Inf * 1 + 0 * 0) = (NaN, Inf).
  EXPECT_EQ(logical_bits(y.cview()),
            (std::vector<std::uint32_t>{0x7E00u, 0x7E00u, 0x7E00u, 0x7C00u}));
}

}  // namespace
}  // namespace kernel_align
