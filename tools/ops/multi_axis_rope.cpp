// multi_axis_rope's cells: x (or the backward's dy) as a batch of head rows, the shape's
// tables.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases multi_axis_rope_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            return InputShapes{{config.direction == Direction::Forward ? "x" : "dy",
                                head_rows(config, tables.seq, heads)}};
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall multi_axis_rope_call() {
  return {"multi-axis RoPE of a 4-D x; cos and sin fp32 [S, D/2], given or built from --positions",
          "gradient of multi-axis-rope (the transpose rotation): dx in the dtype of dy",
          [](const OpCallArgs& a) {
            RopeOptions options;
            a.get("layout", options.layout);
            a.get("pairing", options.pairing);
            if (a.forward()) {
              multi_axis_rope_forward(a.in("x"), a.in("cos"), a.in("sin"), a.out("y"), options);
            } else {
              multi_axis_rope_backward(a.in("dy"), a.in("cos"), a.in("sin"), a.out("dx"), options);
            }
          }};
}

}  // namespace kernel_align::cli
