// activation_forward / _backward through the public API: every backend path and thread count
// gives, element by element, the contract's activate / activate_backward of the element
// (contract section 14; the functions tested against fp64 in activation_test and gemm_test)
// rounded once to the output's dtype, for every kind and dtype and ranks 1 to 4; an element's
// bytes alone equal its bytes in a larger tensor; strided views and in place equal contiguous
// out of place; bad arguments are Errors naming them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/contract/convert.hpp"
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
constexpr Activation kKinds[] = {Activation::None, Activation::GeluTanh, Activation::Silu};

contract::Activation contract_kind(Activation a) {
  return static_cast<contract::Activation>(a);
}

// y and dx of contiguous x and dy, elementwise by the contract's functions.
std::vector<HostTensor> contract_results(const HostTensor& x, const HostTensor& dy, Activation a) {
  HostTensor y(x.dtype(), x.shape()), dx(x.dtype(), x.shape());
  for (std::int64_t e = 0; e < x.elements(); ++e) {
    const auto z = static_cast<float>(x.get(e));
    y.set(e, contract::activate(contract_kind(a), z));
    dx.set(e, contract::activate_backward(contract_kind(a), static_cast<float>(dy.get(e)), z));
  }
  return {y, dx};
}

std::vector<HostTensor> run_both(const HostTensor& x, const HostTensor& dy, Activation a) {
  HostTensor y(x.dtype(), x.shape()), dx(x.dtype(), x.shape());
  activation_forward(x.cview(), y.view(), {a});
  activation_backward(x.cview(), dy.cview(), dx.view(), {a});
  return {y, dx};
}

// Wide-range inputs: the exp's overflow and underflow, tanh's saturation, zeros.
HostTensor wide_inputs(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor t = test::random_tensor(dtype, std::move(shape), rng, 4.0, 6);
  if (t.elements() > 4) {
    t.set(0, 0.0);
    t.set(1, -0.0);
    t.set(2, 100.0);
    t.set(3, -100.0);
  }
  return t;
}

TEST(ActivationOp, EveryBackendPathAndThreadCountComputesTheContract) {
  const test::RuntimeGuard guard;
  const std::vector<std::vector<std::int64_t>> shapes = {
      {7}, {3, 3072}, {2, 5, 33}, {2, 3, 4, 40}, {3, 300, 64}};
  for (const auto& shape : shapes) {
    for (const DType dtype : kDTypes) {
      for (const Activation a : kKinds) {
        SCOPED_TRACE(std::to_string(shape.size()) + "-D " + dtype_name(dtype) + " " +
                     activation_name(a));
        const HostTensor x = wide_inputs(dtype, shape, 1);
        const HostTensor dy = wide_inputs(dtype, shape, 2);
        const std::vector<HostTensor> want = contract_results(x, dy, a);
        set_backend("reference");
        EXPECT_TRUE(run_both(x, dy, a) == want);
        EXPECT_EQ(last_call().backend, "reference");
        set_backend("simd");
        for (const Isa path : test::available_isas()) {
          set_isa(path);
          for (const int threads : {1, 2, 3}) {
            set_num_threads(threads);
            EXPECT_TRUE(run_both(x, dy, a) == want) << isa_name(path) << " " << threads;
          }
        }
      }
    }
  }
}

// A batch's element bytes equal the element's own: the first row of a [4, 40] call is the
// [1, 40] call of that row.
TEST(ActivationOp, AnElementsBytesDoNotDependOnTheBatch) {
  const test::RuntimeGuard guard;
  const HostTensor x = wide_inputs(DType::BF16, {4, 40}, 3);
  HostTensor first(DType::BF16, {1, 40});
  for (std::int64_t e = 0; e < 40; ++e) first.set(e, x.get(e));
  for (const Activation a : kKinds) {
    HostTensor y_batch(DType::BF16, {4, 40}), y_alone(DType::BF16, {1, 40});
    activation_forward(x.cview(), y_batch.view(), {a});
    activation_forward(first.cview(), y_alone.view(), {a});
    for (std::int64_t e = 0; e < 40; ++e) EXPECT_EQ(y_batch.get(e), y_alone.get(e)) << e;
  }
}

// Every other element of wider rows, and outputs written over their inputs, give the bytes
// of contiguous calls.
TEST(ActivationOp, StridedViewsAndInPlaceEqualContiguousOnes) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kR = 6, kD = 37;
  for (const DType dtype : kDTypes) {
    const HostTensor x = wide_inputs(dtype, {kR, kD}, 4);
    const HostTensor dy = wide_inputs(dtype, {kR, kD}, 5);
    const std::vector<HostTensor> want = contract_results(x, dy, Activation::Silu);
    HostTensor wide_x(dtype, {kR, 2 * kD}), wide_y(dtype, {kR, 2 * kD});
    for (std::int64_t e = 0; e < x.elements(); ++e) wide_x.set(2 * e, x.get(e));
    const auto every_other = [](auto view) { return test::strided(view, {kR, kD}, {2 * kD, 2}); };
    activation_forward(every_other(wide_x.cview()), every_other(wide_y.view()), {Activation::Silu});
    for (std::int64_t e = 0; e < x.elements(); ++e) EXPECT_EQ(wide_y.get(2 * e), want[0].get(e));
    HostTensor in_place = x;
    activation_forward(in_place.cview(), in_place.view(), {Activation::Silu});
    EXPECT_TRUE(in_place == want[0]);
    HostTensor grads = dy;
    activation_backward(x.cview(), grads.cview(), grads.view(), {Activation::Silu});
    EXPECT_TRUE(grads == want[1]);
  }
}

TEST(ActivationOp, BadArgumentsAreErrorsNamingThem) {
  HostTensor x(DType::F32, {2, 3}), y(DType::F32, {2, 4});
  // A view that says rank 5 (its arrays hold 4 dims: the validator reads the rank first).
  TensorView five = x.view();
  five.rank = 5;
  EXPECT_EQ(test::rejected_argument([&] { activation_forward(x.cview(), y.view(), {}); }), "y");
  EXPECT_EQ(test::rejected_argument([&] { activation_forward(five, five, {}); }), "x");
  HostTensor dy(DType::F32, {2, 4}), dx(DType::F32, {2, 3});
  EXPECT_EQ(
      test::rejected_argument([&] { activation_backward(x.cview(), dy.cview(), dx.view(), {}); }),
      "dy");
  // dx overlapping x partly (one element on): refused, nothing written.
  HostTensor wide(DType::F32, {1, 8});
  ConstTensorView shifted = wide.cview();
  shifted = test::strided(shifted, {1, 7}, {8, 1});
  TensorView out = wide.view();
  out.data = static_cast<float*>(out.data) + 1;
  out = test::strided(out, {1, 7}, {8, 1});
  EXPECT_EQ(test::rejected_argument([&] { activation_forward(shifted, out, {}); }), "y");
}

}  // namespace
}  // namespace kernel_align
