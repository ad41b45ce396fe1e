// The GEMM micro-kernel of every instruction-set path, written once over a vector
// policy V (gemm_portable.cpp, gemm_avx2.cpp, gemm_avx512.cpp define one each). For an
// MR x NR tile of C it computes, per element, exactly the contract's operations
// (docs/contract.md, "Linear (GEMM)"):
//
// - Each leaf: the MR x NR accumulators start at +0; for each r of the leaf in order,
//   acc[i][j] = fma(A[i, r], B[r, j], acc[i][j]) (A broadcast, B loaded NR wide).
// - After each leaf, the tree's merges (GemmTile::merges, the LinearTreeSchedule of R):
//   pop a tile of the stack (in memory, L1/L2) and add it lane-wise, newest first;
//   then push the tile, except after the last leaf, whose tile is S. A call may run
//   part of the leaves (GemmTile::leaf_begin/leaf_end); the stack carries the rest.
// - Epilogue: bias add, activation, NaN canonicalised, one rounding to C's dtype.
//
// V provides, for its register type F of kWidth fp32 lanes: zero(), load(const float*),
// broadcast(const float*), fma(a, b, c) = a * b + c rounded once, add(a, b), store(float*,
// F), and store_f32_output(float*, F): the contract's fp32 store (NaN lanes canonical).
#pragma once

#include <cstdint>

#include "cpu/gemm/gemm_tile.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cpu {
// Internal linkage: each ISA file compiles its own copy with its own instruction set.
namespace {

#define KA_GEMM_UNROLL _Pragma("GCC unroll 32")

template <class V, int MR, int NV>
void run_gemm_tile(const GemmTile& tile) {
  using F = typename V::F;
  constexpr int kWidth = V::kWidth;
  constexpr int NR = NV * kWidth;
  constexpr int kTile = MR * NR;
  F acc[MR][NV];
  KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
    KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  }
  const float* a = tile.a_panel + tile.leaf_begin * contract::kLinearLeaf * MR;
  const float* b = tile.b_panel + tile.leaf_begin * contract::kLinearLeaf * NR;
  const std::int64_t leaves = contract::linear_leaf_count(tile.r);
  int depth = *tile.depth;
  for (std::int64_t leaf = tile.leaf_begin; leaf < tile.leaf_end; ++leaf) {
    KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
      KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
    }
    const std::int64_t left = tile.r - contract::linear_leaf_begin(leaf);
    const int steps = left < contract::kLinearLeaf ? static_cast<int>(left) : contract::kLinearLeaf;
    for (int k = 0; k < steps; ++k, a += MR, b += NR) {
      F bv[NV];
      KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * kWidth);
      KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
        const F av = V::broadcast(a + i);
        KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(av, bv[j], acc[i][j]);
      }
    }
    for (int merges = tile.merges[leaf]; merges > 0; --merges) {
      const float* older = tile.stack + static_cast<std::int64_t>(--depth) * kTile;
      KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
        KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) {
          acc[i][j] = V::add(V::load(older + i * NR + j * kWidth), acc[i][j]);
        }
      }
    }
    if (leaf + 1 < leaves) {
      float* newest = tile.stack + static_cast<std::int64_t>(depth++) * kTile;
      KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
        KA_GEMM_UNROLL for (int j = 0; j < NV; ++j)
            V::store(newest + i * NR + j * kWidth, acc[i][j]);
      }
    }
  }
  *tile.depth = depth;
  if (tile.leaf_end < leaves) return;

  // Full fp32 tiles without activation, C's rows contiguous: whole vectors. Anything
  // else element by element through the contract's scalar functions.
  if (tile.rows == MR && tile.cols == NR && tile.c_dtype == DType::F32 && tile.c_col_stride == 1 &&
      tile.activation == contract::Activation::None) {
    float* c = static_cast<float*>(tile.c) + tile.c_offset;
    KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
      KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) {
        F v = acc[i][j];
        if (tile.bias != nullptr) v = V::add(v, V::load(tile.bias + j * kWidth));
        V::store_f32_output(c + i * tile.c_row_stride + j * kWidth, v);
      }
    }
    return;
  }
  alignas(64) float sums[kTile];
  KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
    KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) V::store(sums + i * NR + j * kWidth, acc[i][j]);
  }
  for (int i = 0; i < tile.rows; ++i) {
    for (int j = 0; j < tile.cols; ++j) {
      const float out = contract::linear_output(
          sums[i * NR + j], tile.bias != nullptr ? tile.bias + j : nullptr, tile.activation);
      contract::store_output(tile.c_dtype, tile.c,
                             tile.c_offset + i * tile.c_row_stride + j * tile.c_col_stride, out);
    }
  }
}

}  // namespace
}  // namespace kernel_align::cpu
