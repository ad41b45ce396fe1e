// attention_forward / attention_backward through the public API: the simd backend (every
// path, 1 to 3 threads, both layouts) against the reference backend byte for byte; a
// sample's bytes alone (its own tokens) equal its bytes in a batch where it is padded by
// the mask; the bhsd layout computes the bshd bytes of the transposed tensors; masked
// tokens and samples without a valid token give +0; bad arguments are Errors naming them.
#include <gtest/gtest.h>

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

// q, k, v, the forward's output's gradient and a key-padding mask of one call, [B, S, H, D].
struct Inputs {
  HostTensor q, k, v, dout, mask;
};

Inputs random_inputs(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor q = test::random_tensor(dtype, shape, rng);
  HostTensor k = test::random_tensor(dtype, shape, rng);
  HostTensor v = test::random_tensor(dtype, shape, rng);
  HostTensor dout = test::random_tensor(dtype, shape, rng);
  HostTensor mask(DType::Bool, {shape[0], shape[1]});
  mask.fill_bytes(std::byte{1});
  return {std::move(q), std::move(k), std::move(v), std::move(dout), std::move(mask)};
}

void set_mask(HostTensor& mask, std::int64_t b, std::int64_t s, bool valid) {
  static_cast<unsigned char*>(mask.data())[b * mask.shape()[1] + s] = valid ? 1 : 0;
}

struct Results {
  HostTensor out, dq, dk, dv;
  bool operator==(const Results&) const = default;
};

Results run_both(const Inputs& in, bool masked, DType out_dtype,
                 const AttentionOptions& options = {}) {
  const std::vector<std::int64_t>& shape = in.q.shape();
  Results r{HostTensor(out_dtype, shape), HostTensor(out_dtype, shape),
            HostTensor(out_dtype, shape), HostTensor(out_dtype, shape)};
  const std::optional<ConstTensorView> mask =
      masked ? std::optional(in.mask.cview()) : std::nullopt;
  attention_forward(in.q.cview(), in.k.cview(), in.v.cview(), mask, r.out.view(), options);
  attention_backward(in.q.cview(), in.k.cview(), in.v.cview(), mask, r.out.cview(), in.dout.cview(),
                     r.dq.view(), r.dk.view(), r.dv.view(), options);
  return r;
}

TEST(AttentionOp, SimdEqualsReferenceOnEveryPathAndThreadCount) {
  const test::RuntimeGuard guard;
  for (const DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Inputs in = random_inputs(dtype, {2, 37, 3, 24}, 1);
    // Sample 0: tokens 5..9 are padding (a middle gap); sample 1: the last 12.
    for (std::int64_t s = 5; s < 10; ++s) set_mask(in.mask, 0, s, false);
    for (std::int64_t s = 25; s < 37; ++s) set_mask(in.mask, 1, s, false);
    for (const bool masked : {false, true}) {
      SCOPED_TRACE(masked ? "masked" : "no mask");
      set_backend("reference");
      const Results want = run_both(in, masked, dtype);
      EXPECT_EQ(last_call().backend, "reference");
      set_backend("simd");
      for (const Isa path : test::available_isas()) {
        set_isa(path);
        for (const int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(isa_name(path)) + " threads " + std::to_string(threads));
          set_num_threads(threads);
          EXPECT_TRUE(run_both(in, masked, dtype) == want);
          EXPECT_EQ(last_call().backend, "simd");
        }
      }
    }
  }
}

