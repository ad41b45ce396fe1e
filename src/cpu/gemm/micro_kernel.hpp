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
// - Epilogue: bias add, activation (or its backward of grad_out), NaN canonicalised, one
//   rounding to C's dtype.
//
// V provides, for its register type F of kWidth fp32 lanes: zero(), load(const float*),
// broadcast(const float*), fma(a, b, c) = a * b + c rounded once, add(a, b), store(float*,
// F), and store_f32_output(float*, F): the contract's fp32 store (NaN lanes canonical);
// for the epilogue load_widened(DType, const void*, index) (kWidth contiguous elements
// widened exactly), store_output(DType, void*, index, F) (contract::store_output of each
// lane), activate(Activation, F) and activate_backward(Activation, F dy, F z).
#pragma once

#include <cstdint>

#include "cpu/gemm/gemm_tile.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cpu {
// Internal linkage: each ISA file compiles its own copy with its own instruction set.
namespace {

#define KA_GEMM_UNROLL _Pragma("GCC unroll 32")

// The epilogue of one tile: C[i, j] = store_output(act(S + bias)) or, with grad_out,
// store_output(act_backward(grad_out, S + bias)), a vector of kWidth columns at a time
// (V::activate, V::activate_backward: the contract's functions lane by lane), stored as
// whole vectors where the tile's row has kWidth valid, contiguous columns of C, else
// element by element through the contract's scalar store.
template <class V, int MR, int NV>
void store_tile_epilogue(const GemmTile& tile, const float* sums) {
  using F = typename V::F;
  constexpr int kWidth = V::kWidth;
  constexpr int NR = NV * kWidth;
  alignas(64) float lanes[kWidth];
  for (int i = 0; i < tile.rows; ++i) {
    for (int j = 0; j < NV; ++j) {
      const int first = j * kWidth;
      const int valid = tile.cols - first < kWidth ? tile.cols - first : kWidth;
      if (valid <= 0) break;
      F v = V::load(sums + i * NR + first);
      if (tile.bias != nullptr) v = V::add(v, V::load(tile.bias + first));
      F out;
      if (tile.grad != nullptr) {
        const std::int64_t g =
            tile.grad_offset + i * tile.grad_row_stride + first * tile.grad_col_stride;
        F dy;
        if (valid == kWidth && tile.grad_col_stride == 1) {
          dy = V::load_widened(tile.grad_dtype, tile.grad, g);
        } else {
          for (int l = 0; l < kWidth; ++l) {
            lanes[l] = l < valid ? contract::load_f32(tile.grad_dtype, tile.grad,
                                                      g + l * tile.grad_col_stride)
                                 : 0.0f;
          }
          dy = V::load(lanes);
        }
        out = V::activate_backward(tile.activation, dy, v);
      } else {
        out = V::activate(tile.activation, v);
      }
      const std::int64_t c = tile.c_offset + i * tile.c_row_stride + first * tile.c_col_stride;
      if (valid == kWidth && tile.c_col_stride == 1) {
        V::store_output(tile.c_dtype, tile.c, c, out);
      } else {
        V::store(lanes, out);
        for (int l = 0; l < valid; ++l) {
          contract::store_output(tile.c_dtype, tile.c, c + l * tile.c_col_stride, lanes[l]);
        }
      }
    }
  }
}

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
  const float* b = tile.b_panel + (tile.leaf_begin * contract::kLinearLeaf - tile.b_first_r) * NR;
  const float* b_prefetch = tile.b_prefetch;
  const std::int64_t leaves = contract::linear_leaf_count(tile.r);
  int depth = *tile.depth;
  for (std::int64_t leaf = tile.leaf_begin; leaf < tile.leaf_end; ++leaf) {
    KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
      KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
    }
    const std::int64_t left = tile.r - contract::linear_leaf_begin(leaf);
    const int steps = left < contract::kLinearLeaf ? static_cast<int>(left) : contract::kLinearLeaf;
    for (int k = 0; k < steps; ++k, a += MR, b += NR) {
      // The A panel streams from L2: fetch a few steps ahead.
      __builtin_prefetch(a + 16 * MR);
      if (b_prefetch != nullptr) __builtin_prefetch(b_prefetch + 16 * k, 0, 2);
      F bv[NV];
      KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * kWidth);
      KA_GEMM_UNROLL for (int i = 0; i < MR; ++i) {
        const F av = V::broadcast(a + i);
        KA_GEMM_UNROLL for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(av, bv[j], acc[i][j]);
      }
    }
    if (b_prefetch != nullptr) b_prefetch += 16 * steps;
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

  // Full fp32 tiles without activation, C's rows contiguous: whole vectors from the
  // registers. Anything else through the vector epilogue.
  if (tile.rows == MR && tile.cols == NR && tile.c_dtype == DType::F32 && tile.c_col_stride == 1 &&
      tile.activation == contract::Activation::None && tile.grad == nullptr) {
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
  store_tile_epilogue<V, MR, NV>(tile, sums);
}

// GemmPath::pack_lines over a transposer T of kWidth lanes: kWidth lines by kWidth r at a
// time, loaded (T::load_line: line l at r in [k, k + count), widened, +0 past count),
// transposed in registers (T::transpose) and stored kWidth lines wide, masked to the
// panel's width (T::store_mask(lanes), T::store).
template <class T>
void pack_lines_by_transposes(const GemmPackLines& job) {
  constexpr int kWidth = T::kWidth;
  for (int l0 = 0; l0 < job.width; l0 += kWidth) {
    const int group = job.width - l0 < kWidth ? job.width - l0 : kWidth;
    const auto store_mask = T::store_mask(group);
    const int present = job.lines - l0 < group ? job.lines - l0 : group;
    for (std::int64_t k = job.k_begin; k < job.k_end; k += kWidth) {
      const int count = job.k_end - k < kWidth ? static_cast<int>(job.k_end - k) : kWidth;
      typename T::F r[kWidth];
      for (int l = 0; l < kWidth; ++l) {
        r[l] = l < present ? T::load_line(job, l0 + l, k, count) : T::zero();
      }
      T::transpose(r);
      float* dst = job.dst + (k - job.k_begin) * job.width + l0;
      for (int c = 0; c < count; ++c) T::store(dst + c * job.width, store_mask, r[c]);
    }
  }
}

// GemmPath::activation over V.
template <class V>
void run_activation(contract::Activation activation, const float* z, const float* dy, float* out,
                    std::int64_t count) {
  using F = typename V::F;
  constexpr int kWidth = V::kWidth;
  alignas(64) float zs[kWidth], dys[kWidth], outs[kWidth];
  for (std::int64_t i = 0; i < count; i += kWidth) {
    const std::int64_t valid = count - i < kWidth ? count - i : kWidth;
    for (int l = 0; l < kWidth; ++l) {
      zs[l] = l < valid ? z[i + l] : 0.0f;
      dys[l] = l < valid && dy != nullptr ? dy[i + l] : 0.0f;
    }
    const F v = dy != nullptr ? V::activate_backward(activation, V::load(dys), V::load(zs))
                              : V::activate(activation, V::load(zs));
    V::store(outs, v);
    for (int l = 0; l < valid; ++l) out[i + l] = outs[l];
  }
}

}  // namespace
}  // namespace kernel_align::cpu
