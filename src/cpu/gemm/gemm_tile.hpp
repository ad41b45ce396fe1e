// What a GEMM micro-kernel receives: one MR x NR tile of C as plain data (packed
// panels, the tree's merge schedule, where and how to store). Plain data for the same
// reason as row_plan.hpp: a file compiled with AVX-512 flags must not instantiate an
// inline function with external linkage that baseline code also uses.
#pragma once

#include <cstdint>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cpu {

struct GemmTile {
  const float* a_panel;  // MR rows, r-major: element (i, k) at a_panel[k * MR + i]
  const float* b_panel;  // NR columns, r-major: element (k, j) at b_panel[k * NR + j]
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
  void* c;  // C's data
  DType c_dtype;
  std::int64_t c_offset;  // element index of the tile's (0, 0)
  std::int64_t c_row_stride, c_col_stride;
};

// A path's micro-kernel and its register-block shape.
struct GemmKernel {
  int mr;
  int nr;
  void (*run_tile)(const GemmTile& tile);
};

const GemmKernel& gemm_kernel_portable();
const GemmKernel& gemm_kernel_avx2();    // needs AVX2 and FMA
const GemmKernel& gemm_kernel_avx512();  // needs AVX-512 F (FMA included)

}  // namespace kernel_align::cpu
