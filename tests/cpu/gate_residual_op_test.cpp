// adaln_gate_residual_forward / _backward through the public API: both backends against
// the contract's formula evaluated here in its own loops, byte for byte (the products and
// sums in fp32 as the contract orders them, dgate by 256-token blocks); the simd backend on
// every path and thread count; a sample's bytes alone equal its bytes in a batch; in place
// equals out of place; bad arguments are Errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
constexpr NormMode kModes[] = {NormMode::Single, NormMode::Diffusers};

// x, y, dout [B, S, D]; gate [B, D].
struct Inputs {
  HostTensor x, y, dout, gate;
};

Inputs random_inputs(DType dtype, std::int64_t batch, std::int64_t seq, std::int64_t dim,
                     std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor x = test::random_tensor(dtype, {batch, seq, dim}, rng);
  HostTensor y = test::random_tensor(dtype, {batch, seq, dim}, rng);
  HostTensor dout = test::random_tensor(dtype, {batch, seq, dim}, rng);
  HostTensor gate = test::random_tensor(dtype, {batch, dim}, rng);
  return {std::move(x), std::move(y), std::move(dout), std::move(gate)};
}

struct Results {
  HostTensor out, dy, dgate;
  bool operator==(const Results&) const = default;
};

Results run_both(const Inputs& in, DType out_dtype, const GateResidualOptions& options) {
  Results r{HostTensor(out_dtype, in.x.shape()), HostTensor(out_dtype, in.x.shape()),
            HostTensor(out_dtype, in.gate.shape())};
  adaln_gate_residual_forward(in.x.cview(), in.gate.cview(), in.y.cview(), r.out.view(), options);
  adaln_gate_residual_backward(in.gate.cview(), in.y.cview(), in.dout.cview(), r.dy.view(),
                               r.dgate.view(), options);
  return r;
}

// The contract (section 13) written out here: float operations, which -ffp-contract=off
// keeps unfused, each result stored (rounded) into the output's dtype.
Results contract_results(const Inputs& in, DType out_dtype, NormMode mode) {
  const std::int64_t batch = in.x.shape()[0], seq = in.x.shape()[1], dim = in.x.shape()[2];
  Results r{HostTensor(out_dtype, in.x.shape()), HostTensor(out_dtype, in.x.shape()),
            HostTensor(out_dtype, in.gate.shape())};
  HostTensor product(out_dtype, {1});  // rounds a product through the output's dtype
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < dim; ++i) {
      const auto gate = static_cast<float>(in.gate.get(b * dim + i));
      float dgate = 0.0f;
      for (std::int64_t block = 0; block * 256 < seq; ++block) {
        float part = 0.0f;
        for (std::int64_t s = block * 256; s < std::min(seq, block * 256 + 256); ++s) {
          const std::int64_t e = (b * seq + s) * dim + i;
          const auto x = static_cast<float>(in.x.get(e));
          const auto y = static_cast<float>(in.y.get(e));
          const auto dout = static_cast<float>(in.dout.get(e));
          float p = gate * y;
          if (mode == NormMode::Diffusers) {
            product.set(0, p);
            p = static_cast<float>(product.get(0));
          }
          r.out.set(e, x + p);
          r.dy.set(e, gate * dout);
          part = part + dout * y;
        }
        dgate = dgate + part;
      }
      r.dgate.set(b * dim + i, dgate);
    }
  }
  return r;
}

// 600 tokens: three token blocks of dgate (256, 256 and 88).
TEST(GateResidualOp, EveryBackendPathAndThreadCountComputesTheContract) {
  const test::RuntimeGuard guard;
  for (const DType dtype : kDTypes) {
    for (const NormMode mode : kModes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + norm_mode_name(mode));
      const Inputs in = random_inputs(dtype, 3, 600, 40, 1);
      const GateResidualOptions options{mode};
      const Results want = contract_results(in, dtype, mode);
      set_backend("reference");
      EXPECT_TRUE(run_both(in, dtype, options) == want);
      EXPECT_EQ(last_call().backend, "reference");
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(isa_name(path)) + " threads " + std::to_string(threads));
          set_num_threads(threads);
          EXPECT_TRUE(run_both(in, dtype, options) == want);
          EXPECT_EQ(last_call().backend, "simd");
        }
      }
    }
  }
}

