// adaln_modulation's cells: x (and the backward's dy) of the sample's tokens, kHeadDim
// wide, and its modulation [batch, 1, kHeadDim] (the forward's x, scale, shift; the
// backward's x, dy, scale).
#include "kernel_align/ops.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases adaln_modulation_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> tokens{kBatch, tables.seq, cases::kHeadDim};
            const std::vector<std::int64_t> modulation{kBatch, 1, cases::kHeadDim};
            InputShapes shapes;
            if (config.direction == Direction::Forward) {
              shapes.batched = {tokens, modulation, modulation};
            } else {
              shapes.batched = {tokens, tokens, modulation};
            }
            return shapes;
          },
          [](CaseCall& c) {
            const AdaLnOptions options{.mode = *c.config().mode};
            if (c.forward()) {
              c.add_like_input("y");
              adaln_modulation_forward(c.input(0), c.input(1), c.input(2), c.out(0), options);
            } else {
              c.add_like_input("dx");
              // A sample's own sums over its tokens: per sample.
              const NpyType type = c.of().batched[2].type;
              c.add("dscale", type, {c.samples(), 1, cases::kHeadDim}, true);
              c.add("dshift", type, {c.samples(), 1, cases::kHeadDim}, true);
              adaln_modulation_backward(c.input(0), c.input(2), c.input(1), c.out(0), c.out(1),
                                        c.out(2), options);
            }
          }};
}

}  // namespace kernel_align::cli::verify_cases
