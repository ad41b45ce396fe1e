// Per-row and per-element steps of qk_rmsnorm, forward and backward
// (docs/contract.md, "qk_rmsnorm"). A row without a weight is computed as a row
// with an fp32 weight of ones: x * 1 is exact, so the bits are the same.
#pragma once

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/row_tree.hpp"
#include "kernel_align/options.hpp"

namespace kernel_align::contract {

// Which roundings the forward performs: the public option (options.hpp).
using kernel_align::NormMode;

// rstd = 1 / sqrt(sum_squares / D + eps), each step correctly rounded.
KA_HD static inline float rms_rstd(float sum_squares, int d, float eps) {
  const float mean = div(sum_squares, static_cast<float>(d));
  return div(1.0f, sqrt_rn(add(mean, eps)));
}

// rstd of a row whose element i is `x(i)` (already widened to fp32).
template <class Load>
KA_HD static inline float row_rstd(int d, float eps, const Load& x) {
  return rms_rstd(tree_sum(d,
                           [&](int i) {
                             const float v = x(i);
                             return mul(v, v);
                           }),
                  d, eps);
}

// The normalised value the weight multiplies: x * rstd, rounded through the
// weight's dtype in diffusers mode (the `.to(weight.dtype)` of diffusers' RMSNorm).
KA_HD static inline float rms_normalized(float x, float rstd, NormMode mode, DType weight_dtype) {
  const float n = mul(x, rstd);
  return mode == NormMode::Diffusers ? round_through(weight_dtype, n) : n;
}

// Forward value before the single rounding to the output dtype.
KA_HD static inline float rms_forward(float x, float rstd, float w, NormMode mode,
                                      DType weight_dtype) {
  return mul(rms_normalized(x, rstd, mode, weight_dtype), w);
}

// Row constants of the backward:
//   dx = rstd * g - x * coef,  g = dy * w,  coef = rstd^3 * (sum_i g_i x_i) / D
struct RmsBackwardRow {
  float rstd;
  float coef;
};

// The constants from rstd and dot = tree_sum_i mul(g_i, x_i): for backends that take the
// row's two sums their own way (in the same tree order).
KA_HD static inline RmsBackwardRow rms_backward_constants(float rstd, float dot, int d) {
  const float rstd3 = mul(mul(rstd, rstd), rstd);
  return {rstd, mul(rstd3, div(dot, static_cast<float>(d)))};
}

template <class LoadX, class LoadG>
KA_HD static inline RmsBackwardRow rms_backward_row(int d, float eps, const LoadX& x,
                                                    const LoadG& g) {
  return rms_backward_constants(row_rstd(d, eps, x),
                                tree_sum(d, [&](int i) { return mul(g(i), x(i)); }), d);
}

KA_HD static inline float rms_backward_dx(float x, float g, RmsBackwardRow row) {
  return sub(mul(row.rstd, g), mul(x, row.coef));
}

// dw is summed over rows in a fixed partition that does not depend on threads:
// blocks of kDwBlockRows consecutive rows, block b = rows
// [kDwBlockRows*b, min(kDwBlockRows*(b+1), N)), ceil(N/kDwBlockRows) blocks (none
// for N = 0, the last one shorter where kDwBlockRows does not divide N), each
// summed in row order from +0, then the block sums added in block order from +0.
// A backend may give blocks to threads (or thread blocks) as it likes.
inline constexpr int kDwBlockRows = 256;

KA_HD static inline long long dw_block_count(long long rows) {
  return (rows + kDwBlockRows - 1) / kDwBlockRows;
}

KA_HD static inline long long dw_block_begin(long long rows, long long block) {
  const long long begin = block * kDwBlockRows;
  return begin < rows ? begin : rows;
}

KA_HD static inline long long dw_block_end(long long rows, long long block) {
  return dw_block_begin(rows, block + 1);
}

}  // namespace kernel_align::contract
