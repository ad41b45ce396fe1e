// adaln_gate_residual's cells: x and y (the backward's y and dout) of the sample's
// tokens, kHeadDim wide, and its gate [batch, 1, kHeadDim].
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases adaln_gate_residual_cases() {
  return {[](const cases::Config&, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> tokens{kBatch, tables.seq, cases::kHeadDim};
            InputShapes shapes;
            // Forward: x, y, gate; backward: y, dout, gate.
            shapes.batched = {tokens, tokens, {kBatch, 1, cases::kHeadDim}};
            return shapes;
          },
          [](CaseCall& c) {
            const GateResidualOptions options{*c.config().mode};
            if (c.forward()) {
              c.add_like_input("out");
              adaln_gate_residual_forward(c.input(0), c.input(2), c.input(1), c.out(0), options);
            } else {
              c.add_like_input("dy");
              // A sample's own sum over its tokens: per sample.
              c.add("dgate", c.of().batched[2].type, {c.samples(), 1, cases::kHeadDim}, true);
              adaln_gate_residual_backward(c.input(2), c.input(0), c.input(1), c.out(0), c.out(1),
                                           options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
