// adaln_modulation's, adaln_gate_residual's and the activation's CUDA kernels
// (cuda/device/modulation_kernels.cuh, activation_kernels.cuh) and plans, the very source nvcc
// compiles, run by the grid emulator ("cuda-emulated") through the public API against the reference
// backend, byte for byte: every dtype and mode, forward and backward, D not a multiple of the 16
// lanes and Qwen-Image's 3072, sequences of one and of several 256-token blocks, the optional
// gradients absent, strided views, in place. Outputs start as 0xA5 bytes and are compared
// whole, so a stray or missing write shows.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "emulated_fixture.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;
using test::poisoned;

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr NormMode kModes[] = {NormMode::Single, NormMode::Diffusers};

// Runs `call` on the reference backend and on the emulated CUDA kernels.
template <class Call>
void on_both(const Call& call) {
  set_backend("reference");
  call();
  EXPECT_EQ(last_call().backend, "reference");
  set_backend("cuda-emulated");
  call();
  EXPECT_EQ(last_call().backend, "cuda-emulated");
}

using ModulationOnEmulatedCuda = test::OnEmulatedCuda;

struct Shape {
  std::int64_t batch, seq, dim;
};
// One token; 20 tokens of D = 40 (not a multiple of 16); 600 tokens (three token blocks:
// with two, their order would not show) of D = 33; a few tokens at Qwen-Image's width.
constexpr Shape kShapes[] = {{1, 1, 7}, {3, 20, 40}, {2, 600, 33}, {2, 3, 3072}};

TEST_F(ModulationOnEmulatedCuda, GateResidualEqualsTheReference) {
  for (const Shape& shape : kShapes) {
    for (const DType dtype : kDTypes) {
      for (const NormMode mode : kModes) {
        SCOPED_TRACE(std::to_string(shape.seq) + "x" + std::to_string(shape.dim) + " " +
                     dtype_name(dtype) + " " + norm_mode_name(mode));
        test::Rng rng(7);
        const std::vector<std::int64_t> tokens{shape.batch, shape.seq, shape.dim};
        const std::vector<std::int64_t> vector{shape.batch, shape.dim};
        const HostTensor x = test::random_tensor(dtype, tokens, rng);
        const HostTensor y = test::random_tensor(dtype, tokens, rng);
        const HostTensor dout = test::random_tensor(dtype, tokens, rng);
        const HostTensor gate = test::random_tensor(dtype, vector, rng);
        const GateResidualOptions options{mode};
        std::vector<HostTensor> results;
        on_both([&] {
          HostTensor out = poisoned(dtype, tokens), dy = poisoned(dtype, tokens);
          HostTensor dgate = poisoned(dtype, vector), dy_alone = poisoned(dtype, tokens);
          adaln_gate_residual_forward(x.cview(), gate.cview(), y.cview(), out.view(), options);
          adaln_gate_residual_backward(gate.cview(), y.cview(), dout.cview(), dy.view(),
                                       dgate.view(), options);
          adaln_gate_residual_backward(gate.cview(), y.cview(), dout.cview(), dy_alone.view(),
                                       std::nullopt, options);
          results.insert(results.end(), {out, dy, dgate, dy_alone});
        });
        ASSERT_EQ(results.size(), 8u);
        for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(results[i] == results[i + 4]) << i;
      }
    }
  }
}

