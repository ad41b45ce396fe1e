// true_cfg_forward / _backward through the public API (contract section 17): every backend
// path and thread count gives the reference's bytes; the forward and the gradients are
// within the contract's bounds of the same functions in fp64 (and the fp64 gradient is the
// forward's derivative, by central differences); a row's bytes do not depend on the other
// rows; in place equals out of place; bad arguments are Errors naming them, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/errors.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr float kScale = 4.0f;

struct Results {
  HostTensor v, dcond, duncond;
  bool operator==(const Results& other) const = default;
};

Results run_all(const HostTensor& cond, const HostTensor& uncond, const HostTensor& dv,
                float scale = kScale) {
  Results r{HostTensor(cond.dtype(), cond.shape()), HostTensor(cond.dtype(), cond.shape()),
            HostTensor(cond.dtype(), cond.shape())};
  true_cfg_forward(cond.cview(), uncond.cview(), r.v.view(), {scale});
  true_cfg_backward(cond.cview(), uncond.cview(), dv.cview(), r.dcond.view(), r.duncond.view(),
                    {scale});
  return r;
}

// One row's forward and gradients in fp64, the contract's formulas without roundings.
struct Exact {
  std::vector<double> v, dcond, duncond;
};

std::vector<double> combined_row(const std::vector<double>& c, const std::vector<double>& u,
                                 double s) {
  std::vector<double> m(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) m[i] = u[i] + s * (c[i] - u[i]);
  return m;
}

double norm(const std::vector<double>& x) {
  double sum = 0;
  for (double e : x) sum += e * e;
  return std::sqrt(sum);
}

std::vector<double> forward_row(const std::vector<double>& c, const std::vector<double>& u,
                                double s) {
  std::vector<double> m = combined_row(c, u, s);
  const double r = norm(c) / norm(m);
  for (double& e : m) e *= r;
  return m;
}

Exact exact_row(const std::vector<double>& c, const std::vector<double>& u,
                const std::vector<double>& dv, double s) {
  const std::vector<double> m = combined_row(c, u, s);
  const double nc = norm(c), nm = norm(m), r = nc / nm;
  double a = 0;
  for (std::size_t i = 0; i < m.size(); ++i) a += dv[i] * m[i];
  Exact e{forward_row(c, u, s), {}, {}};
  for (std::size_t i = 0; i < m.size(); ++i) {
    const double dm = r * dv[i] - r * a * m[i] / (nm * nm);
    e.dcond.push_back(s * dm + (nc == 0 ? 0.0 : a * c[i] / (nm * nc)));
    e.duncond.push_back((1 - s) * dm);
  }
  return e;
}

std::vector<double> row_of(const HostTensor& t, std::int64_t r, std::int64_t d) {
  std::vector<double> row;
  for (std::int64_t i = 0; i < d; ++i) row.push_back(t.get(r * d + i));
  return row;
}

double largest(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

TEST(TrueCfgOp, EveryBackendPathAndThreadCountGivesTheReferenceBytes) {
  const test::RuntimeGuard guard;
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {3, 64}, {2, 5, 33}, {2, 3, 4, 40}};
  for (const auto& shape : shapes) {
    for (const DType dtype : kDTypes) {
      SCOPED_TRACE(std::to_string(shape.size()) + "-D " + dtype_name(dtype));
      test::Rng rng(shape.size());
      const HostTensor cond = test::random_tensor(dtype, shape, rng);
      const HostTensor uncond = test::random_tensor(dtype, shape, rng);
      const HostTensor dv = test::random_tensor(dtype, shape, rng);
      set_backend("reference");
      const Results want = run_all(cond, uncond, dv);
      EXPECT_EQ(last_call().backend, "reference");
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          EXPECT_TRUE(run_all(cond, uncond, dv) == want) << isa_name(path) << " " << threads;
        }
      }
    }
  }
}

// fp32 rows of 64 (a token's channels) against fp64: every element within 2^-18 of the
// row's largest magnitude (the forward), 2^-16 (the gradients: a few more roundings, and
// the cancellation of dm's two terms), the bounds of contract section 17.
TEST(TrueCfgOp, TheResultsAreTheFp64FunctionsWithinTheContractsBounds) {
  constexpr std::int64_t kRows = 64, kD = 64;
  test::Rng rng(7);
  const HostTensor cond = test::random_tensor(DType::F32, {kRows, kD}, rng);
  const HostTensor uncond = test::random_tensor(DType::F32, {kRows, kD}, rng);
  const HostTensor dv = test::random_tensor(DType::F32, {kRows, kD}, rng);
  const Results got = run_all(cond, uncond, dv);
  for (std::int64_t r = 0; r < kRows; ++r) {
    const Exact e =
        exact_row(row_of(cond, r, kD), row_of(uncond, r, kD), row_of(dv, r, kD), kScale);
    for (std::int64_t i = 0; i < kD; ++i) {
      EXPECT_NEAR(got.v.get(r * kD + i), e.v[i], std::ldexp(largest(e.v), -18)) << r << " " << i;
      EXPECT_NEAR(got.dcond.get(r * kD + i), e.dcond[i], std::ldexp(largest(e.dcond), -16));
      EXPECT_NEAR(got.duncond.get(r * kD + i), e.duncond[i], std::ldexp(largest(e.duncond), -16));
    }
  }
}

