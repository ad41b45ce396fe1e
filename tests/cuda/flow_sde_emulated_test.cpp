// flow_sde_step's and flow_sde_logp's CUDA kernels (cuda/device/flow_sde_kernels.cuh) and
// plan, the very source nvcc compiles, run by the grid emulator ("cuda-emulated") through the
// public API against the reference backend, byte for byte: every dtype, forward and
// backward, samples of fewer elements than a leaf, of leaves crossing rows and of many
// leaves with a partial last one (more leaves than a block has threads), one gradient
// absent, strided views, in place; and the launches in order. Outputs start as 0xA5 bytes
// and are compared whole, so a stray or missing write shows.
#include <gtest/gtest.h>

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
const FlowSdeOptions kStep{
    .sigma = 0.8f, .sigma_prev = 0.6f, .noise_level = 0.7f, .sigma_max = 0.9f};

using FlowSdeOnEmulatedCuda = test::OnEmulatedCuda;

// Every output of the four calls, on the backend set.
std::vector<HostTensor> all_outputs(const std::vector<HostTensor>& in, bool with_dx) {
  const HostTensor &x = in[0], &v = in[1], &noise = in[2], &prev = in[3], &dlogp = in[4];
  const DType t = x.dtype();
  const std::vector<std::int64_t>& shape = x.shape();
  HostTensor out_prev = poisoned(t, shape), dx_step = poisoned(t, shape),
             dv_step = poisoned(t, shape), logp = poisoned(DType::F32, {shape[0]}),
             dx = poisoned(t, shape), dv = poisoned(t, shape);
  flow_sde_step_forward(x.cview(), v.cview(), noise.cview(), out_prev.view(), kStep);
  flow_sde_step_backward(noise.cview(), with_dx ? std::optional(dx_step.view()) : std::nullopt,
                         dv_step.view(), kStep);
  flow_sde_logp_forward(x.cview(), v.cview(), prev.cview(), logp.view(), kStep);
  flow_sde_logp_backward(x.cview(), v.cview(), prev.cview(), dlogp.cview(),
                         with_dx ? std::optional(dx.view()) : std::nullopt, dv.view(), kStep);
  HostTensor in_place = x;
  flow_sde_step_forward(in_place.cview(), v.cview(), noise.cview(), in_place.view(), kStep);
  return {out_prev, dx_step, dv_step, logp, dx, dv, in_place};
}

TEST_F(FlowSdeOnEmulatedCuda, EveryCallEqualsTheReference) {
  const std::vector<std::vector<std::int64_t>> shapes = {
      {3, 17}, {2, 5, 64}, {2, 300, 64}, {1, 3, 7, 45}};
  for (const auto& shape : shapes) {
    for (const DType dtype : kDTypes) {
      for (const bool with_dx : {true, false}) {
        SCOPED_TRACE(std::to_string(shape.size()) + "-D " + std::to_string(shape.back()) + " " +
                     dtype_name(dtype) + (with_dx ? " dx" : " no dx"));
        test::Rng rng(21);
        std::vector<HostTensor> in;
        for (int i = 0; i < 4; ++i) in.push_back(test::random_tensor(dtype, shape, rng, 2.0));
        in.push_back(test::random_tensor(DType::F32, {shape[0]}, rng));
        set_backend("reference");
        const std::vector<HostTensor> want = all_outputs(in, with_dx);
        set_backend("cuda-emulated");
        const std::vector<HostTensor> got = all_outputs(in, with_dx);
        EXPECT_EQ(last_call().backend, "cuda-emulated");
        for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << i;
      }
    }
  }
}

// Every other element of wider rows gives the contiguous bytes.
TEST_F(FlowSdeOnEmulatedCuda, StridedViewsEqualTheReference) {
  constexpr std::int64_t kB = 2, kD = 70;
  test::Rng rng(22);
  HostTensor wide_x = test::random_tensor(DType::BF16, {kB, 2 * kD}, rng, 2.0);
  const HostTensor v = test::random_tensor(DType::BF16, {kB, kD}, rng, 2.0);
  const HostTensor prev = test::random_tensor(DType::BF16, {kB, kD}, rng, 2.0);
  const auto every_other = [](auto view) { return test::strided(view, {kB, kD}, {2 * kD, 2}); };
  std::vector<HostTensor> results;
  for (const char* backend : {"reference", "cuda-emulated"}) {
    set_backend(backend);
    HostTensor logp = poisoned(DType::F32, {kB});
    flow_sde_logp_forward(every_other(wide_x.cview()), v.cview(), prev.cview(), logp.view(), kStep);
    results.push_back(logp);
  }
  EXPECT_TRUE(results[0] == results[1]);
}

// The launches the plans make, in order, as the trace records them: a thread a leaf, then
// a thread a sample.
TEST_F(FlowSdeOnEmulatedCuda, LaunchesOfTheLogProbability) {
  const std::string path = testing::TempDir() + "flow_sde_emulated_trace.jsonl";
  std::remove(path.c_str());
  test::Rng rng(23);
  const HostTensor x = test::random_tensor(DType::F32, {2, 300, 64}, rng);
  HostTensor logp(DType::F32, {2});
  set_backend("cuda-emulated");
  set_trace_path(path);
  flow_sde_logp_forward(x.cview(), x.cview(), x.cview(), logp.view(), kStep);
  set_trace_path("");
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  std::size_t at = 0;
  // 2 samples x 600 leaves, 256 threads a block; 2 samples.
  for (const char* launch :
       {R"({"kernel":"flow_sde_leaf_sums","grid":[5,1,1],"block":[256,1,1])",
        R"({"kernel":"flow_sde_finish_logp","grid":[1,1,1],"block":[256,1,1])"}) {
    at = line.find(launch, at);
    EXPECT_NE(at, std::string::npos) << launch << " in " << line;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kernel_align
