// linear's cells: the sample's tokens through a kHeadDim x kHeadDim projection with a
// bias; x (and the backward's dy) are [batch, tokens, kHeadDim].
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases linear_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            InputShapes shapes;
            shapes.batched.assign(config.direction == Direction::Backward ? 2 : 1,
                                  {kBatch, tables.seq, cases::kHeadDim});
            shapes.weights = {{cases::kHeadDim, cases::kHeadDim}, {cases::kHeadDim}};
            return shapes;
          },
          [](CaseCall& c) {
            const LinearOptions options{*c.config().activation};
            if (c.forward()) {
              c.add_like_input("y");
              linear_forward(c.input(0), c.weight(0), c.weight(1), c.out(0), options);
            } else {
              c.add_like_input("dx");
              c.add_weight_grad("dw", 0);
              c.add_weight_grad("db", 1);
              linear_backward(c.input(0), c.weight(0), c.weight(1), c.input(1), c.out(0), c.out(1),
                              c.out(2), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
