// adaln_gate_residual's cells: x and y (the backward's y and dout) of the sample's
// tokens, kHeadDim wide, and its gate [batch, 1, kHeadDim].
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases adaln_gate_residual_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> tokens{kBatch, tables.seq, cases::kHeadDim};
            const std::vector<std::int64_t> gate{kBatch, 1, cases::kHeadDim};
            if (config.direction == Direction::Forward) {
              return InputShapes{{"x", tokens}, {"y", tokens}, {"gate", gate}};
            }
            // dgate, a sample's own sum over its tokens, is per sample.
            return InputShapes{{"y", tokens}, {"dout", tokens}, {"gate", gate}};
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall adaln_gate_residual_call() {
  return {"out = x + gate * y: x and y [B, S, D], gate [B, D] or [B, 1, D]",
          "gradients of adaln-gate-residual: dy and dgate (a sum over tokens); dx is dout itself",
          [](const OpCallArgs& a) {
            GateResidualOptions options;
            a.get("mode", options.mode);
            if (a.forward()) {
              adaln_gate_residual_forward(a.in("x"), a.in("gate"), a.in("y"), a.out("out"),
                                          options);
            } else {
              adaln_gate_residual_backward(a.in("gate"), a.in("y"), a.in("dout"), a.out("dy"),
                                           a.optional_out("dgate"), options);
            }
          }};
}

}  // namespace kernel_align::cli
