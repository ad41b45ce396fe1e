// Joint attention's CPU engine (cpu/attention.hpp) against the literal reference
// (reference/attention.hpp), byte for byte, forward and backward, on every path and
// thread count; padding invariance (a sample alone, its own length, against the same
// sample padded in a batch, with the padding at the end or in the middle as Qwen-Image's
// [text, padding, image] sequence has it); the scale; NaN and fully masked samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/attention_problem.hpp"
#include "cpu/attention.hpp"
#include "kernel_align/contract/attention.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/attention.hpp"

namespace kernel_align {
namespace {

std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::Portable};
  if (best_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

// A contiguous [B, S, H, D] tensor of `dtype`.
struct Bshd {
  DType dtype;
  std::int64_t b, s, h, d;
  std::vector<std::uint8_t> bytes;

  Bshd(DType t, std::int64_t b_, std::int64_t s_, std::int64_t h_, std::int64_t d_)
      : dtype(t),
        b(b_),
        s(s_),
        h(h_),
        d(d_),
        bytes(static_cast<std::size_t>(b_ * s_ * h_ * d_) * dtype_size(t), 0xA5) {}
  std::array<std::int64_t, 4> strides() const { return {s * h * d, h * d, d, 1}; }
  std::int64_t index(std::int64_t bi, std::int64_t si, std::int64_t hi, std::int64_t di) const {
    return ((bi * s + si) * h + hi) * d + di;
  }
  void set(std::int64_t i, float v) { contract::store_output(dtype, bytes.data(), i, v); }
  float get(std::int64_t i) const { return contract::load_f32(dtype, bytes.data(), i); }
  void fill(std::mt19937& rng, float scale) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (std::int64_t i = 0; i < b * s * h * d; ++i) set(i, normal(rng));
  }
  detail::AttentionInput in() const { return {bytes.data(), dtype, strides()}; }
  detail::AttentionOutput out() { return {bytes.data(), dtype, strides()}; }
  // The bytes of token si of sample bi (every head).
  std::vector<std::uint8_t> token(std::int64_t bi, std::int64_t si) const {
    const std::size_t size = dtype_size(dtype);
    const auto first = bytes.begin() + static_cast<std::ptrdiff_t>(index(bi, si, 0, 0) * size);
    return {first, first + static_cast<std::ptrdiff_t>(h * d * size)};
  }
};

struct Case {
  std::int64_t batch, seq, heads, dim;
  DType dtype;
  std::vector<std::uint8_t> mask;  // batch x seq, empty: no mask
};

struct Tensors {
  Bshd q, k, v, out, dout, dq, dk, dv;
  Tensors(const Case& c, std::uint32_t seed)
      : q(c.dtype, c.batch, c.seq, c.heads, c.dim),
        k(q),
        v(q),
        out(q),
        dout(q),
        dq(q),
        dk(q),
        dv(q) {
    std::mt19937 rng(seed);
    q.fill(rng, 1.0f);
    k.fill(rng, 1.0f);
    v.fill(rng, 1.0f);
    dout.fill(rng, 1.0f);
  }
};

detail::AttentionMask mask_of(const Case& c) {
  if (c.mask.empty()) return {};
  return {c.mask.data(), c.seq, 1};
}

detail::AttentionProblem forward_problem(const Case& c, Tensors& t) {
  return {c.batch, c.seq, c.heads, c.dim, t.q.in(), t.k.in(), t.v.in(), mask_of(c), t.out.out()};
}

detail::AttentionBackwardProblem backward_problem(const Case& c, Tensors& t) {
  return {c.batch,    c.seq,      c.heads,     c.dim,      t.q.in(),   t.k.in(),  t.v.in(),
          mask_of(c), t.out.in(), t.dout.in(), t.dq.out(), t.dk.out(), t.dv.out()};
}

std::string describe(const Case& c) {
  return std::to_string(c.batch) + "x" + std::to_string(c.seq) + "x" + std::to_string(c.heads) +
         "x" + std::to_string(c.dim) + " " + dtype_name(c.dtype) +
         (c.mask.empty() ? "" : " masked");
}

// Reference forward and backward, then every engine path and thread count: equal bytes.
void check(const Case& c, std::uint32_t seed) {
  Tensors want(c, seed);
  reference::attention_forward(forward_problem(c, want));
  reference::attention_backward(backward_problem(c, want));
  for (Isa isa : isas()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(describe(c) + " " + isa_name(isa) + " threads " + std::to_string(threads));
      Tensors got(c, seed);
      cpu::attention_forward(forward_problem(c, got), threads, isa);
      ASSERT_EQ(got.out.bytes, want.out.bytes) << "forward";
      cpu::attention_backward(backward_problem(c, got), threads, isa);
      EXPECT_EQ(got.dq.bytes, want.dq.bytes) << "dq";
      EXPECT_EQ(got.dk.bytes, want.dk.bytes) << "dk";
      EXPECT_EQ(got.dv.bytes, want.dv.bytes) << "dv";
    }
  }
}

