// Per-row and per-element steps of adaln_modulation, forward and backward
// (docs/contract.md, "LayerNorm with AdaLN modulation"): y = LayerNorm(x) * (1 + scale) +
// shift, the LayerNorm without affine (diffusers' QwenImageTransformerBlock: norm1/norm2,
// then _modulate). Both sums of a row (the mean, then the variance about it) take the row
// reduction tree, so a row's bytes depend on that row, its sample's scale and shift alone.
#pragma once

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/row_tree.hpp"
#include "kernel_align/options.hpp"

namespace kernel_align::contract {

struct LayerNormRow {
  float mean;
  float rstd;
};

// The statistics of the row x[0..d) (fp32): mean = tree_sum(x) / D;
// var = tree_sum((x - mean)^2) / D, the squares written to squares[0..d) on the way;
// rstd = 1 / sqrt(var + eps). Two passes (the variance about the rounded mean), each step
// correctly rounded.
KA_HD static inline LayerNormRow layernorm_row(const float* x, int d, float eps, float* squares) {
  const float mean = div(tree_sum_array(x, d), static_cast<float>(d));
  for (int i = 0; i < d; ++i) {
    const float c = sub(x[i], mean);
    squares[i] = mul(c, c);
  }
  const float var = div(tree_sum_array(squares, d), static_cast<float>(d));
  return {mean, div(1.0f, sqrt_rn(add(var, eps)))};
}

// The normalised value n = (x - mean) * rstd, in fp32 (the backward's n).
KA_HD static inline float layernorm_normalized(float x, LayerNormRow row) {
  return mul(sub(x, row.mean), row.rstd);
}

// The factor 1 + scale; diffusers mode rounds it through scale's dtype (torch computes
// `1 + scale` in that dtype).
KA_HD static inline float adaln_factor(float scale, NormMode mode, DType scale_dtype) {
  const float m = add(1.0f, scale);
  return mode == NormMode::Diffusers ? round_through(scale_dtype, m) : m;
}

// The n that multiplies the factor (and so the one dscale sums): diffusers mode rounds it
// through x's dtype (LayerNorm's output is of x's dtype).
KA_HD static inline float adaln_modulated_norm(float n, NormMode mode, DType x_dtype) {
  return mode == NormMode::Diffusers ? round_through(x_dtype, n) : n;
}

// y before its one rounding to the output dtype: n' * m + shift, the product rounded
// through the output's dtype in diffusers mode (torch's `x * (1 + scale)` in the model's
// dtype, then `+ shift`).
KA_HD static inline float adaln_forward(float n_modulated, float m, float shift, NormMode mode,
                                        DType out_dtype) {
  const float p = mul(n_modulated, m);
  return add(mode == NormMode::Diffusers ? round_through(out_dtype, p) : p, shift);
}

// The row constants of dx: with g = dy * m (m the forward's factor) and n in fp32,
//   dx = rstd * ((g - sum(g) / D) - n * (sum(g * n) / D)),
// both sums by the row tree. The roundings of diffusers mode pass the gradient through.
struct AdaLnBackwardRow {
  float rstd;
  float mean_g;
  float mean_gn;
};

KA_HD static inline AdaLnBackwardRow adaln_backward_constants(LayerNormRow row, float sum_g,
                                                              float sum_gn, int d) {
  return {row.rstd, div(sum_g, static_cast<float>(d)), div(sum_gn, static_cast<float>(d))};
}

KA_HD static inline float adaln_backward_dx(float g, float n, AdaLnBackwardRow row) {
  return mul(row.rstd, sub(sub(g, row.mean_g), mul(n, row.mean_gn)));
}

// dscale[b, d] = sum over the sample's tokens of dy * n' and dshift[b, d] = sum of dy,
// each in the dw partition of rmsnorm.hpp over the tokens (kDwBlockRows consecutive
// tokens summed in order from +0, then the block sums in block order from +0).

}  // namespace kernel_align::contract
