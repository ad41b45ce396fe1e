// One score row of joint attention over a vector of fp32 lanes (docs/contract.md, "Joint
// attention"): s = mul(S, scale) in place, the row's maximum m (exact; NaN when any s is),
// then p = exp_f32(sub(s, m)) in place. Each lane goes through the scalar functions'
// operations (SimdActivation's exp gives exp_f32's bits), the tail through the scalar
// functions themselves, so the row's bits are contract::attention_probability's.
#pragma once

#include <cstdint>

#include "cpu/gemm/activation_simd.hpp"
#include "kernel_align/contract/attention.hpp"

namespace kernel_align::cpu {
namespace {

template <class V>
void run_attention_probabilities(float* row, std::int64_t n, float scale) {
  using F = typename V::F;
  constexpr int kWidth = V::kWidth;
  const std::int64_t body = n / kWidth * kWidth;
  const F c = V::set1(scale);
  F maxima = V::set1(contract::float_of(0xFF800000u));  // -Inf
  F nan_lanes = V::set1(0.0f);
  for (std::int64_t j = 0; j < body; j += kWidth) {
    const F s = V::mul(V::load(row + j), c);
    V::store(row + j, s);
    // gt is false for NaN: NaN lanes are kept apart and decide at the end.
    maxima = V::select(V::gt(s, maxima), s, maxima);
    nan_lanes = V::select(V::is_nan(s), V::set1(1.0f), nan_lanes);
  }
  alignas(64) float lanes[kWidth], nans[kWidth];
  V::store(lanes, maxima);
  V::store(nans, nan_lanes);
  float m = lanes[0];
  bool any_nan = nans[0] != 0.0f;
  for (int l = 1; l < kWidth; ++l) {
    m = lanes[l] > m ? lanes[l] : m;
    any_nan = any_nan || nans[l] != 0.0f;
  }
  for (std::int64_t j = body; j < n; ++j) {
    row[j] = contract::mul(row[j], scale);
    m = contract::attention_max(m, row[j]);
  }
  if (any_nan) m = contract::float_of(0x7FC00000u);
  const F mv = V::set1(m);
  for (std::int64_t j = 0; j < body; j += kWidth) {
    V::store(row + j, SimdActivation<V>::exp(V::sub(V::load(row + j), mv)));
  }
  for (std::int64_t j = body; j < n; ++j) row[j] = contract::attention_probability(row[j], m);
}

// The same row with the scalar functions alone (the portable path).
inline void run_attention_probabilities_scalar(float* row, std::int64_t n, float scale) {
  float m = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    row[j] = contract::mul(row[j], scale);
    m = j == 0 ? row[j] : contract::attention_max(m, row[j]);
  }
  for (std::int64_t j = 0; j < n; ++j) row[j] = contract::attention_probability(row[j], m);
}

}  // namespace
}  // namespace kernel_align::cpu
