// linear_forward / linear_backward through the public API: the simd backend (every path,
// thread count) against the reference backend byte for byte; a row's bytes do not depend
// on the rows it is batched with; tensor-parallel shards combined in the tree's order give
// the unsharded bytes; the backward's GEMMs are the gradient (exact on integer data) and
// its activation step is the contract's activate_backward; bad arguments are Errors that
// name them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernel_align/contract/linear.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "support/errors.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

constexpr Activation kActivations[] = {Activation::None, Activation::GeluTanh, Activation::Silu};
constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};

struct Inputs {
  HostTensor x, w, b;
};

Inputs random_inputs(DType dtype, std::vector<std::int64_t> x_shape, std::int64_t n,
                     std::uint64_t seed) {
  test::Rng rng(seed);
  const std::int64_t k = x_shape.back();
  HostTensor x = test::random_tensor(dtype, std::move(x_shape), rng);
  HostTensor w = test::random_tensor(dtype, {n, k}, rng, 0.1);
  HostTensor b = test::random_tensor(dtype, {n}, rng);
  return {std::move(x), std::move(w), std::move(b)};
}

std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

HostTensor forward(const Inputs& in, bool bias, Activation activation, DType out_dtype) {
  HostTensor y(out_dtype, with_last(in.x.shape(), in.w.shape()[0]));
  linear_forward(in.x.cview(), in.w.cview(), bias ? std::optional(in.b.cview()) : std::nullopt,
                 y.view(), {activation});
  return y;
}

struct Grads {
  HostTensor dx, dw, db;
  bool operator==(const Grads&) const = default;
};

Grads backward(const Inputs& in, const HostTensor& dy, Activation activation, DType out_dtype) {
  Grads g{HostTensor(out_dtype, in.x.shape()), HostTensor(out_dtype, in.w.shape()),
          HostTensor(out_dtype, in.b.shape())};
  linear_backward(in.x.cview(), in.w.cview(), in.b.cview(), dy.cview(), g.dx.view(), g.dw.view(),
                  g.db.view(), {activation});
  return g;
}

TEST(LinearOp, SimdEqualsReferenceOnEveryPathAndThreadCount) {
  const test::RuntimeGuard guard;
  for (const DType dtype : kDTypes) {
    for (const Activation activation : kActivations) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + activation_name(activation));
      const Inputs in = random_inputs(dtype, {2, 37, 100}, 70, 1);
      test::Rng rng(2);
      const HostTensor dy = test::random_tensor(dtype, {2, 37, 70}, rng);
      set_backend("reference");
      const HostTensor want_y = forward(in, true, activation, dtype);
      const HostTensor want_y_no_bias = forward(in, false, activation, DType::F32);
      const Grads want = backward(in, dy, activation, dtype);
      EXPECT_EQ(last_call().backend, "reference");
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(isa_name(path)) + " threads " + std::to_string(threads));
          set_num_threads(threads);
          EXPECT_TRUE(forward(in, true, activation, dtype) == want_y);
          EXPECT_EQ(last_call().backend, "simd");
          EXPECT_TRUE(forward(in, false, activation, DType::F32) == want_y_no_bias);
          EXPECT_TRUE(backward(in, dy, activation, dtype) == want);
        }
      }
    }
  }
}

// Each row of y computed alone (M = 1) equals that row of the batched call (M = 7), and
// so does each row of dx: what a per-sample trainer and a batched sampler compute.
TEST(LinearOp, RowsDoNotDependOnTheirBatch) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kM = 7, kK = 3072, kN = 96;
  for (const Activation activation : kActivations) {
    const Inputs in = random_inputs(DType::BF16, {kM, kK}, kN, 3);
    test::Rng rng(4);
    const HostTensor dy = test::random_tensor(DType::BF16, {kM, kN}, rng);
    set_num_threads(2);
    const std::vector<double> y = forward(in, true, activation, DType::BF16).values();
    const std::vector<double> dx = backward(in, dy, activation, DType::F32).dx.values();
    for (std::int64_t m = 0; m < kM; ++m) {
      const ConstTensorView x_row = narrow(in.x.cview(), 0, m, m + 1);
      HostTensor y_row(DType::BF16, {1, kN});
      linear_forward(x_row, in.w.cview(), in.b.cview(), y_row.view(), {activation});
      const std::vector<double> y_alone = y_row.values();
      EXPECT_TRUE(std::equal(y_alone.begin(), y_alone.end(), y.begin() + m * kN)) << "row " << m;
      HostTensor dx_row(DType::F32, {1, kK});
      linear_backward(x_row, in.w.cview(), in.b.cview(), narrow(dy.cview(), 0, m, m + 1),
                      dx_row.view(), std::nullopt, std::nullopt, {activation});
      const std::vector<double> dx_alone = dx_row.values();
      EXPECT_TRUE(std::equal(dx_alone.begin(), dx_alone.end(), dx.begin() + m * kK)) << "row " << m;
    }
  }
}

