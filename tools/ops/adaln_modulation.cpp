// adaln_modulation's cells: x (and the backward's dy) of the sample's tokens, kHeadDim
// wide, and its modulation [batch, 1, kHeadDim] (the forward's x, scale, shift; the
// backward's x, dy, scale).
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases adaln_modulation_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> tokens{kBatch, tables.seq, cases::kHeadDim};
            const std::vector<std::int64_t> modulation{kBatch, 1, cases::kHeadDim};
            if (config.direction == Direction::Forward) {
              return InputShapes{{"x", tokens}, {"scale", modulation}, {"shift", modulation}};
            }
            // dscale and dshift, a sample's own sums over its tokens, are per sample.
            return InputShapes{{"x", tokens}, {"dy", tokens}, {"scale", modulation}};
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall adaln_modulation_call() {
  return {
      "y = LayerNorm(x) * (1 + scale) + shift without affine weights: x [B, S, D], scale and shift "
      "[B, D] or [B, 1, D]",
      "gradients of adaln-modulation: dx, dscale and dshift (sums over tokens)",
      [](const OpCallArgs& a) {
        AdaLnOptions options;
        a.get("mode", options.mode);
        a.get("eps", options.eps);
        if (a.forward()) {
          adaln_modulation_forward(a.in("x"), a.in("scale"), a.in("shift"), a.out("y"), options);
        } else {
          adaln_modulation_backward(a.in("x"), a.in("scale"), a.in("dy"), a.out("dx"),
                                    a.optional_out("dscale"), a.optional_out("dshift"), options);
        }
      }};
}

}  // namespace kernel_align::cli