// Strided rows (every other element of wider rows, and an output of its own strides) give
// the bytes of contiguous ones on every path: the kernels' gather and scatter of chunks.
TEST(GateResidualOp, StridedRowsEqualContiguousOnes) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kB = 2, kS = 70, kD = 37;
  for (const DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Inputs in = random_inputs(dtype, kB, kS, kD, 13);
    const Results want = contract_results(in, dtype, NormMode::Diffusers);
    // Wide copies: element (b, s, i) at (b, s, 2 i).
    const auto widened = [&](const HostTensor& t) {
      HostTensor wide(dtype, {kB, kS, 2 * kD});
      for (std::int64_t e = 0; e < t.elements(); ++e) wide.set(2 * e, t.get(e));
      return wide;
    };
    const HostTensor x = widened(in.x), y = widened(in.y), dout = widened(in.dout);
    const auto every_other = [](auto view) {
      return test::strided(view, {kB, kS, kD}, {kS * 2 * kD, 2 * kD, 2});
    };
    HostTensor out(dtype, {kB, kS, 2 * kD}), dy(dtype, {kB, kS, 2 * kD});
    HostTensor dgate(dtype, in.gate.shape());
    set_backend("simd");
    for (const Isa path : test::available_isas()) {
      SCOPED_TRACE(isa_name(path));
      set_isa(path);
      adaln_gate_residual_forward(every_other(x.cview()), in.gate.cview(), every_other(y.cview()),
                                  every_other(out.view()));
      adaln_gate_residual_backward(in.gate.cview(), every_other(y.cview()),
                                   every_other(dout.cview()), every_other(dy.view()), dgate.view());
      for (std::int64_t e = 0; e < want.out.elements(); ++e) {
        ASSERT_EQ(out.get(2 * e), want.out.get(e)) << e;
        ASSERT_EQ(dy.get(2 * e), want.dy.get(e)) << e;
      }
      EXPECT_TRUE(dgate == want.dgate);
    }
  }
}

// In bf16 the two modes differ (the product's rounding), and the default is diffusers'.
TEST(GateResidualOp, TheModesDifferWhereTheProductRounds) {
  const test::RuntimeGuard guard;
  const Inputs in = random_inputs(DType::BF16, 2, 50, 64, 3);
  const Results single = run_both(in, DType::BF16, {NormMode::Single});
  const Results diffusers = run_both(in, DType::BF16, {NormMode::Diffusers});
  EXPECT_FALSE(single.out == diffusers.out);
  EXPECT_TRUE(single.dy == diffusers.dy);
  EXPECT_TRUE(single.dgate == diffusers.dgate);
  EXPECT_TRUE(run_both(in, DType::BF16, {}) == diffusers);
}

// Sample 1 of a batch of 3 against the same sample alone: the same bytes of out, dy and
// dgate, on both backends, and with a [B, 1, D] gate view.
TEST(GateResidualOp, ASampleAloneEqualsItsBytesInABatch) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kSeq = 270, kDim = 24;
  const Inputs batch = random_inputs(DType::BF16, 3, kSeq, kDim, 5);
  Inputs alone = random_inputs(DType::BF16, 1, kSeq, kDim, 6);
  const auto copy = [](const HostTensor& from, HostTensor& to, std::int64_t first) {
    for (std::int64_t e = 0; e < to.elements(); ++e) to.set(e, from.get(first + e));
  };
  copy(batch.x, alone.x, kSeq * kDim);
  copy(batch.y, alone.y, kSeq * kDim);
  copy(batch.dout, alone.dout, kSeq * kDim);
  copy(batch.gate, alone.gate, kDim);
  const auto same = [](const HostTensor& a, const HostTensor& b, std::int64_t first) {
    for (std::int64_t e = 0; e < b.elements(); ++e) {
      if (a.get(first + e) != b.get(e) ||
          std::signbit(a.get(first + e)) != std::signbit(b.get(e))) {
        return false;
      }
    }
    return true;
  };
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const Results all = run_both(batch, DType::BF16, {});
      const Results one = run_both(alone, DType::BF16, {});
      EXPECT_TRUE(same(all.out, one.out, kSeq * kDim));
      EXPECT_TRUE(same(all.dy, one.dy, kSeq * kDim));
      EXPECT_TRUE(same(all.dgate, one.dgate, kDim));
    }
  }
  HostTensor out(DType::BF16, batch.x.shape()), out3(DType::BF16, batch.x.shape());
  adaln_gate_residual_forward(batch.x.cview(), batch.gate.cview(), batch.y.cview(), out.view());
  const ConstTensorView gate3 = test::strided(batch.gate.cview(), {3, 1, kDim}, {kDim, kDim, 1});
  adaln_gate_residual_forward(batch.x.cview(), gate3, batch.y.cview(), out3.view());
  EXPECT_TRUE(out == out3);
}

