// attention's cells: q, k, v (and the backward's out and dout) of every token, one head
// (a head is an independent problem of the whole sequence, and the reference costs
// O(S^2 D) scalar fma calls a head), no padding: a sample alone against the batch.
// Padding is cpu_attention_test's and attention_op_test's.
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases attention_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            InputShapes shapes;
            shapes.batched.assign(config.direction == Direction::Backward ? 5 : 3,
                                  head_rows(config, tables.seq, 1));
            return shapes;
          },
          [](CaseCall& c) {
            const AttentionOptions options{*c.config().layout};
            if (c.forward()) {
              c.add_like_input("out");
              attention_forward(c.input(0), c.input(1), c.input(2), std::nullopt, c.out(0),
                                options);
            } else {
              c.add_like_input("dq");
              c.add_like_input("dk");
              c.add_like_input("dv");
              attention_backward(c.input(0), c.input(1), c.input(2), std::nullopt, c.input(3),
                                 c.input(4), c.out(0), c.out(1), c.out(2), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
