// True classifier-free guidance with Qwen-Image's norm rescale (docs/contract.md section
// 17): per row (the last dim, a token's channels) the combined prediction, its norm and
// the conditional one's by the row tree (section 2), and the rescaled result; and its
// gradient. Each operation is one fp32 operation of float_ops.hpp in the order written.
// The loaders return a row's element i widened to fp32. KA_HD: every backend runs these.
#pragma once

#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/row_tree.hpp"

namespace kernel_align::contract {

// The pipeline's `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`.
KA_HD static inline float cfg_combined(float cond, float uncond, float scale) {
  return add(uncond, mul(scale, sub(cond, uncond)));
}

// A row's sums of squares (row tree) of the conditional and the combined predictions.
struct CfgRow {
  float cond_squares = 0.0f;
  float combined_squares = 0.0f;
  // cond_norm / combined_norm: the factor of the rescale.
  KA_HD float ratio() const { return div(sqrt_rn(cond_squares), sqrt_rn(combined_squares)); }
};

template <class Cond, class Uncond>
KA_HD static inline CfgRow cfg_row(int d, float scale, const Cond& cond, const Uncond& uncond) {
  CfgRow r;
  r.cond_squares = tree_sum(d, [&](int i) {
    const float c = cond(i);
    return mul(c, c);
  });
  r.combined_squares = tree_sum(d, [&](int i) {
    const float m = cfg_combined(cond(i), uncond(i), scale);
    return mul(m, m);
  });
  return r;
}

// The forward's element: combined * (cond_norm / combined_norm), as the pipeline writes it.
KA_HD static inline float cfg_output(float combined, float ratio) {
  return mul(combined, ratio);
}

// The gradient's per-row factors, from the row's sums and a = sum(dv_i * combined_i) (row
// tree): with r the ratio, n_c and n_m the norms, dcombined_i = r dv_i - k combined_i,
// k = r a / n_m^2; the cond norm's share q cond_i, q = a / (n_m n_c), taken as 0 where
// n_c = 0 (torch's gradient of a norm at 0).
struct CfgGradient {
  float ratio = 0.0f;
  float k = 0.0f;
  float q = 0.0f;
  float scale = 0.0f;
};

KA_HD static inline CfgGradient cfg_gradient(const CfgRow& r, float a, float scale) {
  const float cond_norm = sqrt_rn(r.cond_squares);
  const float combined_norm = sqrt_rn(r.combined_squares);
  CfgGradient g;
  g.ratio = div(cond_norm, combined_norm);
  g.k = div(mul(g.ratio, a), r.combined_squares);
  g.q = cond_norm == 0.0f ? 0.0f : div(a, mul(combined_norm, cond_norm));
  g.scale = scale;
  return g;
}

struct CfgElementGradient {
  float dcond = 0.0f;
  float duncond = 0.0f;
};

// combined = uncond + scale (cond - uncond): dcond = scale dcombined + q cond (the norm's
// share), duncond = dcombined - scale dcombined.
KA_HD static inline CfgElementGradient cfg_element_gradient(const CfgGradient& g, float dv,
                                                            float cond, float uncond) {
  const float combined = cfg_combined(cond, uncond, g.scale);
  const float dcombined = sub(mul(g.ratio, dv), mul(g.k, combined));
  const float scaled = mul(g.scale, dcombined);
  return {add(scaled, mul(g.q, cond)), sub(dcombined, scaled)};
}

}  // namespace kernel_align::contract