// Row-parallel shards: x and w cut along K into P parts; each part's product by
// linear_forward into fp32 without bias, the partials combined by the tree's top levels
// (contract::linear_combine_shards), then bias and activation: the unsharded bytes.
TEST(LinearOp, TensorParallelShardsReproduceTheUnshardedCall) {
  constexpr std::int64_t kM = 5, kN = 40;
  for (const std::int64_t k : {256, 3072, 3584}) {
    const Inputs in = random_inputs(DType::F32, {kM, k}, kN, 5);
    const HostTensor want = forward(in, true, Activation::GeluTanh, DType::F32);
    for (const int p : {2, 4, 8}) {
      SCOPED_TRACE("K " + std::to_string(k) + " P " + std::to_string(p));
      ASSERT_TRUE(contract::linear_shards_reproduce(k, p));
      const std::int64_t part = k / p;
      std::vector<HostTensor> partials;
      for (int s = 0; s < p; ++s) {
        HostTensor y(DType::F32, {kM, kN});
        linear_forward(narrow(in.x.cview(), 1, s * part, (s + 1) * part),
                       narrow(in.w.cview(), 1, s * part, (s + 1) * part), std::nullopt, y.view());
        partials.push_back(std::move(y));
      }
      HostTensor got(DType::F32, {kM, kN});
      for (std::int64_t i = 0; i < kM * kN; ++i) {
        float sums[8];
        for (int s = 0; s < p; ++s) sums[s] = static_cast<float>(partials[s].get(i));
        const auto bias = static_cast<float>(in.b.get(i % kN));
        got.set(i, contract::linear_output(contract::linear_combine_shards(sums, p), &bias,
                                           contract::Activation::GeluTanh));
      }
      EXPECT_TRUE(got == want);
    }
  }
}

// On small integers every product and sum is exact: the backward's three products are
// dy w, dy^T x and the column sums of dy, whatever the tree.
TEST(LinearOp, BackwardIsTheGradientOnExactData) {
  constexpr std::int64_t kM = 9, kK = 70, kN = 33;
  test::Rng rng(6);
  Inputs in{HostTensor(DType::F32, {kM, kK}), HostTensor(DType::F32, {kN, kK}),
            HostTensor(DType::F32, {kN})};
  HostTensor dy(DType::F32, {kM, kN});
  for (HostTensor* t : {&in.x, &in.w, &in.b, &dy}) {
    for (std::int64_t i = 0; i < t->elements(); ++i) t->set(i, double(rng.below(9) - 4));
  }
  const Grads g = backward(in, dy, Activation::None, DType::F32);
  for (std::int64_t m = 0; m < kM; ++m) {
    for (std::int64_t k = 0; k < kK; ++k) {
      double want = 0;
      for (std::int64_t n = 0; n < kN; ++n) want += dy.get(m * kN + n) * in.w.get(n * kK + k);
      ASSERT_EQ(g.dx.get(m * kK + k), want) << m << " " << k;
    }
  }
  for (std::int64_t n = 0; n < kN; ++n) {
    double bias_grad = 0;
    for (std::int64_t m = 0; m < kM; ++m) bias_grad += dy.get(m * kN + n);
    ASSERT_EQ(g.db.get(n), bias_grad) << n;
    for (std::int64_t k = 0; k < kK; ++k) {
      double want = 0;
      for (std::int64_t m = 0; m < kM; ++m) want += dy.get(m * kN + n) * in.x.get(m * kK + k);
      ASSERT_EQ(g.dw.get(n * kK + k), want) << n << " " << k;
    }
  }
}

