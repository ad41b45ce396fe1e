// The one reduction order over a row (docs/contract.md, "Row reduction tree").
//
// 16 fp32 lanes start at +0; lane j adds terms j, j+16, j+32, ... in index order;
// then lane j += lane j+8, j+4, j+2, j+1 (for j below the offset). Terms past the
// row's end are absent, which is the same as adding +0 to a lane that is already
// the result of an addition. The order fits every SIMD width: one AVX-512 register
// holds the 16 lanes, AVX2 two registers, NEON four, a CUDA row 16 threads with
// shuffle-xor offsets 8, 4, 2, 1.
#pragma once

#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

inline constexpr int kTreeLanes = 16;

// The tree's last steps: lane j += lane j+8, j+4, j+2, j+1; the sum is lane 0.
KA_HD static inline float fold_tree_lanes(float (&lane)[kTreeLanes]) {
  for (int offset = kTreeLanes / 2; offset >= 1; offset /= 2) {
    for (int j = 0; j < offset; ++j) lane[j] = add(lane[j], lane[j + offset]);
  }
  return lane[0];
}

// `term(i)` returns the already-rounded fp32 term i of the sum, 0 <= i < n.
template <class Term>
KA_HD static inline float tree_sum(int n, const Term& term) {
  float lane[kTreeLanes];
  for (float& l : lane) l = 0.0f;
  for (int i = 0; i < n; ++i) lane[i % kTreeLanes] = add(lane[i % kTreeLanes], term(i));
  return fold_tree_lanes(lane);
}

// tree_sum of the n contiguous terms v[0..n): the same order (lane j adds terms j, j+16,
// ... in index order), written lane-parallel so that a compiler can keep the 16 lanes in
// vector registers.
KA_HD static inline float tree_sum_array(const float* v, int n) {
  float lane[kTreeLanes];
  for (float& l : lane) l = 0.0f;
  int i = 0;
  for (; i + kTreeLanes <= n; i += kTreeLanes) {
    for (int j = 0; j < kTreeLanes; ++j) lane[j] = add(lane[j], v[i + j]);
  }
  for (int j = 0; i + j < n; ++j) lane[j] = add(lane[j], v[i + j]);
  return fold_tree_lanes(lane);
}

}  // namespace kernel_align::contract
