// attention's cells: q, k, v (and the backward's out and dout) of every token, one head
// (a head is an independent problem of the whole sequence, and the reference costs
// O(S^2 D) scalar fma calls a head), no padding: a sample alone against the batch.
// Padding is cpu_attention_test's and attention_op_test's.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases attention_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, 1);
            InputShapes inputs{{"q", rows}, {"k", rows}, {"v", rows}};
            if (config.direction == Direction::Backward) {
              inputs.push_back({"out", rows});
              inputs.push_back({"dout", rows});
            }
            return inputs;
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall attention_call() {
  return {
      "joint attention under the contract: q, k, v [B, S, H, D] (bshd) or [B, H, S, D] (bhsd), "
      "mask bool [B, S] (true: the token takes part); out in the dtype of q",
      "gradients of attention from the forward's out and its gradient dout: dq, dk, dv, each in "
      "the dtype of its input",
      [](const OpCallArgs& a) {
        AttentionOptions options;
        a.get("layout", options.layout);
        if (a.forward()) {
          attention_forward(a.in("q"), a.in("k"), a.in("v"), a.optional_in("mask"), a.out("out"),
                            options);
        } else {
          attention_backward(a.in("q"), a.in("k"), a.in("v"), a.optional_in("mask"), a.in("out"),
                             a.in("dout"), a.out("dq"), a.out("dk"), a.out("dv"), options);
        }
      }};
}

}  // namespace kernel_align::cli
