// qk_rmsnorm's cells: x (and the backward's dy) as a batch of head rows, one weight.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases qk_rmsnorm_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, heads);
            InputShapes inputs{{"x", rows}};
            if (config.direction == Direction::Backward) inputs.push_back({"dy", rows});
            inputs.push_back({"weight", {cases::kHeadDim}, false});
            return inputs;
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall qk_rmsnorm_call() {
  return {
      "per-head RMSNorm over the last dim of x; y in the dtype of x unless --out-dtype says",
      "gradients of qk-rmsnorm: dx in the dtype of x, dw (needs --weight) in that of the weight",
      [](const OpCallArgs& a) {
        RmsNormOptions options;
        a.get("eps", options.eps);
        a.get("mode", options.mode);
        if (a.forward()) {
          qk_rmsnorm_forward(a.in("x"), a.optional_in("weight"), a.out("y"), options);
        } else {
          qk_rmsnorm_backward(a.in("x"), a.in("dy"), a.optional_in("weight"), a.out("dx"),
                              a.optional_out("dw"), options);
        }
      }};
}

}  // namespace kernel_align::cli
