// adaln_modulation_forward / _backward through the public API: the simd backend (every
// path, 1 to 3 threads) against the reference backend byte for byte; a sample's bytes
// alone equal its bytes in a batch (its dscale and dshift too: sums over its own tokens);
// in place equals out of place; the single-rounding mode within a bound of an fp64
// evaluation of the formula and its gradients; bad arguments are Errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
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
constexpr NormMode kModes[] = {NormMode::Single, NormMode::Diffusers};

// x, dy [B, S, D]; scale, shift [B, D].
struct Inputs {
  HostTensor x, dy, scale, shift;
};

Inputs random_inputs(DType dtype, std::int64_t batch, std::int64_t seq, std::int64_t dim,
                     std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor x = test::random_tensor(dtype, {batch, seq, dim}, rng);
  HostTensor dy = test::random_tensor(dtype, {batch, seq, dim}, rng);
  HostTensor scale = test::random_tensor(dtype, {batch, dim}, rng);
  HostTensor shift = test::random_tensor(dtype, {batch, dim}, rng);
  return {std::move(x), std::move(dy), std::move(scale), std::move(shift)};
}

struct Results {
  HostTensor y, dx, dscale, dshift;
  bool operator==(const Results&) const = default;
};

Results run_both(const Inputs& in, DType out_dtype, const AdaLnOptions& options) {
  Results r{HostTensor(out_dtype, in.x.shape()), HostTensor(out_dtype, in.x.shape()),
            HostTensor(out_dtype, in.scale.shape()), HostTensor(out_dtype, in.scale.shape())};
  adaln_modulation_forward(in.x.cview(), in.scale.cview(), in.shift.cview(), r.y.view(), options);
  adaln_modulation_backward(in.x.cview(), in.scale.cview(), in.dy.cview(), r.dx.view(),
                            r.dscale.view(), r.dshift.view(), options);
  return r;
}

// 300 tokens: two token blocks of the sums over a sample's tokens (256 and 44).
TEST(AdaLnOp, SimdEqualsReferenceOnEveryPathAndThreadCount) {
  const test::RuntimeGuard guard;
  for (const DType dtype : kDTypes) {
    for (const NormMode mode : kModes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + norm_mode_name(mode));
      const Inputs in = random_inputs(dtype, 3, 300, 40, 1);
      const AdaLnOptions options{.mode = mode};
      set_backend("reference");
      const Results want = run_both(in, dtype, options);
      EXPECT_EQ(last_call().backend, "reference");
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(isa_name(path)) + " threads " + std::to_string(threads));
          set_num_threads(threads);
          EXPECT_TRUE(run_both(in, dtype, options) == want);
          EXPECT_EQ(last_call().backend, "simd");
        }
      }
    }
  }
}

