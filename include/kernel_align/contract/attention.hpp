// Joint attention (docs/contract.md, "Joint attention", tree id "attention-v1"): the
// scale, the row maximum and the probabilities of one score row. The sums (scores,
// l = P 1, P V and the backward's products) are the linear tree of contract/linear.hpp
// over the valid index of the sample's tokens.
#pragma once

#include <cstdint>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

inline constexpr const char* kAttentionTreeId = "attention-v1";
// The head dims the scale is defined for (1/sqrt(D) >= 2^-6 keeps attention_scale's exact
// test in 64-bit integers).
inline constexpr std::int64_t kAttentionMaxHeadDim = 4096;

namespace detail_attention {

// The positive fp32 of bit pattern b as mantissa * 2^exponent (b normal).
inline std::uint64_t mantissa_of(std::uint32_t b) {
  return (b & 0x7FFFFFu) | 0x800000u;
}
inline int exponent_of(std::uint32_t b) {
  return static_cast<int>(b >> 23) - 127 - 23;
}

// (mantissa * 2^exponent)^2 * d compared with 1 (-1, 0, 1), exactly in 64-bit integers:
// both sides scaled by 2^(-2 exponent); mantissa < 2^25, d <= 2^12, -2 exponent <= 62.
inline int compare_square_times(std::uint64_t mantissa, int exponent, std::uint64_t d) {
  const std::uint64_t lhs = mantissa * mantissa * d;
  const std::uint64_t rhs = std::uint64_t{1} << (-2 * exponent);
  return lhs < rhs ? -1 : lhs > rhs ? 1 : 0;
}

}  // namespace detail_attention

// c = RN_f32(1/sqrt(d)) for 1 <= d <= kAttentionMaxHeadDim, exactly (integer arithmetic,
// no libm), on the host: `below`, the largest fp32 with below^2 d <= 1, is found by
// bisection over the bit patterns of [2^-7, 1]; unless it is exact, the midpoint between
// it and its successor decides (a midpoint has 25 significant bits, so its square times d
// is never exactly 1).
inline float attention_scale(std::int64_t d) {
  using namespace detail_attention;
  const auto dd = static_cast<std::uint64_t>(d);
  std::uint32_t lo = 0x3C000000u, hi = 0x3F800000u;  // at_most(lo); hi = 1 or !at_most(hi)
  const auto at_most = [&](std::uint32_t b) {
    return compare_square_times(mantissa_of(b), exponent_of(b), dd) <= 0;
  };
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (at_most(mid) ? lo : hi) = mid;
  }
  const std::uint32_t below = at_most(hi) ? hi : lo;  // hi: d = 1
  if (compare_square_times(mantissa_of(below), exponent_of(below), dd) == 0) {
    return float_of(below);
  }
  // The midpoint (2M + 1) 2^(e - 1), also when the successor is a power of two.
  const bool midpoint_below =
      compare_square_times(2 * mantissa_of(below) + 1, exponent_of(below) - 1, dd) < 0;
  return float_of(midpoint_below ? below + 1 : below);
}

// The running maximum of a score row: the larger of the two, NaN when either is NaN (so
// the row's maximum is NaN when any score is). The order of a row's maxima never
// matters: max is exact, and where the two zeros meet exp_f32(s - m) is 1 for both.
KA_HD static inline float attention_max(float running, float s) {
  if (is_nan(running) || is_nan(s)) return add(running, s);
  return s > running ? s : running;
}

// p = exp_f32(sub(s, m)) of a score s in a row of maximum m.
KA_HD static inline float attention_probability(float s, float m) {
  return exp_f32(sub(s, m));
}

}  // namespace kernel_align::contract
