// qk_norm_rope's cells: q, k (and the backward's dq_out, dk_out) as batches of head
// rows, the four norm weights, the shape's tables and text length.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases qk_norm_rope_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t heads) {
            const std::vector<std::int64_t> rows = head_rows(config, tables.seq, heads);
            InputShapes inputs{{"q", rows}, {"k", rows}};
            if (config.direction == Direction::Backward) {
              inputs.push_back({"dq_out", rows});
              inputs.push_back({"dk_out", rows});
            }
            for (const char* w :
                 {"weight_text_q", "weight_text_k", "weight_image_q", "weight_image_k"}) {
              inputs.push_back({w, {cases::kHeadDim}, false});
            }
            return inputs;
          },
          {}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall qk_norm_rope_call() {
  return {
      "q_out, k_out = rope(qk-rmsnorm(q, k)) in one pass: text positions [0, text_len) with the "
      "text weights, image positions with the image weights",
      "gradients of qk-norm-rope: dq, dk, and the gradient of each weight given",
      [](const OpCallArgs& a) {
        QkNormRopeOptions options;
        a.get("layout", options.layout);
        a.get("pairing", options.pairing);
        a.get("mode", options.mode);
        a.get("eps", options.eps);
        a.get("text_len", options.text_len);
        const QkNormWeights weights{a.optional_in("weight_text_q"), a.optional_in("weight_text_k"),
                                    a.optional_in("weight_image_q"),
                                    a.optional_in("weight_image_k")};
        if (a.forward()) {
          qk_norm_rope_forward(a.in("q"), a.in("k"), weights, a.in("cos"), a.in("sin"),
                               a.out("q_out"), a.out("k_out"), options);
        } else {
          const QkNormWeightGrads grads{a.optional_out("dw_text_q"), a.optional_out("dw_text_k"),
                                        a.optional_out("dw_image_q"), a.optional_out("dw_image_k")};
          qk_norm_rope_backward(a.in("q"), a.in("k"), a.in("dq_out"), a.in("dk_out"), weights,
                                a.in("cos"), a.in("sin"), a.out("dq"), a.out("dk"), grads, options);
        }
      }};
}

}  // namespace kernel_align::cli
