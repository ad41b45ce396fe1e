// The CUDA GEMM kernel (docs/cuda-backend.md, "GEMM"): C = the contract's "Linear (GEMM)"
// (docs/contract.md section 10) for a detail::GemmProblem, on the SIMT fp32 units, bit
// for bit the reference's (src/reference/gemm.cpp). A template on the Grid like the
// kernels of kernels.cuh: CudaGrid on a device, EmulatedGrid on the host in CI.
//
// - Tiles. A block of 256 threads computes a 64 x 64 tile of C: block x picks the N tile,
//   block y the M tile (then every grid.y-th M tile after it: gridDim.y is at most 65535).
//   Thread t = 16 ty + tx owns the 4 x 4 elements m = m0 + ty + 16 i, n = n0 + tx + 16 j.
// - Leaves. Per leaf of the contract (32 consecutive r) the block stages A[m0.., r0..] and
//   B[r0.., n0..] as fp32 in shared memory (bf16/fp16 widened exactly on load), then each
//   thread computes its 16 leaf values from acc = +0 by 32 fma_rn in increasing r
//   (__fmaf_rn on a device): 512 explicit fma, the only fma of the kernel, which the PTX
//   gate counts (tests/cuda/CMakeLists.txt).
// - A last, partial leaf (R % 32 != 0) is padded to 32 in shared memory with A = +0 and
//   B = -0: fma(+0, -0, acc) = acc exactly for every acc (the exact product is -0, and
//   -0 + acc is acc: +0 + -0 = +0, -0 + -0 = -0, a NaN stays a NaN), so the padded steps
//   change no bit and the leaf loop always runs 32 unrolled steps.
// - Tree. The 16 leaf values go through one LinearTreeAccumulator of 4 x 4 tiles
//   (contract/linear.hpp): its schedule depends on R alone, so every element's sum has the
//   contract's shape whatever the tile, the grid or M and N.
// - Epilogue. Per element: contract::linear_output (bias, activation) or, with grad_out,
//   contract::linear_activation_grad, then contract::store_output into C's dtype.
//
// Elements past M or N (edge tiles) are computed on zeros and not stored; every thread
// reaches every barrier.
#pragma once

#include <cstdint>

#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/activation.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cuda {

inline constexpr int kGemmTileM = 64;
inline constexpr int kGemmTileN = 64;
// Each thread computes kGemmMicroM x kGemmMicroN elements of the tile.
inline constexpr int kGemmMicroM = 4;
inline constexpr int kGemmMicroN = 4;
inline constexpr int kGemmThreadsN = kGemmTileN / kGemmMicroN;           // 16
inline constexpr int kGemmThreadsM = kGemmTileM / kGemmMicroM;           // 16
inline constexpr unsigned kGemmThreads = kGemmThreadsM * kGemmThreadsN;  // 256
inline constexpr int kGemmLeaf = contract::kLinearLeaf;                  // 32
// Shared rows one float longer than the tile: a staging pass whose threads walk r (the
// unit stride of a row-major A, or of B = w^T) writes 32 different banks.
inline constexpr int kGemmSharedRow = kGemmTileM + 1;
static_assert(kGemmTileM == kGemmTileN, "one shared row length for A and B");

// One matrix operand: element (i, j) at data[i * row_stride + j * col_stride].
struct GemmOperand {
  const void* data = nullptr;  // null: absent (bias, grad_out)
  DType dtype = DType::F32;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 0;
};

struct GemmParams {
  std::int64_t m = 0, n = 0, r = 0;
  GemmOperand a;         // m x r
  GemmOperand b;         // r x n
  GemmOperand bias;      // 1 x n (element n at n * col_stride), or absent
  GemmOperand grad_out;  // m x n, or absent (the forward)
  contract::Activation activation = contract::Activation::None;
  void* c = nullptr;  // m x n
  DType c_dtype = DType::F32;
  std::int64_t c_row_stride = 0, c_col_stride = 0;
  std::int64_t m_tiles = 0;      // ceil(m / 64)
  std::int64_t m_tile_step = 1;  // gridDim.y: a block does M tiles y, y + step, ...
};

// A thread's 4 x 4 values (leaf values, tree entries, sums).
struct GemmTile {
  float v[kGemmMicroM][kGemmMicroN];
};

// The tree's add(older, newer), element by element.
struct GemmTileAdd {
  KA_HD GemmTile operator()(const GemmTile& older, const GemmTile& newer) const {
    // No KA_UNROLL: a host-and-device function (the host pass knows no such pragma);
    // constant trip counts of 4 unroll anyway.
    GemmTile sum;
    for (int i = 0; i < kGemmMicroM; ++i) {
      for (int j = 0; j < kGemmMicroN; ++j) {
        sum.v[i][j] = contract::add(older.v[i][j], newer.v[i][j]);
      }
    }
    return sum;
  }
};

template <class Grid>
struct Gemm {
  using Params = GemmParams;
  // Leaf-chunk tiles, r-major: a[k][mi] = A[m0 + mi, r0 + k], b[k][ni] = B[r0 + k, n0 + ni].
  struct Shared {
    float a[kGemmLeaf][kGemmSharedRow];
    float b[kGemmLeaf][kGemmSharedRow];
  };

