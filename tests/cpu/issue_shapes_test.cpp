// The issue's text-to-image shapes (src/cases/shapes.hpp) as Qwen-Image runs them (B = 1,
// text tokens + the image's, bf16, diffusers positions and tables, diffusers norm mode,
// interleaved pairs, BSHD): the CPU backend on its best path with every core gives the
// reference's bytes for the fused forward and backward (all four weight gradients) and
// for the unfused qk_rmsnorm + multi_axis_rope.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cases/shapes.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/buffers.hpp"
#include "support/issue_shapes.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using cases::kHeadDim;
using test::HostTensor;
using test::Outputs;

test::RunConfig best_cpu() {
  const unsigned cores = std::thread::hardware_concurrency();
  return test::RunConfig::cpu(best_isa(), cores == 0 ? 1 : static_cast<int>(cores));
}

class IssueShapes : public ::testing::TestWithParam<cases::Shape> {
 protected:
  void SetUp() override {
    tables = cases::shape_tables(GetParam());
    ASSERT_EQ(tables.tables.columns, kHeadDim / 2);
  }

  ConstTensorView cos() const { return tables.cos(); }
  ConstTensorView sin() const { return tables.sin(); }
  std::vector<std::int64_t> shape() const { return {1, tables.seq, GetParam().heads, kHeadDim}; }

  // `run` under the reference and under the best CPU configuration: same bytes.
  template <class Run>
  void expect_cpu_matches_reference(const Run& run) {
    const test::RuntimeGuard guard;
    test::RunConfig::reference().apply();
    const Outputs expected = run();
    best_cpu().apply();
    EXPECT_TRUE(test::same_bytes(expected, run())) << best_cpu().name();
  }

  cases::ShapeTables tables;
};

TEST_P(IssueShapes, FusedForwardAndBackward) {
  test::Rng rng(71);
  const HostTensor q = test::spread_tensor(DType::BF16, shape(), rng);
  const HostTensor k = test::spread_tensor(DType::BF16, shape(), rng);
  std::vector<HostTensor> w;
  for (int i = 0; i < 4; ++i) w.push_back(test::random_weight(DType::BF16, kHeadDim, rng));
  const QkNormWeights weights{w[0].cview(), w[1].cview(), w[2].cview(), w[3].cview()};
  const QkNormRopeOptions options{1e-6f, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD,
                                  GetParam().text_len};
  expect_cpu_matches_reference([&] {
    HostTensor q_out(DType::BF16, shape());
    HostTensor k_out(DType::BF16, shape());
    qk_norm_rope_forward(q.cview(), k.cview(), weights, cos(), sin(), q_out.view(), k_out.view(),
                         options);
    return Outputs{test::named_bytes("q_out", q_out), test::named_bytes("k_out", k_out)};
  });

  const HostTensor dq_out = test::spread_tensor(DType::BF16, shape(), rng);
  const HostTensor dk_out = test::spread_tensor(DType::BF16, shape(), rng);
  expect_cpu_matches_reference([&] {
    HostTensor dq(DType::BF16, shape());
    HostTensor dk(DType::BF16, shape());
    std::vector<HostTensor> dw;
    for (int i = 0; i < 4; ++i) dw.emplace_back(DType::F32, std::vector<std::int64_t>{kHeadDim});
    qk_norm_rope_backward(q.cview(), k.cview(), dq_out.cview(), dk_out.cview(), weights, cos(),
                          sin(), dq.view(), dk.view(),
                          {dw[0].view(), dw[1].view(), dw[2].view(), dw[3].view()}, options);
    Outputs out{test::named_bytes("dq", dq), test::named_bytes("dk", dk)};
    for (int i = 0; i < 4; ++i) {
      out.push_back(test::named_bytes(std::string("dw ") + test::kWeightNames[i], dw[i]));
    }
    return out;
  });
}

TEST_P(IssueShapes, UnfusedNormThenRope) {
  test::Rng rng(72);
  const HostTensor q = test::spread_tensor(DType::BF16, shape(), rng);
  const HostTensor weight = test::random_weight(DType::BF16, kHeadDim, rng);
  expect_cpu_matches_reference([&] {
    HostTensor normed(DType::BF16, shape());
    HostTensor rotated(DType::BF16, shape());
    qk_rmsnorm_forward(q.cview(), weight.cview(), normed.view(), {1e-6f, NormMode::Diffusers});
    multi_axis_rope_forward(normed.cview(), cos(), sin(), rotated.view(),
                            {Pairing::Interleaved, Layout::BSHD});
    return Outputs{test::named_bytes("normed", normed), test::named_bytes("rotated", rotated)};
  });
}

INSTANTIATE_TEST_SUITE_P(Issue, IssueShapes, ::testing::ValuesIn(test::text_to_image_shapes()),
                         [](const ::testing::TestParamInfo<cases::Shape>& param) {
                           return param.param.name;
                         });

}  // namespace
}  // namespace kernel_align
