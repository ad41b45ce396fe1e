// activation's cells: x (and the backward's dy) as a batch of head rows.
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases activation_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            InputShapes shapes;
            shapes.batched.assign(config.direction == Direction::Backward ? 2 : 1,
                                  head_rows(config, tables.seq, heads));
            return shapes;
          },
          [](CaseCall& c) {
            const ActivationOptions options{*c.config().activation};
            if (c.forward()) {
              c.add_like_input("y");
              activation_forward(c.input(0), c.out(0), options);
            } else {
              c.add_like_input("dx");
              activation_backward(c.input(0), c.input(1), c.out(0), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
