// The latent ops around the transformer (docs/contract.md section 16): the VAE latents'
// per-channel normalization as Qwen-Image's pipelines write it, each operation one fp32
// operation of float_ops.hpp, and the pipelines' 2x2 patchify as an index map (a
// permutation: the backends copy an element's bytes). KA_HD: every backend runs these.
#pragma once

#include <cstdint>

#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

// What latent_normalize applies to the elements of one channel: subtract `mean` first,
// divide by `divisor`, add `mean` last, as the transform and direction say.
struct LatentChannel {
  float mean = 0.0f;
  float divisor = 1.0f;
  bool subtract_first = false;
  bool add_last = false;
};

// Normalize: y = (z - mean) / std, its gradient dy / std. Denormalize: y = z / (1 / std)
// + mean (the pipelines divide by latents_std = 1 / std, computed in fp32), its gradient
// dy / (1 / std). A gradient never adds or subtracts (x - 0 and x + 0 are not x for -0).
KA_HD static inline LatentChannel latent_channel(bool denormalize, bool gradient, float mean,
                                                 float std) {
  if (denormalize) return {mean, div(1.0f, std), false, !gradient};
  return {mean, std, !gradient, false};
}

KA_HD static inline float latent_normalized(const LatentChannel& c, float z) {
  const float centred = c.subtract_first ? sub(z, c.mean) : z;
  const float scaled = div(centred, c.divisor);
  return c.add_last ? add(scaled, c.mean) : scaled;
}

// The token and feature of latent element (c, h, w) in a packed grid of `width` columns:
// token (h / 2) * (width / 2) + w / 2, feature 4c + 2 (h % 2) + w % 2.
struct LatentTokenIndex {
  std::int64_t token = 0;
  std::int64_t feature = 0;
};

KA_HD static inline LatentTokenIndex latent_token_index(std::int64_t c, std::int64_t h,
                                                        std::int64_t w, std::int64_t width) {
  return {(h / 2) * (width / 2) + w / 2, 4 * c + 2 * (h % 2) + w % 2};
}

}  // namespace kernel_align::contract
