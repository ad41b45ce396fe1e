// What the GEMM paths' latent_normalize kernel receives (latent_simd.hpp): one contiguous
// row of one channel as plain data. Plain data, as flow_sde_row.hpp's, so that files
// compiled with instruction-set flags share no inline function with baseline code.
#pragma once

#include <cstdint>

#include "kernel_align/contract/latent.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cpu {

// out[i] = contract::latent_normalized(channel, in[i]) for i < count, unit strides.
struct LatentRow {
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t count = 0;
  contract::LatentChannel channel;
  DType in_dtype = DType::F32, out_dtype = DType::F32;
};

using LatentNormalizeRow = void (*)(const LatentRow& row);

}  // namespace kernel_align::cpu