// Sample 1 of a batch whose mask pads it (its 20 valid tokens spread over 31 positions)
// against the same sample alone: its 20 tokens, no mask. Every valid token's output and
// gradients are the same bytes; the padding's are +0.
TEST(AttentionOp, PaddingChangesNoByteOfASample) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kSeq = 31, kHeads = 2, kDim = 40;
  Inputs batch = random_inputs(DType::BF16, {2, kSeq, kHeads, kDim}, 3);
  std::vector<std::int64_t> valid;
  for (std::int64_t s = 0; s < kSeq; ++s) {
    const bool is_valid = s % 3 != 1 || s > 27;  // padding in the middle and none at the end
    set_mask(batch.mask, 1, s, is_valid);
    if (is_valid) valid.push_back(s);
  }
  const auto n = static_cast<std::int64_t>(valid.size());
  const std::int64_t row = kHeads * kDim;
  // The sample alone: its valid tokens' rows, in order.
  Inputs alone = random_inputs(DType::BF16, {1, n, kHeads, kDim}, 4);
  const auto copy_rows = [&](const HostTensor& from, HostTensor& to) {
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t e = 0; e < row; ++e) {
        to.set(i * row + e, from.get((kSeq + valid[static_cast<std::size_t>(i)]) * row + e));
      }
    }
  };
  copy_rows(batch.q, alone.q);
  copy_rows(batch.k, alone.k);
  copy_rows(batch.v, alone.v);
  copy_rows(batch.dout, alone.dout);
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    const Results in_batch = run_both(batch, true, DType::BF16);
    const Results by_itself = run_both(alone, false, DType::BF16);
    const auto expect_sample = [&](const HostTensor& got_batch, const HostTensor& got_alone,
                                   const char* name) {
      std::size_t next = 0;
      for (std::int64_t s = 0; s < kSeq; ++s) {
        const bool is_valid = next < valid.size() && valid[next] == s;
        for (std::int64_t e = 0; e < row; ++e) {
          const double got = got_batch.get((kSeq + s) * row + e);
          if (is_valid) {
            ASSERT_EQ(got, got_alone.get(static_cast<std::int64_t>(next) * row + e))
                << name << " token " << s << " element " << e;
          } else {
            ASSERT_EQ(got, 0.0) << name << " padding token " << s;
            ASSERT_FALSE(std::signbit(got)) << name << " padding token " << s;
          }
        }
        if (is_valid) ++next;
      }
    };
    expect_sample(in_batch.out, by_itself.out, "out");
    expect_sample(in_batch.dq, by_itself.dq, "dq");
    expect_sample(in_batch.dk, by_itself.dk, "dk");
    expect_sample(in_batch.dv, by_itself.dv, "dv");
  }
}

// [B, S, H, D] as [B, H, S, D] (a contiguous copy).
HostTensor to_bhsd(const HostTensor& t) {
  const std::vector<std::int64_t>& s = t.shape();
  HostTensor r(t.dtype(), {s[0], s[2], s[1], s[3]});
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t i = 0; i < s[1]; ++i)
      for (std::int64_t h = 0; h < s[2]; ++h)
        for (std::int64_t d = 0; d < s[3]; ++d)
          r.set(((b * s[2] + h) * s[1] + i) * s[3] + d,
                t.get(((b * s[1] + i) * s[2] + h) * s[3] + d));
  return r;
}

TEST(AttentionOp, BhsdLayoutComputesTheBshdBytesOfItsTranspose) {
  Inputs bshd = random_inputs(DType::F32, {2, 19, 3, 16}, 5);
  for (std::int64_t s = 10; s < 19; ++s) set_mask(bshd.mask, 0, s, false);
  const Results want = run_both(bshd, true, DType::F32);
  Inputs bhsd{to_bhsd(bshd.q), to_bhsd(bshd.k), to_bhsd(bshd.v), to_bhsd(bshd.dout), bshd.mask};
  const Results got = run_both(bhsd, true, DType::F32, {Layout::BHSD});
  EXPECT_TRUE(got.out == to_bhsd(want.out));
  EXPECT_TRUE(got.dq == to_bhsd(want.dq));
  EXPECT_TRUE(got.dk == to_bhsd(want.dk));
  EXPECT_TRUE(got.dv == to_bhsd(want.dv));
}

TEST(AttentionOp, ASampleWithoutValidTokensGivesZeros) {
  Inputs in = random_inputs(DType::F32, {2, 9, 2, 8}, 6);
  for (std::int64_t s = 0; s < 9; ++s) set_mask(in.mask, 0, s, false);
  Results r = run_both(in, true, DType::F32);
  for (std::int64_t e = 0; e < 9 * 2 * 8; ++e) {
    for (const HostTensor* t : {&r.out, &r.dq, &r.dk, &r.dv}) {
      ASSERT_EQ(t->get(e), 0.0);
      ASSERT_FALSE(std::signbit(t->get(e)));
    }
  }
  // Sample 1 is computed: not every output is zero.
  bool any = false;
  for (std::int64_t e = 9 * 2 * 8; e < 2 * 9 * 2 * 8; ++e) any = any || r.out.get(e) != 0.0;
  EXPECT_TRUE(any);
}

