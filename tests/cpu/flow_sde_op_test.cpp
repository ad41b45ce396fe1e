// flow_sde_step and flow_sde_logp through the public API (contract section 15): every
// backend path and thread count gives the contract's bytes, computed here literally
// (contract::linear_sum over the distances, the scalar functions elementwise); a sample's
// bytes alone equal its bytes in a batch; strided views and in place equal contiguous
// calls; the log-probability and its gradient agree with Flow-GRPO's formulas in fp64;
// bad arguments are Errors naming them, nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/flow_sde.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"
#include "support/errors.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};
const FlowSdeOptions kStep{
    .sigma = 0.8f, .sigma_prev = 0.6f, .noise_level = 0.7f, .sigma_max = 0.9f};

// Each result of the four calls, computed literally from the contract's functions.
struct Expected {
  HostTensor prev, dx_step, dv_step, logp, dx, dv;
};

Expected contract_results(const HostTensor& x, const HostTensor& v, const HostTensor& noise,
                          const HostTensor& given_prev, const HostTensor& dprev,
                          const HostTensor& dlogp, const FlowSdeOptions& o) {
  const FlowSdeCoefficients c =
      flow_sde_coefficients(o.sigma, o.sigma_prev, o.noise_level, o.sigma_max);
  const DType t = x.dtype();
  const std::int64_t batch = x.shape()[0], n = x.elements() / batch;
  Expected e{HostTensor(t, x.shape()),        HostTensor(t, x.shape()), HostTensor(t, x.shape()),
             HostTensor(DType::F32, {batch}), HostTensor(t, x.shape()), HostTensor(t, x.shape())};
  const auto mean = [&](std::int64_t i) {
    return contract::flow_sde_mean(static_cast<float>(x.get(i)), static_cast<float>(v.get(i)),
                                   c.x_scale, c.v_scale);
  };
  for (std::int64_t i = 0; i < x.elements(); ++i) {
    e.prev.set(i,
               contract::flow_sde_prev(mean(i), static_cast<float>(noise.get(i)), c.noise_scale));
    const auto g = static_cast<float>(dprev.get(i));
    e.dx_step.set(i, contract::mul(g, c.x_scale));
    e.dv_step.set(i, contract::mul(g, c.v_scale));
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto distance = [&](std::int64_t k) {
      return contract::sub(static_cast<float>(given_prev.get(b * n + k)), mean(b * n + k));
    };
    const float s = contract::linear_sum(n, [&](std::int64_t k) {
      const float d = distance(k);
      return std::pair{d, d};
    });
    e.logp.set(b, contract::flow_sde_logp(s, static_cast<float>(n), c.inverse_two_variance,
                                          c.log_normalizer));
    const float g = contract::flow_sde_logp_grad_scale(
        static_cast<float>(dlogp.get(b)), static_cast<float>(n), c.inverse_two_variance);
    for (std::int64_t k = 0; k < n; ++k) {
      const float dmean = contract::mul(g, distance(k));
      e.dx.set(b * n + k, contract::mul(dmean, c.x_scale));
      e.dv.set(b * n + k, contract::mul(dmean, c.v_scale));
    }
  }
  return e;
}

Expected run_all(const HostTensor& x, const HostTensor& v, const HostTensor& noise,
                 const HostTensor& given_prev, const HostTensor& dprev, const HostTensor& dlogp,
                 const FlowSdeOptions& o) {
  const DType t = x.dtype();
  const std::int64_t batch = x.shape()[0];
  Expected r{HostTensor(t, x.shape()),        HostTensor(t, x.shape()), HostTensor(t, x.shape()),
             HostTensor(DType::F32, {batch}), HostTensor(t, x.shape()), HostTensor(t, x.shape())};
  flow_sde_step_forward(x.cview(), v.cview(), noise.cview(), r.prev.view(), o);
  flow_sde_step_backward(dprev.cview(), r.dx_step.view(), r.dv_step.view(), o);
  flow_sde_logp_forward(x.cview(), v.cview(), given_prev.cview(), r.logp.view(), o);
  flow_sde_logp_backward(x.cview(), v.cview(), given_prev.cview(), dlogp.cview(), r.dx.view(),
                         r.dv.view(), o);
  return r;
}

bool operator==(const Expected& a, const Expected& b) {
  return a.prev == b.prev && a.dx_step == b.dx_step && a.dv_step == b.dv_step && a.logp == b.logp &&
         a.dx == b.dx && a.dv == b.dv;
}

