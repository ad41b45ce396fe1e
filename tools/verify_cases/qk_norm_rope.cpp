// qk_norm_rope's cells: q, k (and the backward's dq_out, dk_out) as batches of head
// rows, the four norm weights, the shape's tables and text length.
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases qk_norm_rope_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, heads);
            InputShapes shapes;
            shapes.batched.assign(config.direction == Direction::Backward ? 4 : 2, rows);
            shapes.weights.assign(4, {cases::kHeadDim});
            return shapes;
          },
          [](CaseCall& c) {
            const QkNormRopeOptions options{.mode = *c.config().mode,
                                            .pairing = *c.config().pairing,
                                            .layout = *c.config().layout,
                                            .text_len = c.of().shape->text_len};
            const QkNormWeights weights{c.weight(0), c.weight(1), c.weight(2), c.weight(3)};
            const cases::ShapeTables& tables = *c.of().tables;
            if (c.forward()) {
              c.add_like_input("q_out");
              c.add_like_input("k_out");
              qk_norm_rope_forward(c.input(0), c.input(1), weights, tables.cos(), tables.sin(),
                                   c.out(0), c.out(1), options);
            } else {
              c.add_like_input("dq");
              c.add_like_input("dk");
              std::size_t weight = 0;
              for (const char* name : {"dw_text_q", "dw_text_k", "dw_image_q", "dw_image_k"}) {
                c.add_weight_grad(name, weight++);
              }
              qk_norm_rope_backward(c.input(0), c.input(1), c.input(2), c.input(3), weights,
                                    tables.cos(), tables.sin(), c.out(0), c.out(1),
                                    {c.out(2), c.out(3), c.out(4), c.out(5)}, options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