// A model's width (3072: 192 full chunks) and strided rows (every other element of wider
// rows, an output of its own strides): the simd paths' vector rows give the reference's
// bytes, forward and backward (dscale and dshift together, or dshift alone).
TEST(AdaLnOp, WideAndStridedRowsEqualTheReference) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kB = 2, kS = 9, kD = 3072;
  for (const DType dtype : kDTypes) {
    for (const NormMode mode : kModes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + norm_mode_name(mode));
      const Inputs in = random_inputs(dtype, kB, kS, kD, 17);
      const AdaLnOptions options{.mode = mode};
      set_backend("reference");
      HostTensor want(dtype, in.x.shape());
      adaln_modulation_forward(in.x.cview(), in.scale.cview(), in.shift.cview(), want.view(),
                               options);
      HostTensor wide_x(dtype, {kB, kS, 2 * kD}), wide_y(dtype, {kB, kS, 2 * kD});
      for (std::int64_t e = 0; e < in.x.elements(); ++e) wide_x.set(2 * e, in.x.get(e));
      const auto every_other = [](auto view) {
        return test::strided(view, {kB, kS, kD}, {kS * 2 * kD, 2 * kD, 2});
      };
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        SCOPED_TRACE(isa_name(path));
        set_isa(path);
        HostTensor y(dtype, in.x.shape());
        adaln_modulation_forward(in.x.cview(), in.scale.cview(), in.shift.cview(), y.view(),
                                 options);
        EXPECT_TRUE(y == want);
        adaln_modulation_forward(every_other(wide_x.cview()), in.scale.cview(), in.shift.cview(),
                                 every_other(wide_y.view()), options);
        for (std::int64_t e = 0; e < want.elements(); ++e) {
          ASSERT_EQ(wide_y.get(2 * e), want.get(e)) << e;
        }
      }
      // The backward on a batch of 300 tokens: two token blocks a sample.
      const Inputs grads = random_inputs(dtype, kB, 300, kD, 19);
      const auto backward = [&](bool with_scale) {
        Results r{HostTensor(dtype, grads.x.shape()), HostTensor(dtype, grads.x.shape()),
                  HostTensor(dtype, grads.scale.shape()), HostTensor(dtype, grads.scale.shape())};
        adaln_modulation_backward(
            grads.x.cview(), grads.scale.cview(), grads.dy.cview(), r.dx.view(),
            with_scale ? std::optional(r.dscale.view()) : std::nullopt, r.dshift.view(), options);
        return r;
      };
      set_backend("reference");
      const Results want_both = backward(true);
      const Results want_shift = backward(false);
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        SCOPED_TRACE(std::string("backward ") + isa_name(path));
        set_isa(path);
        EXPECT_TRUE(backward(true) == want_both);
        EXPECT_TRUE(backward(false) == want_shift);
      }
    }
  }
}

// Sample 1 of a batch of 3 against the same sample alone: the same bytes of y, dx, dscale
// and dshift, on both backends and with [B, 1, D] modulation views.
TEST(AdaLnOp, ASampleAloneEqualsItsBytesInABatch) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kSeq = 270, kDim = 24;
  const Inputs batch = random_inputs(DType::BF16, 3, kSeq, kDim, 5);
  Inputs alone = random_inputs(DType::BF16, 1, kSeq, kDim, 6);
  const auto copy = [](const HostTensor& from, HostTensor& to, std::int64_t first) {
    for (std::int64_t e = 0; e < to.elements(); ++e) to.set(e, from.get(first + e));
  };
  copy(batch.x, alone.x, kSeq * kDim);
  copy(batch.dy, alone.dy, kSeq * kDim);
  copy(batch.scale, alone.scale, kDim);
  copy(batch.shift, alone.shift, kDim);
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const Results all = run_both(batch, DType::BF16, {});
      const Results one = run_both(alone, DType::BF16, {});
      const auto same = [](const HostTensor& a, const HostTensor& b, std::int64_t first) {
        for (std::int64_t e = 0; e < b.elements(); ++e) {
          if (a.get(first + e) != b.get(e) ||
              std::signbit(a.get(first + e)) != std::signbit(b.get(e))) {
            return false;
          }
        }
        return true;
      };
      EXPECT_TRUE(same(all.y, one.y, kSeq * kDim));
      EXPECT_TRUE(same(all.dx, one.dx, kSeq * kDim));
      EXPECT_TRUE(same(all.dscale, one.dscale, kDim));
      EXPECT_TRUE(same(all.dshift, one.dshift, kDim));
    }
  }
  // [B, 1, D] views of the same modulation give the same bytes.
  HostTensor y(DType::BF16, batch.x.shape()), y3(DType::BF16, batch.x.shape());
  adaln_modulation_forward(batch.x.cview(), batch.scale.cview(), batch.shift.cview(), y.view());
  ConstTensorView scale3 = test::strided(batch.scale.cview(), {3, 1, kDim}, {kDim, kDim, 1});
  ConstTensorView shift3 = test::strided(batch.shift.cview(), {3, 1, kDim}, {kDim, kDim, 1});
  adaln_modulation_forward(batch.x.cview(), scale3, shift3, y3.view());
  EXPECT_TRUE(y == y3);
}