// The fp64 gradient above is the forward's derivative: central differences of
// sum(dv * forward) agree with it.
TEST(TrueCfgOp, TheGradientFormulasAreTheForwardsDerivative) {
  test::Rng rng(8);
  constexpr std::int64_t kD = 16;
  const HostTensor t = test::random_tensor(DType::F32, {3, kD}, rng);
  const std::vector<double> c = row_of(t, 0, kD), u = row_of(t, 1, kD), dv = row_of(t, 2, kD);
  const Exact e = exact_row(c, u, dv, kScale);
  const auto loss = [&](const std::vector<double>& cc, const std::vector<double>& uu) {
    const std::vector<double> v = forward_row(cc, uu, kScale);
    double sum = 0;
    for (std::int64_t i = 0; i < kD; ++i) sum += dv[i] * v[i];
    return sum;
  };
  constexpr double kH = 1e-6;
  for (std::int64_t i = 0; i < kD; ++i) {
    std::vector<double> cp = c, cm = c, up = u, um = u;
    cp[i] += kH;
    cm[i] -= kH;
    up[i] += kH;
    um[i] -= kH;
    EXPECT_NEAR((loss(cp, u) - loss(cm, u)) / (2 * kH), e.dcond[i], 1e-6) << i;
    EXPECT_NEAR((loss(c, up) - loss(c, um)) / (2 * kH), e.duncond[i], 1e-6) << i;
  }
}

// The sampler's batch of 2B rows and the trainer's single rows: a row's bytes alone equal
// its bytes among others, on the reference and every path.
TEST(TrueCfgOp, ARowsBytesDoNotDependOnTheOtherRows) {
  const test::RuntimeGuard guard;
  test::Rng rng(9);
  const HostTensor cond = test::random_tensor(DType::BF16, {6, 64}, rng);
  const HostTensor uncond = test::random_tensor(DType::BF16, {6, 64}, rng);
  const HostTensor dv = test::random_tensor(DType::BF16, {6, 64}, rng);
  HostTensor c1(DType::BF16, {1, 64}), u1(DType::BF16, {1, 64}), d1(DType::BF16, {1, 64});
  for (std::int64_t i = 0; i < 64; ++i) {
    c1.set(i, cond.get(3 * 64 + i));
    u1.set(i, uncond.get(3 * 64 + i));
    d1.set(i, dv.get(3 * 64 + i));
  }
  set_backend("simd");
  set_num_threads(2);
  const Results batch = run_all(cond, uncond, dv), alone = run_all(c1, u1, d1);
  for (std::int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(batch.v.get(3 * 64 + i), alone.v.get(i));
    EXPECT_EQ(batch.dcond.get(3 * 64 + i), alone.dcond.get(i));
    EXPECT_EQ(batch.duncond.get(3 * 64 + i), alone.duncond.get(i));
  }
}

TEST(TrueCfgOp, InPlaceAndOneGradientEqualTheFullCall) {
  test::Rng rng(10);
  const HostTensor cond = test::random_tensor(DType::F32, {4, 64}, rng);
  const HostTensor uncond = test::random_tensor(DType::F32, {4, 64}, rng);
  const HostTensor dv = test::random_tensor(DType::F32, {4, 64}, rng);
  const Results want = run_all(cond, uncond, dv);
  HostTensor in_place = uncond;
  true_cfg_forward(cond.cview(), in_place.cview(), in_place.view(), {kScale});
  EXPECT_TRUE(in_place == want.v);
  HostTensor only_dcond(DType::F32, {4, 64});
  true_cfg_backward(cond.cview(), uncond.cview(), dv.cview(), only_dcond.view(), std::nullopt,
                    {kScale});
  EXPECT_TRUE(only_dcond == want.dcond);
}

// A zero conditional row: the rescale is 0 and the norm's gradient share is 0, as torch's
// gradient of a norm at 0; nothing is NaN.
TEST(TrueCfgOp, AZeroConditionalRowHasFiniteGradients) {
  test::Rng rng(11);
  const HostTensor cond(DType::F32, {1, 64});
  const HostTensor uncond = test::random_tensor(DType::F32, {1, 64}, rng);
  const HostTensor dv = test::random_tensor(DType::F32, {1, 64}, rng);
  const Results r = run_all(cond, uncond, dv);
  for (std::int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(r.v.get(i), 0.0);
    EXPECT_TRUE(std::isfinite(r.dcond.get(i))) << i;
    EXPECT_TRUE(std::isfinite(r.duncond.get(i))) << i;
  }
}

TEST(TrueCfgOp, BadArgumentsAreErrorsNamingThemAndWriteNothing) {
  HostTensor cond(DType::F32, {2, 64}), uncond(DType::F32, {2, 63}), v(DType::F32, {2, 64});
  v.fill_bytes(std::byte{0x5A});
  const HostTensor before = v;
  EXPECT_EQ(
      test::rejected_argument([&] { true_cfg_forward(cond.cview(), uncond.cview(), v.view()); }),
      "uncond");
  EXPECT_EQ(test::rejected_argument(
                [&] { true_cfg_forward(cond.cview(), cond.cview(), v.view(), {INFINITY}); }),
            "scale");
  EXPECT_TRUE(v == before);
  HostTensor dv(DType::F32, {2, 64});
  EXPECT_EQ(test::rejected_argument([&] {
              true_cfg_backward(cond.cview(), cond.cview(), dv.cview(), std::nullopt, std::nullopt);
            }),
            "dcond");
  HostTensor wrong(DType::F32, {2, 32});
  EXPECT_EQ(test::rejected_argument([&] {
              true_cfg_backward(cond.cview(), cond.cview(), dv.cview(), std::nullopt, wrong.view());
            }),
            "duncond");
}

}  // namespace
}  // namespace kernel_align
