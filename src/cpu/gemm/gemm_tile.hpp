// What a GEMM micro-kernel receives: one MR x NR tile of C as plain data (packed
// panels, the tree's merge schedule, where and how to store). Plain data for the same
// reason as row_plan.hpp: a file compiled with AVX-512 flags must not instantiate an
// inline function with external linkage that baseline code also uses.
#pragma once

#include <cstdint>

#include "cpu/gemm/flow_sde_row.hpp"
#include "cpu/gemm/latent_row.hpp"
#include "kernel_align/contract/activation.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cpu {

struct GemmTile {
  const float* a_panel;  // MR rows, r-major: element (i, k) at a_panel[k * MR + i]
  const float* b_panel;  // NR columns, r-major: element (k, j) at b_panel[(k - b_first_r) * NR + j]
  std::int64_t b_first_r;  // the first r b_panel holds (a multiple of the leaf)
  // Fetched into L2 one cache line per step of r of each leaf while the tile runs (or
  // nullptr): part of the B panel that the driver's next tiles read from memory.
  const float* b_prefetch;
  std::int64_t r;
  // This call's leaves: [leaf_begin, leaf_end). A tile's leaves may come in several
  // calls (cache blocking over r); between them its whole state is its stack and depth,
  // because a leaf's tile is pushed before the next leaf starts.
  std::int64_t leaf_begin, leaf_end;
  // merges[leaf]: the entries of the tile's stack each leaf pops (LinearTreeSchedule).
  const std::uint8_t* merges;
  float* stack;  // contract::linear_tree_depth(r) tiles of MR * NR floats
  int* depth;    // entries on the stack, 0 before the first leaf
  int rows,
      cols;  // the valid part of the tile (edge tiles are smaller); stored after the last leaf
  const float* bias;  // NR widened values for the tile's columns, or nullptr
  contract::Activation activation;
  // grad_out (GemmProblem::grad_out) or nullptr: then C = the activation's backward of
  // grad_out at S (+ bias) (contract::linear_activation_grad) instead of the forward.
  const void* grad;
  DType grad_dtype;
  std::int64_t grad_offset;  // element index of the tile's (0, 0)
  std::int64_t grad_row_stride, grad_col_stride;
  void* c;  // C's data
  DType c_dtype;
  std::int64_t c_offset;  // element index of the tile's (0, 0)
  std::int64_t c_row_stride, c_col_stride;
};

// Packing of `width` lines (rows of A, columns of B) whose elements are contiguous along
// r: element (l, k) at data[offset + l * line_stride + k]. For k in [k_begin, k_end)
// writes dst[(k - k_begin) * width + l], widened exactly to fp32; lines l >= lines
// (the edge of the matrix) are +0.
struct GemmPackLines {
  const void* data;
  DType dtype;
  std::int64_t offset, line_stride;
  int lines, width;
  std::int64_t k_begin, k_end;
  float* dst;
};

// A micro-kernel and its register-block shape.
struct GemmKernel {
  int mr;
  int nr;
  void (*run_tile)(const GemmTile& tile);
};

// An instruction-set path: its micro-kernels, all of one NR, by increasing MR (the last
// is the main one, the others serve a few rows, weight-streaming calls), its packing of
// lines contiguous along r (nullptr: the driver's scalar packing), and the vector
// activation its epilogue uses, for the tests: out[i] = activate(z[i]), or with dy
// activate_backward(dy[i], z[i]); and attention's softmax row over the same vectors.
struct GemmPath {
  const GemmKernel* kernels;
  int kernel_count;
  void (*pack_lines)(const GemmPackLines& job);
  void (*activation)(contract::Activation activation, const float* z, const float* dy, float* out,
                     std::int64_t count);
  // One score row of joint attention: scaled, then its probabilities
  // (attention_simd.hpp).
  void (*attention_probabilities)(float* row, std::int64_t n, float scale);
  // Flow-GRPO's SDE step and log-probability (flow_sde_simd.hpp).
  FlowSdeKernels flow_sde;
  // latent_normalize's row (latent_simd.hpp).
  LatentNormalizeRow latent_normalize;
  // latent_pack's fp32 pairs by register transposes (latent_simd.hpp); none on portable,
  // whose one lane is the pair-at-a-time copy.
  LatentPackPairs latent_pack_pairs;
};

const GemmPath& gemm_path_portable();
const GemmPath& gemm_path_avx2();    // needs AVX2 and FMA
const GemmPath& gemm_path_avx512();  // needs AVX-512 F (FMA included)

}  // namespace kernel_align::cpu
