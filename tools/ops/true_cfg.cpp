// true_cfg's cells: the conditional and unconditional velocities [batch, tokens, 64]
// (Qwen-Image's packed latents' channels), guidance scale 4 (the pipeline's default).
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {

OpCases true_cfg_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> rows{kBatch, tables.seq, 64};
            InputShapes inputs{{"cond", rows}, {"uncond", rows}};
            if (config.direction == Direction::Backward) inputs.push_back({"dv", rows});
            return inputs;
          },
          {{.name = "scale", .kind = detail::OptionKind::Float, .number = 4.0f}}};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {

OpCall true_cfg_call() {
  return {
      "true classifier-free guidance with Qwen-Image's norm rescale: v = c * (|cond| / |c|), "
      "c = uncond + scale (cond - uncond), per row (the last dim)",
      "gradients of true-cfg: dcond and duncond", [](const OpCallArgs& a) {
        TrueCfgOptions options;
        a.get("scale", options.scale);
        if (a.forward()) {
          true_cfg_forward(a.in("cond"), a.in("uncond"), a.out("v"), options);
        } else {
          true_cfg_backward(a.in("cond"), a.in("uncond"), a.in("dv"), a.optional_out("dcond"),
                            a.optional_out("duncond"), options);
        }
      }};
}

}  // namespace kernel_align::cli
