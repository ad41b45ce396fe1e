// latent_normalize and latent_pack as their backends compute them (docs/contract.md
// section 16).
#pragma once

#include <cstdint>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/latent.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align::detail {

// Both directions: forward in = z, out = y; backward in = dy, out = dz and mean absent
// (data null). in and out: [B, C, L] or [B, C, H, W]; mean and std: [C].
struct LatentNormalizeProblem {
  ConstTensorView in;
  ConstTensorView mean;
  ConstTensorView std;
  TensorView out;
  bool denormalize = false;
};

// The channel of row r (the last dim a row) of latents [B, C, L] or [B, C, H, W].
KA_HD static inline std::int64_t latent_channel_of_row(std::int64_t r, std::int64_t channels,
                                                       std::int64_t rows_per_channel) {
  return (r / rows_per_channel) % channels;
}
// The rows of one channel of one sample: H of [B, C, H, W], 1 of [B, C, L].
inline std::int64_t latent_rows_per_channel(const ConstTensorView& v) {
  return v.rank == 4 ? v.shape[2] : 1;
}

// What the call applies to channel c's elements: its constants widened to fp32 (the
// backward has no mean) as contract::latent_channel takes them. For the host backends.
inline contract::LatentChannel latent_channel_of(const LatentNormalizeProblem& p, std::int64_t c) {
  const bool gradient = p.mean.data == nullptr;
  return contract::latent_channel(
      p.denormalize, gradient,
      gradient ? 0.0f : contract::load_f32(p.mean.dtype, p.mean.data, c * p.mean.strides[0]),
      contract::load_f32(p.std.dtype, p.std.data, c * p.std.strides[0]));
}

// Forward: latents [B, C, H, W] -> tokens [B, H/2 * W/2, 4C]; backward: tokens -> latents.
// Both of one dtype, any strides.
struct LatentPackProblem {
  ConstTensorView latents;
  TensorView tokens;
};

struct LatentUnpackProblem {
  ConstTensorView tokens;
  TensorView latents;
};

}  // namespace kernel_align::detail
