// qk_rmsnorm's cells: x (and the backward's dy) as a batch of head rows, one weight.
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases qk_rmsnorm_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, heads);
            InputShapes shapes;
            shapes.batched.assign(config.direction == Direction::Backward ? 2 : 1, rows);
            shapes.weights = {{cases::kHeadDim}};
            return shapes;
          },
          [](CaseCall& c) {
            const RmsNormOptions options{.mode = *c.config().mode};
            if (c.forward()) {
              c.add_like_input("y");
              qk_rmsnorm_forward(c.input(0), c.weight(0), c.out(0), options);
            } else {
              c.add_like_input("dx");
              c.add_weight_grad("dw", 0);
              qk_rmsnorm_backward(c.input(0), c.input(1), c.weight(0), c.out(0), c.out(1), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