std::vector<std::uint8_t> prefix_mask(std::int64_t seq, const std::vector<std::int64_t>& lengths) {
  std::vector<std::uint8_t> mask;
  for (std::int64_t n : lengths) {
    for (std::int64_t s = 0; s < seq; ++s) mask.push_back(s < n ? 1 : 0);
  }
  return mask;
}

TEST(Attention, ScaleIsTheNearestFloat) {
  EXPECT_EQ(contract::bits_of(contract::attention_scale(128)), 0x3DB504F3u);
  EXPECT_EQ(contract::attention_scale(1), 1.0f);
  EXPECT_EQ(contract::attention_scale(64), 0.125f);
  for (std::int64_t d = 1; d <= contract::kAttentionMaxHeadDim; ++d) {
    const float c = contract::attention_scale(d);
    const long double exact = 1.0L / std::sqrt(static_cast<long double>(d));
    for (float neighbour : {std::nextafter(c, 0.0f), std::nextafter(c, 2.0f)}) {
      ASSERT_LE(std::fabs(static_cast<long double>(c) - exact),
                std::fabs(static_cast<long double>(neighbour) - exact))
          << "d " << d;
    }
  }
}

TEST(Attention, EngineMatchesReference) {
  check({1, 5, 1, 8, DType::F32, {}}, 1);
  check({2, 40, 2, 16, DType::F32, {}}, 2);
  check({2, 70, 3, 32, DType::BF16, prefix_mask(70, {70, 33})}, 3);
  check({1, 33, 2, 128, DType::F16, {}}, 4);
  // Padding in the middle, as [text, padding, image]: tokens 5..9 masked.
  std::vector<std::uint8_t> middle(50, 1);
  for (int s = 5; s < 10; ++s) middle[static_cast<std::size_t>(s)] = 0;
  check({1, 50, 2, 24, DType::F32, middle}, 5);
  // Past the engine's blocks (192 rows, groups of 128 columns, passes of 4 leaves):
  // n = 290 valid of 300.
  check({1, 300, 1, 64, DType::F32, prefix_mask(300, {290})}, 8);
}

// q, k and v as views of one packed [B, S, 3, H, D] QKV tensor and the output with a
// padded row: the engine reads and writes through the strides, as the reference does.
TEST(Attention, StridedViews) {
  const std::int64_t batch = 2, seq = 45, heads = 3, dim = 20;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> qkv(static_cast<std::size_t>(batch * seq * 3 * heads * dim));
  for (float& x : qkv) x = normal(rng);
  const std::array<std::int64_t, 4> in_strides{seq * 3 * heads * dim, 3 * heads * dim, dim, 1};
  const auto view = [&](int which) {
    return detail::AttentionInput{qkv.data() + which * heads * dim, DType::F32, in_strides};
  };
  const std::int64_t row = heads * dim + 7;  // the output's tokens 7 elements apart
  const std::array<std::int64_t, 4> out_strides{seq * row, row, dim, 1};
  std::vector<float> want(static_cast<std::size_t>(batch * seq * row), -1.0f), got(want);
  const std::vector<std::uint8_t> mask = prefix_mask(seq, {45, 30});
  const detail::AttentionMask m{mask.data(), seq, 1};
  const auto problem = [&](std::vector<float>& out) {
    return detail::AttentionProblem{batch,   seq,     heads,
                                    dim,     view(0), view(1),
                                    view(2), m,       {out.data(), DType::F32, out_strides}};
  };
  reference::attention_forward(problem(want));
  for (Isa isa : isas()) {
    std::fill(got.begin(), got.end(), -1.0f);
    cpu::attention_forward(problem(got), 2, isa);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << isa_name(isa);
  }
  EXPECT_EQ(want[heads * dim], -1.0f) << "the gap between tokens was written";
}