TEST_F(ModulationOnEmulatedCuda, AdaLnModulationEqualsTheReference) {
  for (const Shape& shape : kShapes) {
    for (const DType dtype : kDTypes) {
      for (const NormMode mode : kModes) {
        SCOPED_TRACE(std::to_string(shape.seq) + "x" + std::to_string(shape.dim) + " " +
                     dtype_name(dtype) + " " + norm_mode_name(mode));
        test::Rng rng(11);
        const std::vector<std::int64_t> tokens{shape.batch, shape.seq, shape.dim};
        const std::vector<std::int64_t> vector{shape.batch, shape.dim};
        // x off-centre, so the mean and the variance about it both matter.
        HostTensor x = test::random_tensor(dtype, tokens, rng);
        for (std::int64_t e = 0; e < x.elements(); ++e) x.set(e, x.get(e) + 3.0);
        const HostTensor scale = test::random_tensor(dtype, vector, rng, 0.5);
        const HostTensor shift = test::random_tensor(dtype, vector, rng);
        const HostTensor dy = test::random_tensor(dtype, tokens, rng);
        const AdaLnOptions options{1e-6f, mode};
        std::vector<HostTensor> results;
        on_both([&] {
          HostTensor y = poisoned(dtype, tokens), dx = poisoned(dtype, tokens);
          HostTensor dscale = poisoned(dtype, vector), dshift = poisoned(dtype, vector);
          HostTensor dx_shift = poisoned(dtype, tokens), dshift_alone = poisoned(dtype, vector);
          HostTensor dx_scale = poisoned(dtype, tokens), dscale_alone = poisoned(dtype, vector);
          adaln_modulation_forward(x.cview(), scale.cview(), shift.cview(), y.view(), options);
          adaln_modulation_backward(x.cview(), scale.cview(), dy.cview(), dx.view(), dscale.view(),
                                    dshift.view(), options);
          adaln_modulation_backward(x.cview(), scale.cview(), dy.cview(), dx_shift.view(),
                                    std::nullopt, dshift_alone.view(), options);
          adaln_modulation_backward(x.cview(), scale.cview(), dy.cview(), dx_scale.view(),
                                    dscale_alone.view(), std::nullopt, options);
          results.insert(results.end(),
                         {y, dx, dscale, dshift, dx_shift, dshift_alone, dx_scale, dscale_alone});
        });
        ASSERT_EQ(results.size(), 16u);
        for (std::size_t i = 0; i < 8; ++i) EXPECT_TRUE(results[i] == results[i + 8]) << i;
        // The gradients asked for alone are those of the full call.
        EXPECT_TRUE(results[4] == results[1] && results[5] == results[3]);
        EXPECT_TRUE(results[6] == results[1] && results[7] == results[2]);
      }
    }
  }
}

// The elementwise activation (cuda/device/activation_kernels.cuh), every kind, dtype and
// rank, and in place.
TEST_F(ModulationOnEmulatedCuda, ActivationEqualsTheReference) {
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {3, 3072}, {2, 5, 33}, {2, 3, 4, 9}};
  for (const auto& shape : shapes) {
    for (const DType dtype : kDTypes) {
      for (const Activation kind : {Activation::None, Activation::GeluTanh, Activation::Silu}) {
        SCOPED_TRACE(std::to_string(shape.size()) + "-D " + dtype_name(dtype) + " " +
                     activation_name(kind));
        test::Rng rng(9);
        const HostTensor x = test::random_tensor(dtype, shape, rng, 4.0, 6);
        const HostTensor dy = test::random_tensor(dtype, shape, rng);
        std::vector<HostTensor> results;
        on_both([&] {
          HostTensor y = poisoned(dtype, shape), dx = poisoned(dtype, shape);
          activation_forward(x.cview(), y.view(), {kind});
          activation_backward(x.cview(), dy.cview(), dx.view(), {kind});
          HostTensor in_place = x;
          activation_forward(in_place.cview(), in_place.view(), {kind});
          results.insert(results.end(), {y, dx, in_place});
        });
        ASSERT_EQ(results.size(), 6u);
        for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(results[i] == results[i + 3]) << i;
      }
    }
  }
}

