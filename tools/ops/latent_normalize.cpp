// latent_normalize's cells: latents [batch, 16, H, W] (Qwen-Image's VAE channels, the
// grid from the shape's positions), the 16 constants fp32 vectors; both transforms.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases latent_normalize_cases() {
  return {
      [](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
        constexpr std::int64_t kChannels = 16;
        const std::vector<std::int64_t> latents{kBatch, kChannels, 2, tables.seq};
        const std::vector<std::int64_t> constants{kChannels};
        if (config.direction == Direction::Backward) {
          return InputShapes{{"dy", latents}, {"std", constants, false}};
        }
        return InputShapes{{"z", latents}, {"mean", constants, false}, {"std", constants, false}};
      },
      {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall latent_normalize_call() {
  return {
      "the VAE latents' per-channel normalization: y = (z - mean) / std (normalize) or "
      "z / (1 / std) + mean (denormalize), as Qwen-Image's pipelines compute it",
      "gradient of latent-normalize: dz = dy / std or dy / (1 / std)", [](const OpCallArgs& a) {
        LatentNormalizeOptions options;
        a.get("transform", options.transform);
        if (a.forward()) {
          latent_normalize_forward(a.in("z"), a.in("mean"), a.in("std"), a.out("y"), options);
        } else {
          latent_normalize_backward(a.in("dy"), a.in("std"), a.out("dz"), options);
        }
      }};
}

}  // namespace kernel_align::cli
