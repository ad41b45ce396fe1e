// multi_axis_rope's cells: x (or the backward's dy) as a batch of head rows, the shape's
// tables.
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases multi_axis_rope_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            InputShapes shapes;
            shapes.batched = {head_rows(config, tables.seq, heads)};
            return shapes;
          },
          [](CaseCall& c) {
            const RopeOptions options{*c.config().pairing, *c.config().layout};
            const cases::ShapeTables& tables = *c.of().tables;
            if (c.forward()) {
              c.add_like_input("y");
              multi_axis_rope_forward(c.input(0), tables.cos(), tables.sin(), c.out(0), options);
            } else {
              c.add_like_input("dx");
              multi_axis_rope_backward(c.input(0), tables.cos(), tables.sin(), c.out(0), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