TEST(GateResidualOp, InPlaceEqualsOutOfPlace) {
  const test::RuntimeGuard guard;
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    const Inputs in = random_inputs(DType::F32, 2, 300, 16, 7);
    const Results want = run_both(in, DType::F32, {});
    HostTensor x = in.x;  // the residual stream updated in place
    adaln_gate_residual_forward(x.cview(), in.gate.cview(), in.y.cview(), x.view());
    EXPECT_TRUE(x == want.out);
    HostTensor y = in.y;
    adaln_gate_residual_forward(in.x.cview(), in.gate.cview(), y.cview(), y.view());
    EXPECT_TRUE(y == want.out);
    // dy over dout, then over y: dgate's sums read both before any dy is written.
    HostTensor dout = in.dout;
    HostTensor dgate(DType::F32, in.gate.shape());
    adaln_gate_residual_backward(in.gate.cview(), in.y.cview(), dout.cview(), dout.view(),
                                 dgate.view());
    EXPECT_TRUE(dout == want.dy);
    EXPECT_TRUE(dgate == want.dgate);
    HostTensor y2 = in.y;
    adaln_gate_residual_backward(in.gate.cview(), y2.cview(), in.dout.cview(), y2.view(),
                                 dgate.view());
    EXPECT_TRUE(y2 == want.dy);
    EXPECT_TRUE(dgate == want.dgate);
  }
}

TEST(GateResidualOp, BadArgumentsAreErrorsNamingThem) {
  const test::RuntimeGuard guard;
  const Inputs in = random_inputs(DType::F32, 2, 5, 8, 11);
  HostTensor out(DType::F32, {2, 5, 8});
  const auto fwd = [&](const ConstTensorView& x, const ConstTensorView& gate,
                       const ConstTensorView& y, const TensorView& o) {
    return test::rejected_argument([&] { adaln_gate_residual_forward(x, gate, y, o); });
  };
  EXPECT_EQ(fwd(in.x.cview(), in.gate.cview(), in.y.cview(), out.view()), "(accepted)");
  const HostTensor x2(DType::F32, {10, 8});
  EXPECT_EQ(fwd(x2.cview(), in.gate.cview(), in.y.cview(), out.view()), "x");
  const HostTensor wide(DType::F32, {1, 1, kMaxHeadDim + 1});
  EXPECT_EQ(fwd(wide.cview(), in.gate.cview(), in.y.cview(), out.view()), "x");
  const HostTensor gate_d(DType::F32, {2, 9});
  EXPECT_EQ(fwd(in.x.cview(), gate_d.cview(), in.y.cview(), out.view()), "gate");
  const HostTensor gate_s(DType::F32, {2, 5, 8});  // per token: not a modulation
  EXPECT_EQ(fwd(in.x.cview(), gate_s.cview(), in.y.cview(), out.view()), "gate");
  const HostTensor y_short(DType::F32, {2, 4, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.gate.cview(), y_short.cview(), out.view()), "y");
  const HostTensor bool_y(DType::Bool, {2, 5, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.gate.cview(), bool_y.cview(), out.view()), "y");
  HostTensor out_short(DType::F32, {2, 4, 8});
  EXPECT_EQ(fwd(in.x.cview(), in.gate.cview(), in.y.cview(), out_short.view()), "out");
  // out over the gate's memory: only x or y may be overwritten.
  HostTensor gate_and_out(DType::F32, {2, 5, 8});
  const ConstTensorView gate_in_out = test::strided(gate_and_out.cview(), {2, 8}, {40, 1});
  EXPECT_EQ(fwd(in.x.cview(), gate_in_out, in.y.cview(), gate_and_out.view()), "out");

  HostTensor dy(DType::F32, {2, 5, 8}), dgate(DType::F32, {2, 8});
  const auto bwd = [&](const ConstTensorView& dout, const TensorView& gy,
                       const std::optional<TensorView>& gg) {
    return test::rejected_argument(
        [&] { adaln_gate_residual_backward(in.gate.cview(), in.y.cview(), dout, gy, gg); });
  };
  EXPECT_EQ(bwd(in.dout.cview(), dy.view(), dgate.view()), "(accepted)");
  EXPECT_EQ(bwd(in.dout.cview(), dy.view(), std::nullopt), "(accepted)");
  EXPECT_EQ(bwd(y_short.cview(), dy.view(), dgate.view()), "dout");
  EXPECT_EQ(bwd(in.dout.cview(), out_short.view(), dgate.view()), "dy");
  HostTensor dgate_3(DType::F32, {2, 1, 8});  // not gate's shape
  EXPECT_EQ(bwd(in.dout.cview(), dy.view(), dgate_3.view()), "dgate");
  EXPECT_EQ(bwd(in.dout.cview(), dy.view(), dy.view()), "dgate");
}

}  // namespace
}  // namespace kernel_align
