// linear's cells: the sample's tokens through a kHeadDim x kHeadDim projection with a
// bias; x (and the backward's dy) are [batch, tokens, kHeadDim].
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases linear_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> tokens{kBatch, tables.seq, cases::kHeadDim};
            InputShapes inputs{{"x", tokens}};
            if (config.direction == Direction::Backward) inputs.push_back({"dy", tokens});
            inputs.push_back({"weight", {cases::kHeadDim, cases::kHeadDim}, false});
            inputs.push_back({"bias", {cases::kHeadDim}, false});
            return inputs;
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall linear_call() {
  return {
      "y = act(x w^T + b) under the contract's linear tree; y in the dtype of x unless --out-dtype "
      "says",
      "gradients of linear: dx, dw, db (needs --bias), each in the dtype of its tensor",
      [](const OpCallArgs& a) {
        LinearOptions options;
        a.get("activation", options.activation);
        if (a.forward()) {
          linear_forward(a.in("x"), a.in("weight"), a.optional_in("bias"), a.out("y"), options);
        } else {
          linear_backward(a.in("x"), a.in("weight"), a.optional_in("bias"), a.in("dy"),
                          a.optional_out("dx"), a.optional_out("dw"), a.optional_out("db"),
                          options);
        }
      }};
}

}  // namespace kernel_align::cli
