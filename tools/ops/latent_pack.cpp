// latent_pack's cells: latents [batch, 16, 8, 12] (Qwen-Image's VAE channels; 24 tokens)
// and their tokens [batch, 24, 64], whatever the shape's positions (the unpacked grid is
// an option, height and width, fixed here).
// Its OpCall hands the signature's tensors to the public function, for `apply` and verify
// alike; the forward's height and width, where given, must be x's.
#include <string>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases latent_pack_cases() {
  constexpr std::int64_t kChannels = 16, kHeight = 8, kWidth = 12;
  return {[](const cases::Config& config, const cases::ShapeTables&, std::int64_t) {
            if (config.direction == Direction::Backward) {
              return InputShapes{{"dy", {kBatch, kHeight / 2 * (kWidth / 2), 4 * kChannels}}};
            }
            return InputShapes{{"x", {kBatch, kChannels, kHeight, kWidth}}};
          },
          {{.name = "height", .kind = detail::OptionKind::Integer, .integer = kHeight},
           {.name = "width", .kind = detail::OptionKind::Integer, .integer = kWidth}}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {
namespace {

// The forward reads H and W from x; a height or width given as well must agree.
void check_grid_option(const OpCallArgs& a, const char* name, std::int64_t of_x) {
  std::int64_t value = 0;
  a.get(name, value);
  if (value != 0 && value != of_x) {
    throw Error(name, std::to_string(of_x) + " (x's) or none", std::to_string(value));
  }
}

}  // namespace

OpCall latent_pack_call() {
  return {"Qwen-Image's 2x2 patchify: latents x [B, C, H, W] to tokens y [B, H/2 * W/2, 4C]",
          "its inverse (the pipelines' unpack): tokens dy [B, S, 4C] to latents dx [B, C, "
          "height, width]",
          [](const OpCallArgs& a) {
            if (a.forward()) {
              const ConstTensorView x = a.in("x");
              if (x.rank == 4) {
                check_grid_option(a, "height", x.shape[2]);
                check_grid_option(a, "width", x.shape[3]);
              }
              latent_pack_forward(x, a.out("y"));
            } else {
              latent_pack_backward(a.in("dy"), a.out("dx"));
            }
          }};
}

}  // namespace kernel_align::cli