struct Inputs {
  HostTensor x, v, noise, prev, dprev, dlogp;
};

Inputs random_inputs(DType t, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  test::Rng rng(seed);
  Inputs in{test::random_tensor(t, shape, rng, 2.0),
            test::random_tensor(t, shape, rng, 2.0),
            test::random_tensor(t, shape, rng, 1.0),
            test::random_tensor(t, shape, rng, 2.0),
            test::random_tensor(t, shape, rng, 1.0),
            test::random_tensor(DType::F32, {shape[0]}, rng, 1.0)};
  return in;
}

TEST(FlowSdeOp, EveryBackendPathAndThreadCountComputesTheContract) {
  const test::RuntimeGuard guard;
  // Samples of fewer elements than a leaf, of leaves crossing rows, of several chunks
  // (128 leaves) with a partial last leaf; ranks 2 to 4; one sample whose tree splits in
  // parts over 2 threads (4096 elements: 128 leaves, every power of two up to 64 parts)
  // and one whose tree does not (945).
  const std::vector<std::vector<std::int64_t>> shapes = {{3, 17},       {2, 5, 64}, {2, 300, 64},
                                                         {1, 3, 7, 45}, {4, 9000},  {1, 64, 64}};
  for (const auto& shape : shapes) {
    for (const DType dtype : kDTypes) {
      SCOPED_TRACE(std::to_string(shape.size()) + "-D " + std::to_string(shape.back()) + " " +
                   dtype_name(dtype));
      const Inputs in = random_inputs(dtype, shape, 11);
      const Expected want =
          contract_results(in.x, in.v, in.noise, in.prev, in.dprev, in.dlogp, kStep);
      set_backend("reference");
      EXPECT_TRUE(run_all(in.x, in.v, in.noise, in.prev, in.dprev, in.dlogp, kStep) == want);
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          EXPECT_TRUE(run_all(in.x, in.v, in.noise, in.prev, in.dprev, in.dlogp, kStep) == want)
              << isa_name(path) << " " << threads;
        }
      }
    }
  }
}

// Sample 1 of a batch of 3, alone, has the bytes it has in the batch.
TEST(FlowSdeOp, ASamplesBytesDoNotDependOnItsBatch) {
  const test::RuntimeGuard guard;
  const Inputs batch = random_inputs(DType::BF16, {3, 40, 64}, 12);
  const auto sample = [](const HostTensor& t) {
    const std::int64_t n = t.elements() / t.shape()[0];
    std::vector<std::int64_t> shape = t.shape();
    shape[0] = 1;
    HostTensor one(t.dtype(), shape);
    for (std::int64_t k = 0; k < n; ++k) one.set(k, t.get(n + k));
    return one;
  };
  const Expected all =
      run_all(batch.x, batch.v, batch.noise, batch.prev, batch.dprev, batch.dlogp, kStep);
  const Expected one = run_all(sample(batch.x), sample(batch.v), sample(batch.noise),
                               sample(batch.prev), sample(batch.dprev), sample(batch.dlogp), kStep);
  EXPECT_TRUE(sample(all.prev) == one.prev);
  EXPECT_TRUE(sample(all.logp) == one.logp);
  EXPECT_TRUE(sample(all.dx) == one.dx);
  EXPECT_TRUE(sample(all.dv) == one.dv);
}

// Every other element of wider rows, and prev written over x, give contiguous bytes.
TEST(FlowSdeOp, StridedViewsAndInPlaceEqualContiguousOnes) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kB = 2, kD = 70;
  for (const DType dtype : kDTypes) {
    const Inputs in = random_inputs(dtype, {kB, kD}, 13);
    const Expected want =
        contract_results(in.x, in.v, in.noise, in.prev, in.dprev, in.dlogp, kStep);
    HostTensor wide_x(dtype, {kB, 2 * kD}), wide_prev(dtype, {kB, 2 * kD});
    for (std::int64_t e = 0; e < in.x.elements(); ++e) {
      wide_x.set(2 * e, in.x.get(e));
      wide_prev.set(2 * e, in.prev.get(e));
    }
    const auto every_other = [](auto view) { return test::strided(view, {kB, kD}, {2 * kD, 2}); };
    HostTensor logp(DType::F32, {kB});
    flow_sde_logp_forward(every_other(wide_x.cview()), in.v.cview(), every_other(wide_prev.cview()),
                          logp.view(), kStep);
    EXPECT_TRUE(logp == want.logp);
    HostTensor in_place = in.x;
    flow_sde_step_forward(in_place.cview(), in.v.cview(), in.noise.cview(), in_place.view(), kStep);
    EXPECT_TRUE(in_place == want.prev);
  }
}

