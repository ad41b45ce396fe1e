// What the GEMM paths' SDE-step kernels receive (flow_sde_simd.hpp): one contiguous row
// of the step's tensors as plain data, and the kernels of a path. Plain data, as
// gemm_tile.hpp's, so that files compiled with instruction-set flags share no inline
// function with baseline code.
#pragma once

#include <cstdint>

#include "kernel_align/dtype.hpp"

namespace kernel_align::cpu {

// A row of `count` elements, unit stride: x and v, a third input (noise, dprev or prev
// by kernel), up to two outputs (null: not written), the step's constants and, for the
// log-probability's gradient, the sample's factor g.
struct FlowSdeRow {
  const void* x = nullptr;
  const void* v = nullptr;
  const void* third = nullptr;
  void* out0 = nullptr;
  void* out1 = nullptr;
  std::int64_t count = 0;
  float x_scale = 0.0f, v_scale = 0.0f, noise_scale = 0.0f, grad_scale = 0.0f;
  DType x_dtype = DType::F32, v_dtype = DType::F32, third_dtype = DType::F32;
  DType out0_dtype = DType::F32, out1_dtype = DType::F32;
};

struct FlowSdeKernels {
  void (*step)(const FlowSdeRow& row);       // out0 = prev (third: noise)
  void (*step_grad)(const FlowSdeRow& row);  // out0 = dx, out1 = dv (third: dprev)
  void (*distances)(const FlowSdeRow& row, float* distances);  // prev - mean (third: prev)
  void (*logp_grad)(const FlowSdeRow& row);                    // out0 = dx, out1 = dv (third: prev)
  // The leaves' fma chains over kLinearLeaf consecutive distances each.
  void (*leaf_sums)(const float* distances, std::int64_t leaves, float* sums);
};

}  // namespace kernel_align::cpu
