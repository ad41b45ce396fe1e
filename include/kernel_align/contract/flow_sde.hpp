// Flow-GRPO's SDE step and its log-probability (docs/contract.md section 15): the
// elementwise steps, every one a correctly rounded fp32 operation, and the per-sample
// finish of the log-density. The sum of a sample's squared distances is linear's tree
// (linear.hpp) over the sample's elements in row-major order: FlowSdeSquares streams it.
#pragma once

#include <cstdint>

#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::contract {

inline constexpr const char* kFlowSdeTreeId = kLinearTreeId;

// mean = x * x_scale + v * v_scale (two products, one sum).
KA_HD static inline float flow_sde_mean(float x, float v, float x_scale, float v_scale) {
  return add(mul(x, x_scale), mul(v, v_scale));
}

// prev before its one rounding: mean + noise_scale * noise.
KA_HD static inline float flow_sde_prev(float mean, float noise, float noise_scale) {
  return add(mean, mul(noise_scale, noise));
}

// logp of a sample from the sum S of its squared distances and its element count n
// (converted to fp32: exact up to 2^24): -(S * inverse_two_variance) / n + log_normalizer.
KA_HD static inline float flow_sde_logp(float sum_of_squares, float count,
                                        float inverse_two_variance, float log_normalizer) {
  return add(div(-mul(sum_of_squares, inverse_two_variance), count), log_normalizer);
}

// The factor g of a sample's gradient, d logp / d mean_i = g * (prev_i - mean_i):
// (dlogp * (2 * inverse_two_variance)) / n (the doubling exact).
KA_HD static inline float flow_sde_logp_grad_scale(float dlogp, float count,
                                                   float inverse_two_variance) {
  return div(mul(dlogp, mul(2.0f, inverse_two_variance)), count);
}

// Linear's tree over a sample's n squared distances, fed one distance at a time in
// order: leaves of kLinearLeaf consecutive elements, each an fma chain from +0, pushed
// into the tree as they complete (the same bits as linear_sum(n, (d_k, d_k))).
class FlowSdeSquares {
 public:
  KA_HD explicit FlowSdeSquares(std::int64_t n) : n_(n), tree_(n, LinearAddFloats{}) {}
  KA_HD void push(float d) {
    leaf_ = fma_rn(d, d, leaf_);
    if (++in_leaf_ == kLinearLeaf) flush();
  }
  // S, once all n distances were pushed.
  KA_HD float result() {
    if (in_leaf_ != 0) flush();
    return tree_.result(0.0f);
  }
  KA_HD std::int64_t count() const { return n_; }

 private:
  KA_HD void flush() {
    tree_.push_leaf(leaf_);
    leaf_ = 0.0f;
    in_leaf_ = 0;
  }
  std::int64_t n_;
  LinearTreeAccumulator<float, LinearAddFloats> tree_;
  float leaf_ = 0.0f;
  int in_leaf_ = 0;
};

}  // namespace kernel_align::contract
