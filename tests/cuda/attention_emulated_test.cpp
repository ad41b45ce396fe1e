// Joint attention's CUDA kernels (cuda/device/attention_kernels.cuh) and plans, the very
// source nvcc compiles, run by the grid emulator ("cuda-emulated") through the public API
// against the reference backend, byte for byte: every dtype, both layouts, no mask, a
// padded batch (masked positions spread through a sample, one sample fully masked), head
// dims 8, 33 and 128, key counts around the linear tree's 32-term leaves (1, 31, 33, 70),
// forward and backward. Outputs start as 0xA5 bytes and are compared whole, so a stray or
// missing write (the padding's zeros included) shows.
#include <gtest/gtest.h>

#include <cstddef>
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

using AttentionOnEmulatedCuda = test::OnEmulatedCuda;

struct Case {
  std::int64_t batch, seq, heads, dim;
};

// out, dq, dk, dv of one call on `backend`.
std::vector<HostTensor> run(const char* backend, const std::vector<HostTensor>& in,
                            const std::optional<ConstTensorView>& mask, Layout layout) {
  set_backend(backend);
  const std::vector<std::int64_t>& shape = in[0].shape();
  const DType dtype = in[0].dtype();
  std::vector<HostTensor> out{poisoned(dtype, shape), poisoned(dtype, shape),
                              poisoned(dtype, shape), poisoned(dtype, shape)};
  const AttentionOptions options{layout};
  attention_forward(in[0].cview(), in[1].cview(), in[2].cview(), mask, out[0].view(), options);
  EXPECT_EQ(last_call().backend, backend);
  attention_backward(in[0].cview(), in[1].cview(), in[2].cview(), mask, out[0].cview(),
                     in[3].cview(), out[1].view(), out[2].view(), out[3].view(), options);
  EXPECT_EQ(last_call().backend, backend);
  return out;
}

TEST_F(AttentionOnEmulatedCuda, ForwardAndBackwardEqualTheReference) {
  constexpr Case kCases[] = {
      {1, 1, 1, 8}, {2, 31, 2, 33}, {2, 33, 1, 8}, {3, 70, 2, 8}, {1, 40, 1, 128}};
  for (const Case& c : kCases) {
    for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (const Layout layout : {Layout::BSHD, Layout::BHSD}) {
        for (const bool masked : {false, true}) {
          SCOPED_TRACE(std::to_string(c.seq) + " tokens, D " + std::to_string(c.dim) + " " +
                       dtype_name(dtype) + " " + layout_name(layout) +
                       (masked ? " masked" : " no mask"));
          test::Rng rng(static_cast<std::uint64_t>(c.seq * 131 + c.dim));
          const std::vector<std::int64_t> shape =
              layout == Layout::BSHD ? std::vector<std::int64_t>{c.batch, c.seq, c.heads, c.dim}
                                     : std::vector<std::int64_t>{c.batch, c.heads, c.seq, c.dim};
          std::vector<HostTensor> in;
          for (int i = 0; i < 4; ++i) in.push_back(test::random_tensor(dtype, shape, rng));
          // Sample 0 keeps every other position from 3 on; sample 1 the first two thirds;
          // sample 2 none.
          HostTensor mask(DType::Bool, {c.batch, c.seq});
          auto* bits = static_cast<unsigned char*>(mask.data());
          for (std::int64_t b = 0; b < c.batch; ++b) {
            for (std::int64_t s = 0; s < c.seq; ++s) {
              const bool valid = b == 0   ? (s < 3 || s % 2 == 0)
                                 : b == 1 ? 3 * s < 2 * c.seq
                                          : false;
              bits[b * c.seq + s] = valid ? 1 : 0;
            }
          }
          const std::optional<ConstTensorView> mask_view =
              masked ? std::optional(mask.cview()) : std::nullopt;
          const std::vector<HostTensor> want = run("reference", in, mask_view, layout);
          const std::vector<HostTensor> got = run("cuda-emulated", in, mask_view, layout);
          for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kernel_align