// With an activation, the backward is: z recomputed by the forward's tree (fp32, no
// activation), dz = activate_backward(dy, z) in fp32, then the products of dz.
TEST(LinearOp, ActivationBackwardIsTheContractsOnTheRecomputedPreactivation) {
  constexpr std::int64_t kM = 6, kK = 300, kN = 50;
  for (const Activation activation : {Activation::GeluTanh, Activation::Silu}) {
    const Inputs in = random_inputs(DType::BF16, {kM, kK}, kN, 7);
    test::Rng rng(8);
    const HostTensor dy = test::random_tensor(DType::BF16, {kM, kN}, rng);
    const HostTensor z = forward(in, true, Activation::None, DType::F32);
    HostTensor dz(DType::F32, {kM, kN});
    for (std::int64_t i = 0; i < kM * kN; ++i) {
      dz.set(i, contract::activate_backward(static_cast<contract::Activation>(activation),
                                            static_cast<float>(dy.get(i)),
                                            static_cast<float>(z.get(i))));
    }
    const Grads want = backward(in, dz, Activation::None, DType::F32);
    EXPECT_TRUE(backward(in, dy, activation, DType::F32) == want) << activation_name(activation);
  }
}

TEST(LinearOp, BadArgumentsAreErrorsNamingThem) {
  const Inputs in = random_inputs(DType::F32, {4, 64}, 8, 9);
  HostTensor y(DType::F32, {4, 8});
  const auto fwd = [&](const ConstTensorView& x, const ConstTensorView& w,
                       std::optional<ConstTensorView> b, const TensorView& out) {
    return test::rejected_argument([&] { linear_forward(x, w, b, out); });
  };
  EXPECT_EQ(fwd(in.x.cview(), in.w.cview(), in.b.cview(), y.view()), "(accepted)");
  const HostTensor w_short(DType::F32, {8, 63});
  EXPECT_EQ(fwd(in.x.cview(), w_short.cview(), std::nullopt, y.view()), "weight");
  const HostTensor b_long(DType::F32, {9});
  EXPECT_EQ(fwd(in.x.cview(), in.w.cview(), b_long.cview(), y.view()), "bias");
  HostTensor y_wide(DType::F32, {4, 9});
  EXPECT_EQ(fwd(in.x.cview(), in.w.cview(), std::nullopt, y_wide.view()), "y");
  HostTensor y_rows(DType::F32, {5, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.w.cview(), std::nullopt, y_rows.view()), "y");
  // y over x's memory.
  HostTensor shared(DType::F32, {4, 64});
  TensorView y_in_x = test::strided(shared.view(), {4, 8}, {64, 1});
  EXPECT_EQ(fwd(shared.cview(), in.w.cview(), std::nullopt, y_in_x), "y");
  // Leading dims that do not flatten to one row stride: the batch dim steps over a gap.
  HostTensor x3(DType::F32, {2, 3, 80});
  const ConstTensorView gapped = test::strided(x3.cview(), {2, 2, 64}, {240, 80, 1});
  HostTensor y3(DType::F32, {2, 2, 8});
  EXPECT_EQ(fwd(gapped, in.w.cview(), std::nullopt, y3.view()), "x");
  // A row slice flattens: [2, 2, 64] of a [2, 2, 80] buffer steps 80 per row.
  HostTensor x_rows(DType::F32, {2, 2, 80});
  EXPECT_EQ(fwd(test::strided(x_rows.cview(), {2, 2, 64}, {160, 80, 1}), in.w.cview(), std::nullopt,
                y3.view()),
            "(accepted)");

  HostTensor dy(DType::F32, {4, 8});
  HostTensor dx(DType::F32, {4, 64});
  HostTensor db(DType::F32, {8});
  EXPECT_EQ(test::rejected_argument([&] {
              linear_backward(in.x.cview(), in.w.cview(), std::nullopt, dy.cview(), dx.view(),
                              std::nullopt, db.view());
            }),
            "db");
  EXPECT_EQ(test::rejected_argument([&] {
              linear_backward(in.x.cview(), in.w.cview(), in.b.cview(), y_wide.cview(), dx.view(),
                              std::nullopt, std::nullopt);
            }),
            "dy");
  HostTensor dw_bad(DType::F32, {8, 65});
  EXPECT_EQ(test::rejected_argument([&] {
              linear_backward(in.x.cview(), in.w.cview(), in.b.cview(), dy.cview(), std::nullopt,
                              dw_bad.view(), std::nullopt);
            }),
            "dw");
}

}  // namespace
}  // namespace kernel_align
