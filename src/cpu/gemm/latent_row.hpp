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

// latent_pack's rows 2i and 2i + 1 of one sample, fp32 with unit-stride latent rows and
// token features: a token's two elements of a latent row are one 8-byte pair, adjacent on
// both sides. Offsets and steps in bytes.
struct LatentPairRows {
  const char* from = nullptr;  // the latents (pack) or the tokens (unpack)
  char* to = nullptr;
  std::int64_t latent0 = 0;  // element (c 0, h 2i, w 0)
  std::int64_t token0 = 0;   // token i * W/2, feature 0
  std::int64_t channel_step = 0, row_step = 0, token_step = 0;
  std::int64_t channels = 0, half_width = 0;
  bool to_tokens = true;
};

// A path's vector kernel of LatentPairRows, for channel counts that are a multiple of
// `channel_group`; null on a path without one.
struct LatentPackPairs {
  void (*run)(const LatentPairRows& rows) = nullptr;
  std::int64_t channel_group = 0;
};

}  // namespace kernel_align::cpu
