// true_cfg's CUDA kernels (cuda/device/cfg_kernels.cuh) and plan, the very source nvcc
// compiles, run by the grid emulator ("cuda-emulated") through the public API against the
// reference backend, byte for byte: every dtype, ranks 1 to 4, rows of odd lengths, fewer
// rows than a block and several blocks, one gradient or both, v in place over uncond, and a
// row of zeros. Outputs start as 0xA5 bytes and are compared whole, so a stray or missing
// write shows.
#include <gtest/gtest.h>

#include <cstdint>
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

using TrueCfgOnEmulatedCuda = test::OnEmulatedCuda;

// One row of one element; odd rows; Qwen-Image's 64 channels over more rows than a block.
const std::vector<std::vector<std::int64_t>> kShapes = {{1}, {3, 37}, {2, 5, 33}, {2, 3, 50, 64}};

TEST_F(TrueCfgOnEmulatedCuda, ForwardAndBackwardEqualTheReference) {
  for (const auto& shape : kShapes) {
    for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::to_string(shape.size()) + "-D " + dtype_name(dtype));
      test::Rng rng(41);
      HostTensor cond = test::random_tensor(dtype, shape, rng);
      const HostTensor uncond = test::random_tensor(dtype, shape, rng);
      const HostTensor dv = test::random_tensor(dtype, shape, rng);
      // A conditional row of zeros (the first): the norm's gradient share taken as 0.
      for (std::int64_t i = 0; i < shape.back(); ++i) cond.set(i, 0.0);
      std::vector<HostTensor> results;
      const auto calls = [&] {
        HostTensor v = poisoned(dtype, shape), dcond = poisoned(dtype, shape);
        HostTensor duncond = poisoned(dtype, shape), only_duncond = poisoned(dtype, shape);
        true_cfg_forward(cond.cview(), uncond.cview(), v.view(), {3.5f});
        true_cfg_backward(cond.cview(), uncond.cview(), dv.cview(), dcond.view(), duncond.view(),
                          {3.5f});
        true_cfg_backward(cond.cview(), uncond.cview(), dv.cview(), std::nullopt,
                          only_duncond.view(), {3.5f});
        HostTensor in_place = uncond;
        true_cfg_forward(cond.cview(), in_place.cview(), in_place.view(), {3.5f});
        results.insert(results.end(), {v, dcond, duncond, only_duncond, in_place});
      };
      set_backend("reference");
      calls();
      set_backend("cuda-emulated");
      calls();
      EXPECT_EQ(last_call().backend, "cuda-emulated");
      ASSERT_EQ(results.size(), 10u);
      for (std::size_t i = 0; i < 5; ++i) EXPECT_TRUE(results[i] == results[i + 5]) << i;
      EXPECT_TRUE(results[2] == results[3]);
      EXPECT_TRUE(results[0] == results[4]);
    }
  }
}

}  // namespace
}  // namespace kernel_align
