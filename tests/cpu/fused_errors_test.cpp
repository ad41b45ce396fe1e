// The fused ops reject bad arguments with kernel_align::Error naming the argument,
// on either backend, before writing any output byte.
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

// The call throws Error whose argument is one of `names` (a name containing
// one of them, when `contains`).
template <class Call>
::testing::AssertionResult rejects(const Call& call, std::initializer_list<std::string> names,
                                   bool contains = false) {
  try {
    call();
  } catch (const Error& e) {
    for (const std::string& n : names) {
      if (e.argument() == n || (contains && e.argument().find(n) != std::string::npos)) {
        return ::testing::AssertionSuccess();
      }
    }
    return ::testing::AssertionFailure() << "named '" << e.argument() << "': " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "threw something other than kernel_align::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// The backend a case runs on, printed by name.
struct OnBackend {
  const char* backend;  // registry name
};
void PrintTo(const OnBackend& b, std::ostream* os) {
  *os << b.backend;
}

constexpr std::int64_t kB = 2, kS = 6, kH = 3, kHk = 2, kD = 8, kText = 2;

// Valid buffers of a fused call ([B, S, H, D] BSHD fp32), every output filled with
// 0x33 bytes; TearDown checks that no rejected call wrote any of them.
class FusedErrors : public ::testing::TestWithParam<OnBackend> {
 protected:
  test::Rng rng{61};
  HostTensor q = test::random_tensor(DType::F32, {kB, kS, kH, kD}, rng);
  HostTensor k = test::random_tensor(DType::F32, {kB, kS, kHk, kD}, rng);
  HostTensor dq_out = test::random_tensor(DType::F32, {kB, kS, kH, kD}, rng);
  HostTensor dk_out = test::random_tensor(DType::F32, {kB, kS, kHk, kD}, rng);
  std::array<HostTensor, 4> w{
      test::random_weight(DType::BF16, kD, rng), test::random_weight(DType::BF16, kD, rng),
      test::random_weight(DType::BF16, kD, rng), test::random_weight(DType::BF16, kD, rng)};
  test::TablePair t = test::random_tables(kS, kD, rng);
  HostTensor q_out{DType::F32, {kB, kS, kH, kD}};
  HostTensor k_out{DType::F32, {kB, kS, kHk, kD}};
  std::array<HostTensor, 4> dw{HostTensor(DType::F32, {kD}), HostTensor(DType::F32, {kD}),
                               HostTensor(DType::F32, {kD}), HostTensor(DType::F32, {kD})};
  // One buffer large enough to hold two outputs, for overlaps.
  HostTensor shared{DType::F32, {2 * kB * kS * kH * kD}};
  std::optional<test::RuntimeGuard> guard;

  void SetUp() override {
    guard.emplace();
    set_backend(GetParam().backend);
    for (HostTensor* o : outputs()) o->fill_bytes(std::byte{0x33});
  }
  void TearDown() override {
    for (HostTensor* o : outputs()) {
      HostTensor untouched(o->dtype(), o->shape());
      untouched.fill_bytes(std::byte{0x33});
      EXPECT_TRUE(*o == untouched) << "a rejected call wrote an output";
    }
    guard.reset();
  }
  std::vector<HostTensor*> outputs() {
    return {&q_out, &k_out, &dw[0], &dw[1], &dw[2], &dw[3], &shared};
  }

  QkNormWeights weights() const { return {w[0].cview(), w[1].cview(), w[2].cview(), w[3].cview()}; }
  QkNormWeightGrads grads() { return {dw[0].view(), dw[1].view(), dw[2].view(), dw[3].view()}; }
  static QkNormRopeOptions options(std::int64_t text_len = kText) {
    return {1e-6f, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD, text_len};
  }

  void forward(const ConstTensorView& qv, const ConstTensorView& kv, const QkNormWeights& ws,
               const TensorView& qo, const TensorView& ko, const QkNormRopeOptions& o) {
    qk_norm_rope_forward(qv, kv, ws, t.cos.cview(), t.sin.cview(), qo, ko, o);
  }
  void backward(const ConstTensorView& qv, const ConstTensorView& kv, const ConstTensorView& dqo,
                const ConstTensorView& dko, const QkNormWeights& ws, const TensorView& dqv,
                const TensorView& dkv, const QkNormWeightGrads& gs, const QkNormRopeOptions& o) {
    qk_norm_rope_backward(qv, kv, dqo, dko, ws, t.cos.cview(), t.sin.cview(), dqv, dkv, gs, o);
  }
  // Valid calls with defaults, any argument replaced by the caller.
  void forward_with(std::optional<ConstTensorView> qv = {}, std::optional<ConstTensorView> kv = {},
                    std::optional<QkNormWeights> ws = {}, std::optional<TensorView> qo = {},
                    std::optional<TensorView> ko = {}, std::optional<QkNormRopeOptions> o = {}) {
    forward(qv.value_or(q.cview()), kv.value_or(k.cview()), ws.value_or(weights()),
            qo.value_or(q_out.view()), ko.value_or(k_out.view()), o.value_or(options()));
  }
  void backward_with(std::optional<ConstTensorView> qv = {}, std::optional<ConstTensorView> kv = {},
                     std::optional<ConstTensorView> dqo = {},
                     std::optional<ConstTensorView> dko = {}, std::optional<QkNormWeights> ws = {},
                     std::optional<TensorView> dqv = {}, std::optional<TensorView> dkv = {},
                     std::optional<QkNormWeightGrads> gs = {},
                     std::optional<QkNormRopeOptions> o = {}) {
    backward(qv.value_or(q.cview()), kv.value_or(k.cview()), dqo.value_or(dq_out.cview()),
             dko.value_or(dk_out.cview()), ws.value_or(weights()), dqv.value_or(q_out.view()),
             dkv.value_or(k_out.view()), gs.value_or(grads()), o.value_or(options()));
  }

  // `base` with dim `dim` set to `size` (strides kept: a view of a sub-range, or of
  // a larger range of the shared buffer).
  template <class View>
  static View resized(View base, int dim, std::int64_t size) {
    base.shape[dim] = size;
    return base;
  }
  TensorView shared_view(std::int64_t offset_elements, std::int64_t heads) {
    TensorView v = TensorView::contiguous(static_cast<float*>(shared.data()) + offset_elements,
                                          DType::F32, {kB, kS, heads, kD});
    return v;
  }
};

TEST_P(FusedErrors, ValidCallsPass) {
  for (std::int64_t text_len : {std::int64_t{0}, kText, kS}) {
    EXPECT_NO_THROW(forward_with({}, {}, {}, {}, {}, options(text_len))) << text_len;
    EXPECT_NO_THROW(backward_with({}, {}, {}, {}, {}, {}, {}, {}, options(text_len))) << text_len;
  }
  // In place is allowed: q_out is q, dq is dq_out.
  HostTensor q_copy = q;
  EXPECT_NO_THROW(forward_with(q_copy.cview(), {}, {}, q_copy.view()));
  HostTensor dq_copy = dq_out;
  EXPECT_NO_THROW(backward_with({}, {}, dq_copy.cview(), {}, {}, dq_copy.view()));
  // Refill: the checks in TearDown are about rejected calls.
  for (HostTensor* o : outputs()) o->fill_bytes(std::byte{0x33});
}

TEST_P(FusedErrors, TextLenOutsideTheSequence) {
  for (std::int64_t text_len : {std::int64_t{-1}, kS + 1, std::int64_t{1} << 40}) {
    EXPECT_TRUE(rejects([&] { forward_with({}, {}, {}, {}, {}, options(text_len)); }, {"text_len"}))
        << text_len;
    EXPECT_TRUE(rejects([&] { backward_with({}, {}, {}, {}, {}, {}, {}, {}, options(text_len)); },
                        {"text_len"}))
        << text_len;
  }
}

// q and k must share B, S and D (only head counts may differ): the bad one is k.
TEST_P(FusedErrors, QAndKWithDifferentSequenceOrHeadDim) {
  // k with fewer positions (a sub-range of the same buffer), and k_out to match.
  const ConstTensorView k_short = resized(k.cview(), 1, kS - 1);
  const TensorView k_out_short = resized(k_out.view(), 1, kS - 1);
  EXPECT_TRUE(rejects([&] { forward_with({}, k_short, {}, {}, k_out_short); }, {"k"}));
  // k with a smaller D (a slice of each row), and k_out to match.
  const ConstTensorView k_narrow = resized(k.cview(), 3, kD - 2);
  const TensorView k_out_narrow = resized(k_out.view(), 3, kD - 2);
  EXPECT_TRUE(rejects([&] { forward_with({}, k_narrow, {}, {}, k_out_narrow); }, {"k"}));
  // k with a different batch.
  const ConstTensorView k_batch = resized(k.cview(), 0, 1);
  const TensorView k_out_batch = resized(k_out.view(), 0, 1);
  EXPECT_TRUE(rejects([&] { forward_with({}, k_batch, {}, {}, k_out_batch); }, {"k"}));

  // Backward: dk_out (and dk) against dq_out.
  const ConstTensorView dk_short = resized(dk_out.cview(), 1, kS - 1);
  EXPECT_TRUE(rejects([&] { backward_with({}, k_short, {}, dk_short, {}, {}, k_out_short); },
                      {"k", "dk_out"}));
  const ConstTensorView dk_narrow = resized(dk_out.cview(), 3, kD - 2);
  EXPECT_TRUE(rejects([&] { backward_with({}, k_narrow, {}, dk_narrow, {}, {}, k_out_narrow); },
                      {"k", "dk_out"}));
}

// A weight of the wrong length: the error names which of the four it is.
TEST_P(FusedErrors, WeightOfTheWrongLength) {
  for (std::size_t i = 0; i < 4; ++i) {
    std::array<ConstTensorView, 4> views{w[0].cview(), w[1].cview(), w[2].cview(), w[3].cview()};
    views[i] = resized(views[i], 0, kD - 2);
    const QkNormWeights bad{views[0], views[1], views[2], views[3]};
    const std::string which = test::kWeightNames[i];
    EXPECT_TRUE(rejects([&] { forward_with({}, {}, bad); }, {which}, /*contains=*/true)) << which;
    EXPECT_TRUE(rejects([&] { backward_with({}, {}, {}, {}, bad); }, {which}, true)) << which;
  }
}

// A weight gradient of the wrong length, or asked for a weight that is absent.
TEST_P(FusedErrors, WeightGradientOfTheWrongLengthOrWithoutItsWeight) {
  for (std::size_t i = 0; i < 4; ++i) {
    std::array<std::optional<TensorView>, 4> views{dw[0].view(), dw[1].view(), dw[2].view(),
                                                   dw[3].view()};
    views[i] = resized(*views[i], 0, kD - 2);
    const std::string which = test::kWeightNames[i];
    EXPECT_TRUE(rejects(
        [&] {
          backward_with({}, {}, {}, {}, {}, {}, {},
                        QkNormWeightGrads{views[0], views[1], views[2], views[3]});
        },
        {which}, true))
        << which;
    std::array<std::optional<ConstTensorView>, 4> ws{w[0].cview(), w[1].cview(), w[2].cview(),
                                                     w[3].cview()};
    ws[i].reset();
    EXPECT_TRUE(rejects(
        [&] {
          backward_with({}, {}, {}, {}, QkNormWeights{ws[0], ws[1], ws[2], ws[3]});
        },
        {which}, true))
        << which << " without its weight";
  }
}

TEST_P(FusedErrors, OverlappingOutputs) {
  // q_out and k_out overlapping in one buffer (k_out starts inside q_out).
  const TensorView q_in_shared = shared_view(0, kH);
  const TensorView k_in_shared = shared_view(kD, kHk);
  EXPECT_TRUE(
      rejects([&] { forward_with({}, {}, {}, q_in_shared, k_in_shared); }, {"q_out", "k_out"}));
  // The same view for both (heads equal).
  HostTensor k3 = test::random_tensor(DType::F32, {kB, kS, kH, kD}, rng);
  EXPECT_TRUE(rejects([&] { forward_with({}, k3.cview(), {}, q_in_shared, q_in_shared); },
                      {"q_out", "k_out"}));
  // An output overlapping the other stream's input: k_out written over q.
  HostTensor q_copy = q;
  EXPECT_TRUE(rejects(
      [&] {
        forward_with(q_copy.cview(), k3.cview(), {}, {},
                     TensorView::contiguous(q_copy.data(), DType::F32, {kB, kS, kH, kD}));
      },
      {"k_out"}));
  // Backward: dq and dk overlapping.
  EXPECT_TRUE(
      rejects([&] { backward_with({}, {}, {}, {}, {}, q_in_shared, k_in_shared); }, {"dq", "dk"}));
  // Two weight gradients in the same memory.
  EXPECT_TRUE(rejects(
      [&] {
        backward_with({}, {}, {}, {}, {}, {}, {},
                      QkNormWeightGrads{dw[0].view(), dw[1].view(), dw[0].view(), dw[3].view()});
      },
      {"image_q", "text_q"}, true));
  // Output elements overlapping each other (a zero stride on the heads).
  TensorView self_overlap = q_out.view();
  self_overlap.strides[2] = 0;
  EXPECT_TRUE(rejects([&] { forward_with({}, {}, {}, self_overlap); }, {"q_out"}));
}

// Contract section 7 covers weights and tables too: an output over any input other than
// the one it replaces is refused. The in-place fused op with a weight that is a slice of
// q once wrote half of k_out wrong.
TEST_P(FusedErrors, OutputsOverlappingWeightsOrTables) {
  HostTensor q_copy = q;
  HostTensor k_copy = k;
  const TensorView q_in_place = q_copy.view();
  const TensorView k_in_place = k_copy.view();
  // A weight of length D read from the first row of q (in place) or of k_out.
  const auto row_of = [](const TensorView& v) {
    return ConstTensorView::contiguous(v.data, v.dtype, {kD});
  };
  QkNormWeights in_q = weights();
  in_q.image_k = row_of(q_in_place);
  EXPECT_TRUE(
      rejects([&] { forward_with(q_copy.cview(), k_copy.cview(), in_q, q_in_place, k_in_place); },
              {"q_out"}));
  QkNormWeights in_k_out = weights();
  in_k_out.text_q = row_of(k_out.view());
  EXPECT_TRUE(rejects([&] { forward_with({}, {}, in_k_out); }, {"k_out"}));
  // Backward: dk over a weight; a weight gradient over q, over a table, over another weight.
  EXPECT_TRUE(rejects([&] { backward_with({}, {}, {}, {}, in_k_out); }, {"dk"}));
  QkNormWeightGrads dw_over_q = grads();
  dw_over_q.image_q = TensorView::contiguous(q_copy.data(), DType::F32, {kD});
  EXPECT_TRUE(rejects([&] { backward_with(q_copy.cview(), {}, {}, {}, {}, {}, {}, dw_over_q); },
                      {"weight_grads.image_q"}));
  QkNormWeightGrads dw_over_sin = grads();
  dw_over_sin.text_k = TensorView::contiguous(t.sin.data(), DType::F32, {kD});
  EXPECT_TRUE(rejects([&] { backward_with({}, {}, {}, {}, {}, {}, {}, dw_over_sin); },
                      {"weight_grads.text_k"}));
  HostTensor w_copy = w[1];
  QkNormWeights shared_weight = weights();
  shared_weight.text_k = w_copy.cview();
  QkNormWeightGrads dw_over_weight = grads();
  dw_over_weight.image_k = TensorView::contiguous(w_copy.data(), DType::BF16, {kD});
  EXPECT_TRUE(rejects([&] { backward_with({}, {}, {}, {}, shared_weight, {}, {}, dw_over_weight); },
                      {"weight_grads.image_k"}));
  // The unfused rope of one position: its output over the rows 0 and 1 of the cos table.
  HostTensor x = test::random_tensor(DType::F32, {1, 1, 1, kD}, rng);
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(x.cview(), resized(t.cos.cview(), 0, 1),
                                resized(t.sin.cview(), 0, 1),
                                TensorView::contiguous(t.cos.data(), DType::F32, {1, 1, 1, kD}),
                                {Pairing::Interleaved, Layout::BSHD});
      },
      {"y"}));
}

INSTANTIATE_TEST_SUITE_P(Backends, FusedErrors,
                         ::testing::Values(OnBackend{"reference"}, OnBackend{"simd"}),
                         [](const ::testing::TestParamInfo<OnBackend>& param) {
                           return std::string(param.param.backend);
                         });

}  // namespace
}  // namespace kernel_align
