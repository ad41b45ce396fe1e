// qk_norm_rope_forward/backward are defined as the composition of the unfused ops
// (ops.hpp): qk_rmsnorm of the text and the image positions with their own weights
// into a tensor of the output's dtype, then multi_axis_rope; the backward the
// transpose rotation into a tensor of dq_out's dtype, then qk_rmsnorm_backward of
// each stream with its own dw. The test composes those ops itself (reference
// backend, sequence-sliced views) and compares bytes with the fused ops on the
// reference and on the CPU backend.
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::Placement;
using test::Rng;
using test::Strides;

// Which of the four weights (text_q, text_k, image_q, image_k) exist, and their
// dtypes.
struct WeightSet {
  const char* name;
  std::array<std::optional<DType>, 4> dtypes;
};

const WeightSet kWeightSets[] = {
    {"none", {std::nullopt, std::nullopt, std::nullopt, std::nullopt}},
    {"all_bf16", {DType::BF16, DType::BF16, DType::BF16, DType::BF16}},
    {"mixed", {DType::F32, DType::F16, DType::BF16, std::nullopt}},
    {"image_only_fp16", {std::nullopt, std::nullopt, DType::F16, DType::F16}},
};

// Replaces the weights of a case by random ones of `set`'s dtypes (absent where
// `set` has none).
void use_weights(test::FourWeights& weights, const CaseSpec& c, const WeightSet& set, Rng& rng) {
  for (std::size_t i = 0; i < 4; ++i) {
    weights[i].reset();
    if (set.dtypes[i]) weights[i] = c.inputs.place(test::random_weight(*set.dtypes[i], c.d, rng));
  }
}

// A gradient for each present weight whose bit (order of kWeightNames) is set in
// `grad_mask`: q gradients fp32, k gradients in the weight's own dtype.
std::array<std::optional<test::BufferSpec>, 4> grads_for(const CaseSpec& c, const WeightSet& set,
                                                         unsigned grad_mask) {
  std::array<std::optional<test::BufferSpec>, 4> dw;
  for (std::size_t i = 0; i < 4; ++i) {
    if (!set.dtypes[i] || (grad_mask & (1u << i)) == 0) continue;
    dw[i] = c.outputs.spec(i % 2 == 0 ? DType::F32 : *set.dtypes[i], {c.d});
  }
  return dw;
}

// Composed with the reference backend; the fused op on the reference and on the
// CPU backend (best path, 3 threads; every path and thread count is compared with
// the reference in backend_matrix_test).
template <class Case>
void expect_fused_equals_composed(const Case& fused) {
  const test::RuntimeGuard guard;
  test::RunConfig::reference().apply();
  const test::Outputs composed = fused.run(/*composed=*/true);
  for (const test::RunConfig& config :
       {test::RunConfig::reference(), test::RunConfig::cpu(best_isa(), 3),
        test::RunConfig::cpu(Isa::Portable, 1)}) {
    config.apply();
    EXPECT_TRUE(test::same_bytes(composed, fused.run())) << "fused on " << config.name();
  }
}

struct FusedParam {
  DType in;
  DType out;
  bool backward;
};

void PrintTo(const FusedParam& p, std::ostream* os) {
  *os << (p.backward ? "backward " : "forward ") << dtype_name(p.in) << " to " << dtype_name(p.out);
}

class FusedEqualsUnfused : public ::testing::TestWithParam<FusedParam> {};