TEST(AttentionOp, BadArgumentsAreErrorsNamingThem) {
  const Inputs in = random_inputs(DType::F32, {2, 6, 2, 8}, 7);
  HostTensor out(DType::F32, {2, 6, 2, 8});
  const auto fwd = [&](const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       std::optional<ConstTensorView> mask, const TensorView& o) {
    return test::rejected_argument([&] { attention_forward(q, k, v, mask, o); });
  };
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), in.mask.cview(), out.view()),
            "(accepted)");
  const HostTensor rank3(DType::F32, {2, 6, 16});
  EXPECT_EQ(fwd(rank3.cview(), in.k.cview(), in.v.cview(), std::nullopt, out.view()), "q");
  const HostTensor longer(DType::F32, {2, 7, 2, 8});
  EXPECT_EQ(fwd(in.q.cview(), longer.cview(), in.v.cview(), std::nullopt, out.view()), "k");
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), longer.cview(), std::nullopt, out.view()), "v");
  const HostTensor float_mask(DType::F32, {2, 6});
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), float_mask.cview(), out.view()), "mask");
  const HostTensor short_mask(DType::Bool, {2, 5});
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), short_mask.cview(), out.view()), "mask");
  const HostTensor mask3(DType::Bool, {2, 6, 1});
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), mask3.cview(), out.view()), "mask");
  // A bool tensor where numbers are read.
  const HostTensor bool_q(DType::Bool, {2, 6, 2, 8});
  EXPECT_EQ(fwd(bool_q.cview(), in.k.cview(), in.v.cview(), std::nullopt, out.view()), "q");
  HostTensor out_long(DType::F32, {2, 7, 2, 8});
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), std::nullopt, out_long.view()), "out");
  // out over q's memory: attention reads every query's keys after writing, never in place.
  HostTensor shared = in.q;
  EXPECT_EQ(fwd(shared.cview(), in.k.cview(), in.v.cview(), std::nullopt, shared.view()), "out");
  HostTensor out_over_mask(DType::F32, {2, 6, 2, 8});
  const ConstTensorView mask_in_out =
      test::strided(ConstTensorView(out_over_mask.view()), {2, 6}, {6, 1});
  ConstTensorView bool_view = mask_in_out;
  bool_view.dtype = DType::Bool;
  EXPECT_EQ(fwd(in.q.cview(), in.k.cview(), in.v.cview(), bool_view, out_over_mask.view()), "out");

  HostTensor dq(DType::F32, {2, 6, 2, 8}), dk(DType::F32, {2, 6, 2, 8}),
      dv(DType::F32, {2, 6, 2, 8});
  const auto bwd = [&](const ConstTensorView& o, const ConstTensorView& dout, const TensorView& gq,
                       const TensorView& gk, const TensorView& gv) {
    return test::rejected_argument([&] {
      attention_backward(in.q.cview(), in.k.cview(), in.v.cview(), in.mask.cview(), o, dout, gq, gk,
                         gv);
    });
  };
  EXPECT_EQ(bwd(out.cview(), in.dout.cview(), dq.view(), dk.view(), dv.view()), "(accepted)");
  EXPECT_EQ(bwd(longer.cview(), in.dout.cview(), dq.view(), dk.view(), dv.view()), "out");
  EXPECT_EQ(bwd(out.cview(), longer.cview(), dq.view(), dk.view(), dv.view()), "dout");
  EXPECT_EQ(bwd(out.cview(), in.dout.cview(), out_long.view(), dk.view(), dv.view()), "dq");
  EXPECT_EQ(bwd(out.cview(), in.dout.cview(), dq.view(), dq.view(), dv.view()), "dk");
  EXPECT_EQ(bwd(out.cview(), in.dout.cview(), dq.view(), dk.view(), out.view()), "dv");
}

}  // namespace
}  // namespace kernel_align