// Strided rows (every other element of wider rows; the per-sample vectors as [B, 1, D]
// views with a token stride of 0) and outputs written in place of an input.
TEST_F(ModulationOnEmulatedCuda, StridedViewsAndInPlaceEqualTheReference) {
  constexpr std::int64_t kB = 2, kS = 70, kD = 37;
  const DType dtype = DType::BF16;
  test::Rng rng(5);
  const HostTensor wide_x = test::random_tensor(dtype, {kB, kS, 2 * kD}, rng);
  const HostTensor wide_y = test::random_tensor(dtype, {kB, kS, 2 * kD}, rng);
  const HostTensor vectors = test::random_tensor(dtype, {kB, 2 * kD}, rng, 0.5);
  const auto every_other = [](auto view) {
    return test::strided(view, {kB, kS, kD}, {kS * 2 * kD, 2 * kD, 2});
  };
  const auto sample_vector = [](auto view, std::int64_t first) {
    view.data = static_cast<const std::uint16_t*>(view.data) + first;
    return test::strided(view, {kB, 1, kD}, {2 * kD, 0, 2});
  };
  const ConstTensorView x = every_other(wide_x.cview()), y = every_other(wide_y.cview());
  const ConstTensorView gate = sample_vector(vectors.cview(), 0);
  const ConstTensorView shift = sample_vector(vectors.cview(), 1);
  std::vector<HostTensor> results;
  on_both([&] {
    HostTensor wide_out = poisoned(dtype, {kB, kS, 2 * kD});
    HostTensor dgate = poisoned(dtype, {kB, 1, kD});
    adaln_gate_residual_forward(x, gate, y, every_other(wide_out.view()), {NormMode::Diffusers});
    adaln_gate_residual_backward(gate, y, x, every_other(wide_out.view()), dgate.view(),
                                 {NormMode::Diffusers});
    // In place: adaln's y written over x, its dx over dy.
    HostTensor in_place(dtype, {kB, kS, kD});
    for (std::int64_t e = 0; e < in_place.elements(); ++e)
      in_place.set(e, 1.0 + 0.01 * static_cast<double>(e % 97));
    adaln_modulation_forward(in_place.cview(), gate, shift, in_place.view(), {});
    HostTensor dy(dtype, {kB, kS, kD});
    for (std::int64_t e = 0; e < dy.elements(); ++e)
      dy.set(e, 0.5 - 0.01 * static_cast<double>(e % 89));
    adaln_modulation_backward(x, gate, dy.cview(), dy.view(), std::nullopt, std::nullopt, {});
    results.insert(results.end(), {wide_out, dgate, in_place, dy});
  });
  ASSERT_EQ(results.size(), 8u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(results[i] == results[i + 4]) << i;
}

// The launches the plans make, in order, as the trace records them.
TEST_F(ModulationOnEmulatedCuda, LaunchesOfTheBackward) {
  const std::string path = testing::TempDir() + "modulation_emulated_trace.jsonl";
  std::remove(path.c_str());
  test::Rng rng(3);
  const HostTensor x = test::random_tensor(DType::F32, {2, 300, 20}, rng);
  const HostTensor v = test::random_tensor(DType::F32, {2, 20}, rng);
  HostTensor dx(DType::F32, {2, 300, 20}), dv(DType::F32, {2, 20});
  set_backend("cuda-emulated");
  set_trace_path(path);
  adaln_modulation_backward(x.cview(), v.cview(), x.cview(), dx.view(), dv.view(), std::nullopt,
                            {});
  set_trace_path("");
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  std::size_t at = 0;
  // 600 rows, 16 a block; 2 samples x 2 token blocks x 20 columns; 2 x 20 sums.
  for (const char* launch :
       {R"({"kernel":"adaln_row_statistics","grid":[38,1,1],"block":[256,1,1],"rows_per_block":16)",
        R"({"kernel":"adaln_token_block_sums","grid":[1,1,1],"block":[256,1,1])",
        R"({"kernel":"finish_token_sums","grid":[1,1,1],"block":[256,1,1])",
        R"({"kernel":"adaln_backward_dx","grid":[38,1,1],"block":[256,1,1],"rows_per_block":16)"}) {
    at = line.find(launch, at);
    EXPECT_NE(at, std::string::npos) << launch << " in " << line;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kernel_align