  // tile[k][i] = A[i0 + i, r0 + k], or B[r0 + k, i0 + i] (`transposed`), widened to fp32;
  // past R: `pad` (A: +0, B: -0); past M (or N): +0. The block's threads walk r when it is
  // the operand's unit stride (consecutive addresses), else the other index.
  static KA_DEVICE void stage(const GemmOperand& op, bool transposed, std::int64_t extent,
                              std::int64_t r, std::int64_t i0, std::int64_t r0, float pad,
                              float (&tile)[kGemmLeaf][kGemmSharedRow]) {
    const std::int64_t r_stride = transposed ? op.row_stride : op.col_stride;
    const std::int64_t i_stride = transposed ? op.col_stride : op.row_stride;
    const bool walk_r = r_stride == 1 || i_stride != 1;
    constexpr int kPerThread = kGemmLeaf * kGemmTileM / static_cast<int>(kGemmThreads);  // 8
    const int t = static_cast<int>(Grid::thread());
    KA_UNROLL
    for (int q = 0; q < kPerThread; ++q) {
      const int index = t + q * static_cast<int>(kGemmThreads);
      const int k = walk_r ? index % kGemmLeaf : index / kGemmTileM;
      const int i = walk_r ? index / kGemmLeaf : index % kGemmTileM;
      const std::int64_t rk = r0 + k;
      const std::int64_t ii = i0 + i;
      float v = 0.0f;
      if (rk >= r) {
        v = pad;
      } else if (ii < extent) {
        v = contract::load_f32(op.dtype, op.data, ii * i_stride + rk * r_stride);
      }
      tile[k][i] = v;
    }
  }

  static KA_DEVICE void run(const Params& p, Shared& s) {
    const int t = static_cast<int>(Grid::thread());
    const int tx = t % kGemmThreadsN;
    const int ty = t / kGemmThreadsN;
    const std::int64_t n0 = static_cast<std::int64_t>(Grid::block()) * kGemmTileN;
    const std::int64_t leaves = contract::linear_leaf_count(p.r);
    const float minus_zero = contract::float_of(0x80000000u);
    for (std::int64_t m_tile = Grid::block_y(); m_tile < p.m_tiles; m_tile += p.m_tile_step) {
      const std::int64_t m0 = m_tile * kGemmTileM;
      contract::LinearTreeAccumulator<GemmTile, GemmTileAdd> tree(p.r, GemmTileAdd{});
      for (std::int64_t leaf = 0; leaf < leaves; ++leaf) {
        const std::int64_t r0 = contract::linear_leaf_begin(leaf);
        stage(p.a, false, p.m, p.r, m0, r0, 0.0f, s.a);
        stage(p.b, true, p.n, p.r, n0, r0, minus_zero, s.b);
        Grid::sync();
        GemmTile acc{};  // +0
        KA_UNROLL
        for (int k = 0; k < kGemmLeaf; ++k) {
          float a[kGemmMicroM];
          float b[kGemmMicroN];
          KA_UNROLL
          for (int i = 0; i < kGemmMicroM; ++i) a[i] = s.a[k][ty + kGemmThreadsM * i];
          KA_UNROLL
          for (int j = 0; j < kGemmMicroN; ++j) b[j] = s.b[k][tx + kGemmThreadsN * j];
          KA_UNROLL
          for (int i = 0; i < kGemmMicroM; ++i) {
            KA_UNROLL
            for (int j = 0; j < kGemmMicroN; ++j) {
              acc.v[i][j] = contract::fma_rn(a[i], b[j], acc.v[i][j]);
            }
          }
        }
        Grid::sync();  // the next leaf's staging overwrites the tiles
        tree.push_leaf(acc);
      }
      const GemmTile sum = tree.result(GemmTile{});
      KA_UNROLL
      for (int i = 0; i < kGemmMicroM; ++i) {
        const std::int64_t m = m0 + ty + kGemmThreadsM * i;
        if (m >= p.m) continue;
        KA_UNROLL
        for (int j = 0; j < kGemmMicroN; ++j) {
          const std::int64_t n = n0 + tx + kGemmThreadsN * j;
          if (n >= p.n) continue;
          float bias = 0.0f;
          if (p.bias.data != nullptr) {
            bias = contract::load_f32(p.bias.dtype, p.bias.data, n * p.bias.col_stride);
          }
          const float* bias_or_null = p.bias.data != nullptr ? &bias : nullptr;
          const float out =
              p.grad_out.data != nullptr
                  ? contract::linear_activation_grad(
                        sum.v[i][j], bias_or_null, p.activation,
                        contract::load_f32(p.grad_out.dtype, p.grad_out.data,
                                           m * p.grad_out.row_stride + n * p.grad_out.col_stride))
                  : contract::linear_output(sum.v[i][j], bias_or_null, p.activation);
          contract::store_output(p.c_dtype, p.c, m * p.c_row_stride + n * p.c_col_stride, out);
        }
      }
    }
  }
};

}  // namespace kernel_align::cuda