TEST(AdaLnOp, InPlaceEqualsOutOfPlace) {
  const test::RuntimeGuard guard;
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    const Inputs in = random_inputs(DType::F32, 2, 33, 16, 7);
    const Results want = run_both(in, DType::F32, {});
    HostTensor x = in.x;
    adaln_modulation_forward(x.cview(), in.scale.cview(), in.shift.cview(), x.view());
    EXPECT_TRUE(x == want.y);
    // dx over dy, then over x: the sums over tokens read both before any dx is written.
    HostTensor dy = in.dy;
    HostTensor dscale(DType::F32, in.scale.shape()), dshift(DType::F32, in.scale.shape());
    adaln_modulation_backward(in.x.cview(), in.scale.cview(), dy.cview(), dy.view(), dscale.view(),
                              dshift.view());
    EXPECT_TRUE(dy == want.dx);
    EXPECT_TRUE(dscale == want.dscale);
    EXPECT_TRUE(dshift == want.dshift);
    HostTensor x2 = in.x;
    adaln_modulation_backward(x2.cview(), in.scale.cview(), in.dy.cview(), x2.view(), dscale.view(),
                              std::nullopt);
    EXPECT_TRUE(x2 == want.dx);
    EXPECT_TRUE(dscale == want.dscale);
  }
}

// The single-rounding fp32 results against the formula in fp64: within the bound of
// docs/accuracy.md's adaln_modulation row (a few units of fp32 rounding of the terms'
// magnitude).
TEST(AdaLnOp, SingleModeIsTheFormulaWithinTheBound) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kBatch = 2, kSeq = 300, kDim = 96;
  const Inputs in = random_inputs(DType::F32, kBatch, kSeq, kDim, 9);
  const Results got = run_both(in, DType::F32, {.mode = NormMode::Single});
  std::vector<double> dscale(kBatch * kDim, 0.0), dshift(kBatch * kDim, 0.0);
  const double eps = 1e-6;
  double worst_y = 0, worst_dx = 0;
  for (std::int64_t b = 0; b < kBatch; ++b) {
    for (std::int64_t s = 0; s < kSeq; ++s) {
      const std::int64_t row = (b * kSeq + s) * kDim;
      double mean = 0, var = 0;
      for (std::int64_t i = 0; i < kDim; ++i) mean += in.x.get(row + i);
      mean /= kDim;
      for (std::int64_t i = 0; i < kDim; ++i) var += std::pow(in.x.get(row + i) - mean, 2);
      const double rstd = 1.0 / std::sqrt(var / kDim + eps);
      std::vector<double> n(kDim), g(kDim);
      double sum_g = 0, sum_gn = 0;
      for (std::int64_t i = 0; i < kDim; ++i) {
        n[i] = (in.x.get(row + i) - mean) * rstd;
        const double m = 1 + in.scale.get(b * kDim + i);
        const double y = n[i] * m + in.shift.get(b * kDim + i);
        worst_y = std::max(worst_y, std::abs(got.y.get(row + i) - y) / (std::abs(n[i] * m) + 1));
        const double dy = in.dy.get(row + i);
        g[i] = dy * m;
        sum_g += g[i];
        sum_gn += g[i] * n[i];
        dscale[b * kDim + i] += dy * n[i];
        dshift[b * kDim + i] += dy;
      }
      for (std::int64_t i = 0; i < kDim; ++i) {
        const double dx = rstd * (g[i] - sum_g / kDim - n[i] * sum_gn / kDim);
        worst_dx = std::max(worst_dx, std::abs(got.dx.get(row + i) - dx) / (rstd * 8));  // |g n|
      }
    }
  }
  double worst_sums = 0;
  for (std::int64_t e = 0; e < kBatch * kDim; ++e) {
    worst_sums = std::max(worst_sums, std::abs(got.dscale.get(e) - dscale[e]) / kSeq);
    worst_sums = std::max(worst_sums, std::abs(got.dshift.get(e) - dshift[e]) / kSeq);
  }
  // Relative to the terms' magnitude: y 2^-20 (a few fp32 ulps), dx and the sums over
  // tokens 2^-18 (the differences of dx cancel; the sums round S times).
  EXPECT_LT(worst_y, 1.0 / (1 << 20));
  EXPECT_LT(worst_dx, 1.0 / (1 << 18));
  EXPECT_LT(worst_sums, 1.0 / (1 << 18));
}

