// flow_sde_step and flow_sde_logp (contract section 15): views of rank 2 to 4, dim 0 the
// samples; the step's constants from the options (flow_sde_coefficients, once per call on
// the host). Their validators (each argument checked and named, the call's tensors listed
// once for the aliasing rule) and their public functions (kernel_align/ops.hpp).
#include "api/ops/flow_sde.hpp"

#include <cmath>
#include <string>

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/tables.hpp"

namespace kernel_align {
namespace detail {
namespace {

constexpr std::string_view kSamplesRank = "rank 2 to 4 ([B, ...], dim 0 the samples)";

void check_samples(const char* name, const ConstTensorView& t) {
  check_view(name, t, 2, kMaxRank, {kSamplesRank});
}

void check_like(const char* name, const ConstTensorView& t, const char* reference_name,
                const ConstTensorView& reference) {
  check_samples(name, t);
  check_same_shape(name, t, reference_name, reference);
}

// An fp32 [B] tensor of one number per sample of `samples`.
void check_per_sample(const char* name, const ConstTensorView& t, const ConstTensorView& samples) {
  check_view(name, t, 1, 1, {"rank 1 ([B])"});
  if (t.shape[0] != samples.shape[0]) {
    throw Error(name, "shape [" + std::to_string(samples.shape[0]) + "] (B of x)",
                "shape " + shape_string(t));
  }
  if (t.dtype != DType::F32) {
    throw Error(name, "dtype fp32 (one log-probability per sample)",
                std::string("dtype ") + dtype_name(t.dtype));
  }
}

// The step's constants; a step whose constants overflow fp32 (a variance so small its
// inverse is inf) is refused, never computed as inf or NaN.
FlowSdeCoefficients step_constants(const FlowSdeOptions& o) {
  const FlowSdeCoefficients c =
      flow_sde_coefficients(o.sigma, o.sigma_prev, o.noise_level, o.sigma_max);
  for (const auto& [name, value] : {std::pair{"x_scale", c.x_scale},
                                    {"v_scale", c.v_scale},
                                    {"noise_scale", c.noise_scale},
                                    {"inverse_two_variance", c.inverse_two_variance},
                                    {"log_normalizer", c.log_normalizer}}) {
    if (!std::isfinite(value)) {
      throw Error("sigma_prev",
                  "a step whose constants are finite in fp32 (its variance std^2 (sigma - "
                  "sigma_prev) not so small that its inverse overflows)",
                  std::string(name) + " = " + std::to_string(value) + " from sigma = " +
                      std::to_string(o.sigma) + ", sigma_prev = " + std::to_string(o.sigma_prev) +
                      ", noise_level = " + std::to_string(o.noise_level));
    }
  }
  return c;
}

CallRecord flow_sde_record(OpType op, Direction direction, const FlowSdeOptions& o,
                           DType output_dtype) {
  CallRecord record = record_of(op, direction, output_dtype);
  add_option(record, fp32_value("sigma", o.sigma));
  add_option(record, fp32_value("sigma_prev", o.sigma_prev));
  add_option(record, fp32_value("noise_level", o.noise_level));
  add_option(record, fp32_value("sigma_max", o.sigma_max));
  return record;
}

void check_some_output(const std::optional<TensorView>& dx, const std::optional<TensorView>& dv) {
  if (!dx && !dv) throw Error("dx", "dx or dv (at least one output)", "neither");
}

TensorView or_absent(const std::optional<TensorView>& t) {
  return t ? *t : TensorView();
}

}  // namespace

Call<FlowSdeStepProblem> flow_sde_step_forward_call(const ConstTensorView& x,
                                                    const ConstTensorView& v,
                                                    const ConstTensorView& noise,
                                                    const TensorView& prev,
                                                    const FlowSdeOptions& options) {
  check_samples("x", x);
  check_like("v", v, "x", x);
  check_like("noise", noise, "x", x);
  check_like("prev", prev, "x", x);
  const FlowSdeCoefficients c = step_constants(options);
  Call<FlowSdeStepProblem> call{
      flow_sde_record(OpType::FlowSdeStep, Direction::Forward, options, prev.dtype),
      {x, v, noise, prev, c}};
  check_call(call.record, {x, v, noise, prev});
  return call;
}

Call<FlowSdeStepBackwardProblem> flow_sde_step_backward_call(const ConstTensorView& dprev,
                                                             const std::optional<TensorView>& dx,
                                                             const std::optional<TensorView>& dv,
                                                             const FlowSdeOptions& options) {
  check_samples("dprev", dprev);
  check_some_output(dx, dv);
  if (dx) check_like("dx", *dx, "dprev", dprev);
  if (dv) check_like("dv", *dv, "dprev", dprev);
  const FlowSdeCoefficients c = step_constants(options);
  Call<FlowSdeStepBackwardProblem> call{flow_sde_record(OpType::FlowSdeStep, Direction::Backward,
                                                        options, dx ? dx->dtype : dv->dtype),
                                        {dprev, or_absent(dx), or_absent(dv), c}};
  check_call(call.record, {dprev, dx, dv});
  return call;
}

Call<FlowSdeLogpProblem> flow_sde_logp_forward_call(const ConstTensorView& x,
                                                    const ConstTensorView& v,
                                                    const ConstTensorView& prev,
                                                    const TensorView& logp,
                                                    const FlowSdeOptions& options) {
  check_samples("x", x);
  check_like("v", v, "x", x);
  check_like("prev", prev, "x", x);
  check_per_sample("logp", logp, x);
  const FlowSdeCoefficients c = step_constants(options);
  Call<FlowSdeLogpProblem> call{
      flow_sde_record(OpType::FlowSdeLogp, Direction::Forward, options, logp.dtype),
      {x, v, prev, logp, c}};
  check_call(call.record, {x, v, prev, logp});
  return call;
}

Call<FlowSdeLogpBackwardProblem> flow_sde_logp_backward_call(
    const ConstTensorView& x, const ConstTensorView& v, const ConstTensorView& prev,
    const ConstTensorView& dlogp, const std::optional<TensorView>& dx,
    const std::optional<TensorView>& dv, const FlowSdeOptions& options) {
  check_samples("x", x);
  check_like("v", v, "x", x);
  check_like("prev", prev, "x", x);
  check_per_sample("dlogp", dlogp, x);
  check_some_output(dx, dv);
  if (dx) check_like("dx", *dx, "x", x);
  if (dv) check_like("dv", *dv, "x", x);
  const FlowSdeCoefficients c = step_constants(options);
  Call<FlowSdeLogpBackwardProblem> call{flow_sde_record(OpType::FlowSdeLogp, Direction::Backward,
                                                        options, dx ? dx->dtype : dv->dtype),
                                        {x, v, prev, dlogp, or_absent(dx), or_absent(dv), c}};
  check_call(call.record, {x, v, prev, dlogp, dx, dv});
  return call;
}

}  // namespace detail

void flow_sde_step_forward(const ConstTensorView& x, const ConstTensorView& v,
                           const ConstTensorView& noise, const TensorView& prev,
                           const FlowSdeOptions& options, const ExecutionContext& context) {
  detail::run<OpType::FlowSdeStep, Direction::Forward>(
      context, [&] { return detail::flow_sde_step_forward_call(x, v, noise, prev, options); });
}

void flow_sde_step_backward(const ConstTensorView& dprev, const std::optional<TensorView>& dx,
                            const std::optional<TensorView>& dv, const FlowSdeOptions& options,
                            const ExecutionContext& context) {
  detail::run<OpType::FlowSdeStep, Direction::Backward>(
      context, [&] { return detail::flow_sde_step_backward_call(dprev, dx, dv, options); });
}

void flow_sde_logp_forward(const ConstTensorView& x, const ConstTensorView& v,
                           const ConstTensorView& prev, const TensorView& logp,
                           const FlowSdeOptions& options, const ExecutionContext& context) {
  detail::run<OpType::FlowSdeLogp, Direction::Forward>(
      context, [&] { return detail::flow_sde_logp_forward_call(x, v, prev, logp, options); });
}

void flow_sde_logp_backward(const ConstTensorView& x, const ConstTensorView& v,
                            const ConstTensorView& prev, const ConstTensorView& dlogp,
                            const std::optional<TensorView>& dx,
                            const std::optional<TensorView>& dv, const FlowSdeOptions& options,
                            const ExecutionContext& context) {
  detail::run<OpType::FlowSdeLogp, Direction::Backward>(context, [&] {
    return detail::flow_sde_logp_backward_call(x, v, prev, dlogp, dx, dv, options);
  });
}

}  // namespace kernel_align
