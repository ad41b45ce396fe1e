// The three image sizes of the issue as Qwen-Image runs them (B = 1, 256 text
// tokens + the image's, 24 heads of 128, bf16, diffusers positions and tables,
// diffusers norm mode, interleaved pairs, BSHD): the CPU backend on its best path
// with every core gives the reference's bytes for the fused forward and backward
// (all four weight gradients) and for the unfused qk_rmsnorm + multi_axis_rope.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"
#include "support/buffers.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;
using test::Outputs;

struct IssueShape {
  const char* name;
  std::int64_t width_px;
  std::int64_t height_px;
  std::int64_t image_tokens;
};

void PrintTo(const IssueShape& s, std::ostream* os) {
  *os << s.name;
}

constexpr std::int64_t kTextTokens = 256;
constexpr std::int64_t kHeads = 24;
constexpr std::int64_t kHeadDim = 128;

test::RunConfig best_cpu() {
  const unsigned cores = std::thread::hardware_concurrency();
  return test::RunConfig::cpu(best_isa(), cores == 0 ? 1 : static_cast<int>(cores));
}

class IssueShapes : public ::testing::TestWithParam<IssueShape> {
 protected:
  void SetUp() override {
    const IssueShape shape = GetParam();
    PositionRequest request;
    request.layout = PositionLayout::Diffusers;
    request.text_len = kTextTokens;
    request.images = {ImageGrid::from_pixels(shape.width_px, shape.height_px)};
    seq = sequence_length(request);
    ASSERT_EQ(seq, kTextTokens + shape.image_tokens);
    std::vector<std::int32_t> positions;
    for (const Position& p : build_positions(request)) {
      positions.insert(positions.end(), p.begin(), p.end());
    }
    tables = build_rope_tables(positions.data(), seq);
    ASSERT_EQ(tables.rows, seq);
    ASSERT_EQ(tables.columns, kHeadDim / 2);
  }

  ConstTensorView cos() const {
    return ConstTensorView::contiguous(tables.cos.data(), DType::F32, {seq, kHeadDim / 2});
  }
  ConstTensorView sin() const {
    return ConstTensorView::contiguous(tables.sin.data(), DType::F32, {seq, kHeadDim / 2});
  }
  std::vector<std::int64_t> shape() const { return {1, seq, kHeads, kHeadDim}; }

  // `run` under the reference and under the best CPU configuration: same bytes.
  template <class Run>
  void expect_cpu_matches_reference(const Run& run) {
    const test::RuntimeGuard guard;
    test::RunConfig::reference().apply();
    const Outputs expected = run();
    best_cpu().apply();
    EXPECT_TRUE(test::same_bytes(expected, run())) << best_cpu().name();
  }

  std::int64_t seq = 0;
  RopeTables tables;
};

TEST_P(IssueShapes, FusedForwardAndBackward) {
  test::Rng rng(71);
  const HostTensor q = test::spread_tensor(DType::BF16, shape(), rng);
  const HostTensor k = test::spread_tensor(DType::BF16, shape(), rng);
  std::vector<HostTensor> w;
  for (int i = 0; i < 4; ++i) w.push_back(test::random_weight(DType::BF16, kHeadDim, rng));
  const QkNormWeights weights{w[0].cview(), w[1].cview(), w[2].cview(), w[3].cview()};
  const QkNormRopeOptions options{1e-6f, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD,
                                  kTextTokens};
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

INSTANTIATE_TEST_SUITE_P(Issue, IssueShapes,
                         ::testing::Values(IssueShape{"1024x1024", 1024, 1024, 4096},
                                           IssueShape{"1328x1328", 1328, 1328, 6889},
                                           IssueShape{"1664x928", 1664, 928, 6032}),
                         [](const ::testing::TestParamInfo<IssueShape>& param) {
                           return std::string(param.param.name);
                         });

}  // namespace
}  // namespace kernel_align
