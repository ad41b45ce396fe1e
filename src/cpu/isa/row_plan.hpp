// What an instruction-set path receives: a problem reduced to plain data (pointers,
// dtypes, element strides), built by kernels.cpp from the validated problem structs.
//
// Why plain data: a file compiled with AVX-512 flags must not instantiate any inline
// function with external linkage that baseline code also uses (std::optional's
// accessors, the tensor views' constructors, ...). The linker keeps one copy of such a
// function, possibly the AVX-512 one, for every caller. Handing the ISA files nothing
// but data members keeps them from calling any such function.
#pragma once

#include <cstdint>

#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cpu {

// Rows are indexed by up to three leading dims in row-major order (missing leading
// dims have extent 1); a row is `d` elements `step` apart.
inline constexpr int kLeadingDims = 3;
inline constexpr int kMaxRowLength = 4096;  // kMaxHeadDim (ops.hpp), checked in kernels.cpp

struct RowInput {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t strides[kLeadingDims] = {};  // elements, per leading dim
  std::int64_t step = 1;                    // elements between a row's elements
};

struct RowOutput {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t strides[kLeadingDims] = {};
  std::int64_t step = 1;
};

struct NormParams {
  const void* weight = nullptr;  // [d] or null: no weight (fp32 ones)
  DType weight_dtype = DType::F32;
  std::int64_t weight_step = 1;
  contract::NormMode mode = contract::NormMode::Single;
  float eps = 0.0f;
};

struct RopeParams {
  const float* cos = nullptr;  // [S, d/2] fp32
  const float* sin = nullptr;
  std::int64_t cos_strides[2] = {};
  std::int64_t sin_strides[2] = {};
  int seq_dim = 1;              // the leading dim that is the sequence (table row)
  std::int64_t seq_offset = 0;  // table row of sequence index 0
  bool interleaved = true;      // pairs (2k, 2k+1), else (k, k + d/2)
  bool transpose = false;       // the backward rotation
};

// A sample's vector of d elements (a modulation: adaln's scale and shift, the gate), one per index
// of the middle leading dim: rows of a [B, S, D] tensor are (1, b, s), and row r's vector is sample
// b's, at data[b * sample_stride + i * step].
struct SampleVector {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t sample_stride = 0;
  std::int64_t step = 1;
};

// The modulations of adaln_modulation (scale, shift, eps) and adaln_gate_residual (gate),
// and the rounding mode of either (Diffusers: the model dtype's roundings).
struct ModulationParams {
  SampleVector scale;
  SampleVector shift;
  SampleVector gate;
  contract::NormMode mode = contract::NormMode::Single;
  float eps = 0.0f;
  // adaln_backward's sums over a sample's tokens that the call asks for, in dw_partial:
  // dscale's terms in [0, d) where asked, then dshift's.
  bool sums_scale = false;
  bool sums_shift = false;
};

// One problem. Each kernel reads the members its op uses:
//   rmsnorm_forward       x -> out              norm
//   rmsnorm_backward      x, dy -> out (dx)     norm
//   rope                  x -> out              rope
//   norm_rope_forward     x -> out              norm, rope
//   norm_rope_backward    x, dy -> out (dx)     norm, rope
//   adaln_forward         x -> out              modulation (scale, shift, eps)
//   adaln_backward        x, dy -> out (dx)     modulation (scale, eps); dw_partial: the
//                                               sample's dscale, dshift terms
//   gate_residual_forward x, dy (y) -> out      modulation (gate)
//   gate_residual_backward x (dout), dy (y) -> out (dy)   modulation (gate); dw_partial: dgate
struct RowPlan {
  std::int64_t extents[kLeadingDims] = {1, 1, 1};
  int d = 0;
  RowInput x;
  RowInput dy;
  RowOutput out;
  NormParams norm;
  RopeParams rope;
  ModulationParams modulation;
};

// A kernel computes rows [begin, end). dw_partial (backward kernels only, may be
// null): adds each row's dw terms into dw_partial[0..d), rows in order (the gate's
// backward: rows of one sample, its dgate terms).
using RowKernel = void (*)(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                           float* dw_partial);

struct RowKernels {
  RowKernel rmsnorm_forward;
  RowKernel rmsnorm_backward;
  RowKernel rope;
  RowKernel norm_rope_forward;
  RowKernel norm_rope_backward;
  RowKernel adaln_forward;
  RowKernel adaln_backward;
  RowKernel gate_residual_forward;
  RowKernel gate_residual_backward;
};

// One table per path (portable.cpp, avx2.cpp, avx512.cpp); the last two exist in
// x86-64 builds only.
extern const RowKernels portable_row_kernels;
extern const RowKernels avx2_row_kernels;
extern const RowKernels avx512_row_kernels;
// avx512.cpp compiled on SIMDe's portable AVX-512, in the CPU tests only
// (tests/cpu/avx512_on_simde.hpp).
extern const RowKernels avx512_on_simde_row_kernels;

}  // namespace kernel_align::cpu