TEST(Attention, FullyMaskedSampleIsZero) {
  const Case c{2, 12, 2, 8, DType::F32, prefix_mask(12, {0, 7})};
  check(c, 6);
  Tensors t(c, 6);
  cpu::attention_forward(forward_problem(c, t), 1, best_isa());
  for (std::int64_t i = 0; i < 12 * 2 * 8; ++i) {
    EXPECT_EQ(contract::bits_of(t.out.get(i)), 0u) << i;
  }
}

TEST(Attention, NaNScoresPropagate) {
  Case c{1, 20, 1, 16, DType::F32, {}};
  Tensors want(c, 7);
  want.k.set(want.k.index(0, 3, 0, 2), std::numeric_limits<float>::quiet_NaN());
  Tensors got = want;
  reference::attention_forward(forward_problem(c, want));
  for (Isa isa : isas()) {
    Tensors run = got;
    cpu::attention_forward(forward_problem(c, run), 2, isa);
    EXPECT_EQ(run.out.bytes, want.out.bytes) << isa_name(isa);
  }
  EXPECT_TRUE(std::isnan(want.out.get(0)));
}

// A sample in a padded batch (padding at the end or in the middle of its tokens, beside a
// longer sample) gets exactly the bytes it gets alone, forward and backward.
TEST(Attention, PaddingInvariance) {
  const std::int64_t heads = 2, dim = 32, own = 37, padded = 61;
  for (bool middle : {false, true}) {
    // The batch: sample 0 has `own` valid tokens among `padded` positions, sample 1 all.
    const std::int64_t gap_begin = middle ? 10 : own;
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(2 * padded), 1);
    std::vector<std::int64_t> position_of(static_cast<std::size_t>(own));
    for (std::int64_t s = 0, i = 0; s < padded; ++s) {
      const bool pad = s >= gap_begin && s < gap_begin + (padded - own);
      mask[static_cast<std::size_t>(s)] = pad ? 0 : 1;
      if (!pad) position_of[static_cast<std::size_t>(i++)] = s;
    }
    const Case batched{2, padded, heads, dim, DType::BF16, mask};
    const Case alone{1, own, heads, dim, DType::BF16, {}};
    Tensors b(batched, 11);
    Tensors a(alone, 12);
    // The lone sample's tokens are the batch's sample 0 valid tokens.
    for (std::int64_t i = 0; i < own; ++i) {
      for (std::int64_t hh = 0; hh < heads; ++hh) {
        for (std::int64_t d = 0; d < dim; ++d) {
          const std::int64_t from = b.q.index(0, position_of[static_cast<std::size_t>(i)], hh, d);
          const std::int64_t to = a.q.index(0, i, hh, d);
          a.q.set(to, b.q.get(from));
          a.k.set(to, b.k.get(from));
          a.v.set(to, b.v.get(from));
          a.dout.set(to, b.dout.get(from));
        }
      }
    }
    for (Isa isa : isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + (middle ? " middle" : " end"));
      Tensors bb = b, aa = a;
      cpu::attention_forward(forward_problem(batched, bb), 2, isa);
      cpu::attention_forward(forward_problem(alone, aa), 1, isa);
      cpu::attention_backward(backward_problem(batched, bb), 2, isa);
      cpu::attention_backward(backward_problem(alone, aa), 1, isa);
      for (std::int64_t i = 0; i < own; ++i) {
        const std::int64_t s = position_of[static_cast<std::size_t>(i)];
        ASSERT_EQ(bb.out.token(0, s), aa.out.token(0, i)) << "out, token " << i;
        ASSERT_EQ(bb.dq.token(0, s), aa.dq.token(0, i)) << "dq, token " << i;
        ASSERT_EQ(bb.dk.token(0, s), aa.dk.token(0, i)) << "dk, token " << i;
        ASSERT_EQ(bb.dv.token(0, s), aa.dv.token(0, i)) << "dv, token " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kernel_align
