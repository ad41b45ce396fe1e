// The issue's text-to-image shapes (src/cases/shapes.hpp) end to end, as Qwen-Image runs
// them: text tokens and the image's tokens, heads of 128, bf16; diffusers positions and
// tables; qk_rmsnorm (diffusers mode, bf16 weight) then multi_axis_rope (interleaved,
// BSHD). Every element is checked against the oracle.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cases/shapes.hpp"
#include "kernel_align/ops.hpp"
#include "support/issue_shapes.hpp"
#include "support/oracle_checks.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

using cases::kHeadDim;
constexpr std::int64_t kChunkTokens = 512;  // the oracle checks this many tokens at a time

// Tokens [first, first + count) of a [1, S, H, D] bf16 tensor.
ConstTensorView tokens(const HostTensor& t, std::int64_t first, std::int64_t count) {
  ConstTensorView v = t.cview();
  v.shape[1] = count;
  v.data = static_cast<const std::uint16_t*>(t.data()) + first * v.shape[2] * kHeadDim;
  return v;
}

std::vector<double> table_rows(const std::vector<float>& table, std::int64_t first,
                               std::int64_t count) {
  const auto begin = table.begin() + first * kHeadDim / 2;
  return {begin, begin + count * kHeadDim / 2};
}

class IssueShapes : public ::testing::TestWithParam<cases::Shape> {};

TEST_P(IssueShapes, NormThenRopeMatchTheOracle) {
  const cases::Shape& shape = GetParam();
  const cases::ShapeTables shape_tables = cases::shape_tables(shape);
  const std::int64_t seq = shape_tables.seq;
  const RopeTables& tables = shape_tables.tables;
  ASSERT_EQ(tables.columns, kHeadDim / 2);
  const ConstTensorView cos = shape_tables.cos();
  const ConstTensorView sin = shape_tables.sin();

  test::Rng rng(31);
  const HostTensor q = test::random_tensor(DType::BF16, {1, seq, shape.heads, kHeadDim}, rng);
  HostTensor weight(DType::BF16, {kHeadDim});
  for (std::int64_t i = 0; i < kHeadDim; ++i) weight.set(i, rng.uniform(-2.0, 2.0));
  const RmsNormOptions norm{1e-6f, NormMode::Diffusers};
  HostTensor normed(DType::BF16, q.shape());
  HostTensor rotated(DType::BF16, q.shape());
  qk_rmsnorm_forward(q.cview(), weight.cview(), normed.view(), norm);
  multi_axis_rope_forward(normed.cview(), cos, sin, rotated.view(),
                          {Pairing::Interleaved, Layout::BSHD});

  const std::vector<double> w = weight.values();
  for (std::int64_t first = 0; first < seq; first += kChunkTokens) {
    const std::int64_t count = std::min(kChunkTokens, seq - first);
    const auto expected_norm =
        oracle::rmsnorm_forward(test::logical_values(tokens(q, first, count)), kHeadDim, w,
                                norm.eps, norm.mode, DType::BF16, DType::BF16);
    ASSERT_TRUE(test::matches_oracle(expected_norm, tokens(normed, first, count)))
        << "qk_rmsnorm, tokens from " << first;
    const auto expected_rope = oracle::rope(
        test::logical_values(tokens(normed, first, count)), 1, count, shape.heads, kHeadDim,
        table_rows(tables.cos, first, count), table_rows(tables.sin, first, count),
        Pairing::Interleaved, false, DType::BF16);
    ASSERT_TRUE(test::matches_oracle(expected_rope, tokens(rotated, first, count)))
        << "multi_axis_rope, tokens from " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Issue, IssueShapes, ::testing::ValuesIn(test::text_to_image_shapes()),
                         [](const ::testing::TestParamInfo<cases::Shape>& param) {
                           return param.param.name;
                         });

}  // namespace
}  // namespace kernel_align