TEST_P(FusedEqualsUnfused, EveryWeightSetModePairingLayoutAndTextLength) {
  const FusedParam p = GetParam();
  Rng rng(31);
  for (const WeightSet& set : kWeightSets) {
    for (NormMode mode : {NormMode::Single, NormMode::Diffusers}) {
      for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
        for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
          for (std::int64_t text_len : {0, 1, 3, 6}) {
            CaseSpec c;
            c.in = p.in;
            c.out = p.out;
            c.mode = mode;
            c.pairing = pairing;
            c.layout = layout;
            c.batch = 2;
            c.seq = 6;
            c.heads = 3;
            c.k_heads = 2;
            c.d = 34;
            c.text_len = text_len;
            // Strided views half of the time: the composition slices them the same way.
            if (text_len % 2 == 1) c.inputs = {Strides::Permuted, false};
            SCOPED_TRACE(std::string("weights ") + set.name + " " + c.name());
            if (p.backward) {
              test::FusedBackwardCase fused = test::make_fused_backward(c, rng);
              use_weights(fused.weights, c, set, rng);
              for (unsigned mask : {0xFu, 0x9u}) {
                fused.dw = grads_for(c, set, mask);
                expect_fused_equals_composed(fused);
              }
            } else {
              test::FusedForwardCase fused = test::make_fused_forward(c, rng);
              use_weights(fused.weights, c, set, rng);
              expect_fused_equals_composed(fused);
            }
          }
        }
      }
    }
  }
}

std::vector<FusedParam> fused_params() {
  std::vector<FusedParam> params;
  for (bool backward : {false, true}) {
    for (DType in : {DType::F32, DType::BF16, DType::F16}) {
      for (DType out : {DType::F32, DType::BF16, DType::F16}) params.push_back({in, out, backward});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, FusedEqualsUnfused, ::testing::ValuesIn(fused_params()),
                         [](const ::testing::TestParamInfo<FusedParam>& param) {
                           return std::string(param.param.backward ? "backward_" : "forward_") +
                                  dtype_name(param.param.in) + "_to_" + dtype_name(param.param.out);
                         });

// In place (q_out is q, dq is dq_out) the fused op still equals the composition.
TEST(FusedEqualsUnfusedInPlace, ForwardAndBackward) {
  Rng rng(32);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
      CaseSpec c;
      c.in = dtype;
      c.out = dtype;
      c.weight = DType::BF16;
      c.dw = DType::F32;
      c.mode = NormMode::Diffusers;
      c.layout = layout;
      c.seq = 9;
      c.d = 128;
      c.text_len = 4;
      c.in_place = true;
      c.inputs = {Strides::PaddedRows, true};
      SCOPED_TRACE(c.name());
      expect_fused_equals_composed(test::make_fused_forward(c, rng));
      expect_fused_equals_composed(test::make_fused_backward(c, rng));
    }
  }
}

// A stream with no positions (text_len 0: no text; text_len S: no image) sums no
// rows, so its weight gradient is +0 (docs/contract.md: dw starts at +0) on every
// backend, whatever the buffer held before.
TEST(FusedBackward, WeightGradientOfAnEmptyStreamIsPositiveZero) {
  const test::RuntimeGuard guard;
  Rng rng(33);
  for (std::int64_t text_len : {0, 5}) {
    CaseSpec c;
    c.in = DType::BF16;
    c.out = DType::BF16;
    c.weight = DType::BF16;
    c.dw = DType::BF16;
    c.seq = 5;
    c.d = 16;
    c.text_len = text_len;
    const test::FusedBackwardCase fused = test::make_fused_backward(c, rng);
    for (const test::RunConfig& config :
         {test::RunConfig::reference(), test::RunConfig::cpu(best_isa(), 2)}) {
      config.apply();
      const test::Outputs out = fused.run();
      ASSERT_EQ(out.size(), 6u);
      // out: dq, dk, dw text_q, dw text_k, dw image_q, dw image_k.
      const std::size_t first_empty = text_len == 0 ? 2 : 4;
      for (std::size_t o = first_empty; o < first_empty + 2; ++o) {
        for (std::byte b : out[o].bytes) {
          ASSERT_EQ(b, std::byte{0}) << out[o].name << " on " << config.name();
        }
      }
      // The other stream's gradients are sums of real rows: not all zero.
      const std::size_t first_used = text_len == 0 ? 4 : 2;
      bool any_nonzero = false;
      for (std::byte b : out[first_used].bytes) any_nonzero |= b != std::byte{0};
      EXPECT_TRUE(any_nonzero) << out[first_used].name;
    }
  }
}

}  // namespace
}  // namespace kernel_align