TEST(AdaLnOp, BadArgumentsAreErrorsNamingThem) {
  const test::RuntimeGuard guard;
  const Inputs in = random_inputs(DType::F32, 2, 5, 8, 11);
  HostTensor y(DType::F32, {2, 5, 8});
  const auto fwd = [&](const ConstTensorView& x, const ConstTensorView& scale,
                       const ConstTensorView& shift, const TensorView& out,
                       const AdaLnOptions& options = {}) {
    return test::rejected_argument(
        [&] { adaln_modulation_forward(x, scale, shift, out, options); });
  };
  EXPECT_EQ(fwd(in.x.cview(), in.scale.cview(), in.shift.cview(), y.view()), "(accepted)");
  const HostTensor x2(DType::F32, {10, 8});
  EXPECT_EQ(fwd(x2.cview(), in.scale.cview(), in.shift.cview(), y.view()), "x");
  const HostTensor wide(DType::F32, {1, 1, kMaxHeadDim + 1});
  EXPECT_EQ(fwd(wide.cview(), in.scale.cview(), in.shift.cview(), y.view()), "x");
  const HostTensor scale_d(DType::F32, {2, 9});
  EXPECT_EQ(fwd(in.x.cview(), scale_d.cview(), in.shift.cview(), y.view()), "scale");
  const HostTensor scale_s(DType::F32, {2, 5, 8});  // per token: not a modulation
  EXPECT_EQ(fwd(in.x.cview(), scale_s.cview(), in.shift.cview(), y.view()), "scale");
  const HostTensor shift_b(DType::F32, {1, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.scale.cview(), shift_b.cview(), y.view()), "shift");
  const HostTensor bool_shift(DType::Bool, {2, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.scale.cview(), bool_shift.cview(), y.view()), "shift");
  HostTensor y_short(DType::F32, {2, 4, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.scale.cview(), in.shift.cview(), y_short.view()), "y");
  // y over scale's memory: only x may be overwritten.
  HostTensor scale_and_y(DType::F32, {2, 5, 8});
  const ConstTensorView scale_in_y = test::strided(scale_and_y.cview(), {2, 8}, {40, 1});
  EXPECT_EQ(fwd(in.x.cview(), scale_in_y, in.shift.cview(), scale_and_y.view()), "y");
  EXPECT_EQ(fwd(in.x.cview(), in.scale.cview(), in.shift.cview(), y.view(), {.eps = -1.0f}), "eps");

  HostTensor dx(DType::F32, {2, 5, 8}), dscale(DType::F32, {2, 8}), dshift(DType::F32, {2, 8});
  const auto bwd = [&](const ConstTensorView& dy, const TensorView& gx,
                       const std::optional<TensorView>& gs, const std::optional<TensorView>& gt) {
    return test::rejected_argument(
        [&] { adaln_modulation_backward(in.x.cview(), in.scale.cview(), dy, gx, gs, gt); });
  };
  EXPECT_EQ(bwd(in.dy.cview(), dx.view(), dscale.view(), dshift.view()), "(accepted)");
  EXPECT_EQ(bwd(in.dy.cview(), dx.view(), std::nullopt, std::nullopt), "(accepted)");
  EXPECT_EQ(bwd(y_short.cview(), dx.view(), dscale.view(), dshift.view()), "dy");
  EXPECT_EQ(bwd(in.dy.cview(), y_short.view(), dscale.view(), dshift.view()), "dx");
  HostTensor dscale_3(DType::F32, {2, 1, 8});  // not scale's shape
  EXPECT_EQ(bwd(in.dy.cview(), dx.view(), dscale_3.view(), dshift.view()), "dscale");
  EXPECT_EQ(bwd(in.dy.cview(), dx.view(), dscale.view(), dscale.view()), "dshift");
}

}  // namespace
}  // namespace kernel_align
