// flow_sde_step's and flow_sde_logp's cells: latents [batch, tokens, 64] (Qwen-Image's
// packed latents: 16 channels in 2 x 2 patches), one step (sigma 0.8 to 0.6, noise level
// 0.7, sigma_max 0.9): the sample alone against the batch.
// Its OpCall hands the signature's tensors and options to the public function, for
// `apply` and verify alike.
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::verify_cases {
namespace {

constexpr std::int64_t kChannels = 64;

// The step every case takes.
std::vector<detail::OptionValue> step_options() {
  return {{.name = "sigma", .kind = detail::OptionKind::Float, .number = 0.8f},
          {.name = "sigma_prev", .kind = detail::OptionKind::Float, .number = 0.6f},
          {.name = "noise_level", .kind = detail::OptionKind::Float, .number = 0.7f},
          {.name = "sigma_max", .kind = detail::OptionKind::Float, .number = 0.9f}};
}

}  // namespace

OpCases flow_sde_step_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> latents{kBatch, tables.seq, kChannels};
            if (config.direction == Direction::Backward) return InputShapes{{"dprev", latents}};
            return InputShapes{{"x", latents}, {"v", latents}, {"noise", latents}};
          },
          step_options()};
}

OpCases flow_sde_logp_cases() {
  return {[](const cases::Config& config, const cases::ShapeTables& tables, std::int64_t) {
            const std::vector<std::int64_t> latents{kBatch, tables.seq, kChannels};
            InputShapes inputs{{"x", latents}, {"v", latents}, {"prev", latents}};
            if (config.direction == Direction::Backward)
              inputs.push_back({"dlogp", {kBatch}, true, true});
            return inputs;
          },
          step_options()};
}

}  // namespace kernel_align::cli::verify_cases

namespace kernel_align::cli {
namespace {

FlowSdeOptions options_of(const OpCallArgs& a) {
  FlowSdeOptions options;
  a.get("sigma", options.sigma);
  a.get("sigma_prev", options.sigma_prev);
  a.get("noise_level", options.noise_level);
  a.get("sigma_max", options.sigma_max);
  return options;
}

}  // namespace

OpCall flow_sde_step_call() {
  return {
      "one step of Flow-GRPO's SDE sampler: prev = x * x_scale + v * v_scale + noise_scale * "
      "noise, the constants of the step from --sigma to --sigma-prev",
      "gradients of flow-sde-step: dx = dprev * x_scale, dv = dprev * v_scale",
      [](const OpCallArgs& a) {
        const FlowSdeOptions options = options_of(a);
        if (a.forward()) {
          flow_sde_step_forward(a.in("x"), a.in("v"), a.in("noise"), a.out("prev"), options);
        } else {
          flow_sde_step_backward(a.in("dprev"), a.optional_out("dx"), a.optional_out("dv"),
                                 options);
        }
      }};
}

OpCall flow_sde_logp_call() {
  return {
      "the step's log-probability of prev per sample (fp32 [B]): the mean over the sample's "
      "elements of the Gaussian log-density, its sum by linear's tree",
      "gradients of flow-sde-logp from dlogp (fp32 [B]): dx, dv", [](const OpCallArgs& a) {
        const FlowSdeOptions options = options_of(a);
        if (a.forward()) {
          flow_sde_logp_forward(a.in("x"), a.in("v"), a.in("prev"), a.out("logp"), options);
        } else {
          flow_sde_logp_backward(a.in("x"), a.in("v"), a.in("prev"), a.in("dlogp"),
                                 a.optional_out("dx"), a.optional_out("dv"), options);
        }
      }};
}

}  // namespace kernel_align::cli
