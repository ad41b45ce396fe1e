// activation's cells: x (and the backward's dy) as a batch of head rows.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases activation_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, heads);
            InputShapes inputs{{"x", rows}};
            if (config.direction == Direction::Backward) inputs.push_back({"dy", rows});
            return inputs;
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall activation_call() {
  return {"y = SiLU(x) or tanh-GELU(x), elementwise, with the contract's exp and tanh",
          "gradient of activation: dx in the dtype of x", [](const OpCallArgs& a) {
            ActivationOptions options;
            a.get("activation", options.activation);
            if (a.forward()) {
              activation_forward(a.in("x"), a.out("y"), options);
            } else {
              activation_backward(a.in("x"), a.in("dy"), a.out("dx"), options);
            }
          }};
}

}  // namespace kernel_align::cli