// logp and dv of fp32 inputs against Flow-GRPO's expressions in fp64: the log-density's
// mean over the elements and its derivative (relative errors of a few fp32 roundings).
TEST(FlowSdeOp, AgreesWithFlowGrposFormulasInFp64) {
  const Inputs in = random_inputs(DType::F32, {2, 256, 64}, 14);
  const double sigma = 0.8, sigma_prev = 0.6, level = 0.7;
  const double std_dev = std::sqrt(sigma / (1 - sigma)) * level, dt = sigma_prev - sigma;
  const double scale = std_dev * std::sqrt(-dt);
  const Expected got = run_all(in.x, in.v, in.noise, in.prev, in.dprev, in.dlogp, kStep);
  const std::int64_t n = in.x.elements() / 2;
  for (std::int64_t b = 0; b < 2; ++b) {
    double logp = 0.0;
    for (std::int64_t k = 0; k < n; ++k) {
      const double x = in.x.get(b * n + k), v = in.v.get(b * n + k);
      const double mean = x * (1 + std_dev * std_dev / (2 * sigma) * dt) +
                          v * (1 + std_dev * std_dev * (1 - sigma) / (2 * sigma)) * dt;
      const double d = in.prev.get(b * n + k) - mean;
      logp += -(d * d) / (2 * scale * scale) - std::log(scale) - std::log(std::sqrt(2 * M_PI));
      const double factor = in.dlogp.get(b) / (scale * scale) / static_cast<double>(n) *
                            (1 + std_dev * std_dev * (1 - sigma) / (2 * sigma)) * dt;
      // d's own rounding, relative to the terms it is the difference of, dominates.
      const double terms = std::abs(in.prev.get(b * n + k)) + std::abs(mean) + std::abs(d);
      EXPECT_NEAR(got.dv.get(b * n + k), factor * d, 1e-6 * std::abs(factor) * terms);
    }
    logp /= static_cast<double>(n);
    EXPECT_NEAR(got.logp.get(b), logp, 1e-5 * std::abs(logp));
  }
}

TEST(FlowSdeOp, BadArgumentsAreErrorsNamingThem) {
  HostTensor x(DType::F32, {2, 8}), v(DType::F32, {2, 8}), other(DType::F32, {2, 9});
  HostTensor prev(DType::F32, {2, 8}), logp(DType::F32, {2}), bf16_logp(DType::BF16, {2});
  HostTensor vector(DType::F32, {8});
  const auto step = [&](const ConstTensorView& noise, const FlowSdeOptions& o) {
    return test::rejected_argument(
        [&] { flow_sde_step_forward(x.cview(), v.cview(), noise, prev.view(), o); });
  };
  EXPECT_EQ(step(other.cview(), kStep), "noise");
  FlowSdeOptions o = kStep;
  o.sigma = 1.5f;
  EXPECT_EQ(step(v.cview(), o), "sigma");
  o = kStep;
  o.sigma_prev = 0.9f;  // dt of the wrong sign
  EXPECT_EQ(step(v.cview(), o), "sigma_prev");
  o = kStep;
  o.noise_level = std::nanf("");
  EXPECT_EQ(step(v.cview(), o), "noise_level");
  EXPECT_EQ(step(v.cview(), FlowSdeOptions{}), "sigma");  // the defaults: not a step
  o = kStep;
  o.noise_level = 1e-20f;  // a variance whose inverse overflows fp32
  EXPECT_EQ(step(v.cview(), o), "sigma_prev");
  EXPECT_EQ(test::rejected_argument([&] {
              flow_sde_step_forward(vector.cview(), vector.cview(), vector.cview(), vector.view(),
                                    kStep);
            }),
            "x");
  EXPECT_EQ(test::rejected_argument([&] {
              flow_sde_logp_forward(x.cview(), v.cview(), prev.cview(), bf16_logp.view(), kStep);
            }),
            "logp");
  EXPECT_EQ(test::rejected_argument([&] {
              flow_sde_logp_backward(x.cview(), v.cview(), prev.cview(), logp.cview(), std::nullopt,
                                     std::nullopt, kStep);
            }),
            "dx");
  EXPECT_EQ(test::rejected_argument(
                [&] { flow_sde_step_backward(x.cview(), std::nullopt, other.view(), kStep); }),
            "dv");
}

}  // namespace
}  // namespace kernel_align
