// kernel_align::flow_sde_step and kernel_align::flow_sde_logp: Flow-GRPO's SDE step and its
// log-probability under the contract (docs/contract.md section 15), their backwards, CPU
// and CUDA kernels and Autograd kernels, in one file, a fragment of the kernel_align
// library as activation.cpp is. The gradients flow to x and v (noise and prev are
// constants, as Flow-GRPO's sampler draws the one and detaches the other); the backwards go
// through the dispatcher (torch.compile's AOTAutograd sees them and their fake kernels,
// python/kernel_align/_ops.py); their own gradients (double backward) raise.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

#include "api/ops/flow_sde.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using StepSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                 double, double, double);
using StepBackwardSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, at::ScalarType,
                                                                 at::ScalarType, double, double,
                                                                 double, double,
                                                                 std::array<bool, 2>);
using LogpSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                 double, double, double);
using LogpBackwardSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double,
    double, double, std::array<bool, 2>);

// The options as the contract computes with them (each a Python float rounded to fp32 by
// the front ends' one rule, fp32_option).
FlowSdeOptions step_options(double sigma, double sigma_prev, double noise_level, double sigma_max) {
  return {fp32_option("sigma", sigma), fp32_option("sigma_prev", sigma_prev),
          fp32_option("noise_level", noise_level), fp32_option("sigma_max", sigma_max)};
}

at::Tensor none_like(const at::Tensor& t) {
  return at::empty({0}, t.options());
}

// prev (x's shape, in x's dtype) = x * x_scale + v * v_scale + noise_scale * noise.
at::Tensor flow_sde_step(const at::Tensor& x, const at::Tensor& v, const at::Tensor& noise,
                         double sigma, double sigma_prev, double noise_level, double sigma_max) {
  constexpr const char* op = "flow_sde_step";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView vv = input_view(op, "v", v);
    const ConstTensorView nv = input_view(op, "noise", noise);
    const FlowSdeOptions options = step_options(sigma, sigma_prev, noise_level, sigma_max);
    StandIns outputs({xv, vv, nv});
    detail::flow_sde_step_forward_call(xv, vv, nv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor prev = new_output(x, x.scalar_type());
    flow_sde_step_forward(xv, vv, nv, output_view(op, "prev", prev), options, context_of(x));
    return prev;
  });
}

// (dx, dv) in the dtypes given, where output_mask asks for them (an empty tensor where not).
std::tuple<at::Tensor, at::Tensor> flow_sde_step_backward(
    const at::Tensor& dprev, at::ScalarType dx_dtype, at::ScalarType dv_dtype, double sigma,
    double sigma_prev, double noise_level, double sigma_max, std::array<bool, 2> output_mask) {
  constexpr const char* op = "flow_sde_step_backward";
  return translate_errors(op, [&] {
    const ConstTensorView gv = input_view(op, "dprev", dprev);
    const FlowSdeOptions options = step_options(sigma, sigma_prev, noise_level, sigma_max);
    StandIns outputs({gv});
    std::optional<TensorView> dx_in, dv_in;
    if (output_mask[0]) dx_in = outputs.like(gv, library_dtype(op, "dx_dtype", dx_dtype));
    if (output_mask[1]) dv_in = outputs.like(gv, library_dtype(op, "dv_dtype", dv_dtype));
    detail::flow_sde_step_backward_call(gv, dx_in, dv_in, options);
    check_outputs_fit("dprev", dprev, outputs);
    at::Tensor dx = output_mask[0] ? new_output(dprev, dx_dtype) : none_like(dprev);
    at::Tensor dv = output_mask[1] ? new_output(dprev, dv_dtype) : none_like(dprev);
    std::optional<TensorView> dxv, dvv;
    if (output_mask[0]) dxv = output_view(op, "dx", dx);
    if (output_mask[1]) dvv = output_view(op, "dv", dv);
    flow_sde_step_backward(gv, dxv, dvv, options, context_of(dprev));
    return std::tuple{dx, dv};
  });
}

// logp: fp32 [B], one per sample.
at::Tensor flow_sde_logp(const at::Tensor& x, const at::Tensor& v, const at::Tensor& prev,
                         double sigma, double sigma_prev, double noise_level, double sigma_max) {
  constexpr const char* op = "flow_sde_logp";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView vv = input_view(op, "v", v);
    const ConstTensorView pv = input_view(op, "prev", prev);
    const FlowSdeOptions options = step_options(sigma, sigma_prev, noise_level, sigma_max);
    StandIns outputs({xv, vv, pv});
    detail::flow_sde_logp_forward_call(xv, vv, pv, outputs.per_sample(xv), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor logp = at::empty({x.dim() > 0 ? x.size(0) : 0}, x.options().dtype(at::kFloat));
    flow_sde_logp_forward(xv, vv, pv, output_view(op, "logp", logp), options, context_of(x));
    return logp;
  });
}

// (dx like x, dv like v) where output_mask asks for them.
std::tuple<at::Tensor, at::Tensor> flow_sde_logp_backward(const at::Tensor& x, const at::Tensor& v,
                                                          const at::Tensor& prev,
                                                          const at::Tensor& dlogp, double sigma,
                                                          double sigma_prev, double noise_level,
                                                          double sigma_max,
                                                          std::array<bool, 2> output_mask) {
  constexpr const char* op = "flow_sde_logp_backward";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView vv = input_view(op, "v", v);
    const ConstTensorView pv = input_view(op, "prev", prev);
    const ConstTensorView gv = input_view(op, "dlogp", dlogp);
    const FlowSdeOptions options = step_options(sigma, sigma_prev, noise_level, sigma_max);
    StandIns outputs({xv, vv, pv, gv});
    std::optional<TensorView> dx_in, dv_in;
    if (output_mask[0]) dx_in = outputs.like(xv, xv.dtype);
    if (output_mask[1]) dv_in = outputs.like(vv, vv.dtype);
    detail::flow_sde_logp_backward_call(xv, vv, pv, gv, dx_in, dv_in, options);
    check_outputs_fit("x", x, outputs);
    at::Tensor dx = output_mask[0] ? new_output(x, x.scalar_type()) : none_like(x);
    at::Tensor dv = output_mask[1] ? new_output(v, v.scalar_type()) : none_like(x);
    std::optional<TensorView> dxv, dvv;
    if (output_mask[0]) dxv = output_view(op, "dx", dx);
    if (output_mask[1]) dvv = output_view(op, "dv", dv);
    flow_sde_logp_backward(xv, vv, pv, gv, dxv, dvv, options, context_of(x));
    return std::tuple{dx, dv};
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

void save_step(AutogradContext* ctx, double sigma, double sigma_prev, double noise_level,
               double sigma_max) {
  ctx->saved_data["sigma"] = sigma;
  ctx->saved_data["sigma_prev"] = sigma_prev;
  ctx->saved_data["noise_level"] = noise_level;
  ctx->saved_data["sigma_max"] = sigma_max;
}

double saved(AutogradContext* ctx, const char* name) {
  return ctx->saved_data[name].toDouble();
}

// A backward operator's own gradient: not supported.
[[noreturn]] void no_double_backward(const char* function, const char* file, int line) {
  throw c10::NotImplementedError(
      {function, file, static_cast<std::uint32_t>(line)},
      "kernel_align.flow_sde_step_logp: double backward (the gradient of a gradient) is not "
      "supported; only first-order gradients of this operator are");
}

struct StepFunction : torch::autograd::Function<StepFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& v,
                            const at::Tensor& noise, double sigma, double sigma_prev,
                            double noise_level, double sigma_max) {
    static const auto op = operator_handle<StepSignature>("kernel_align::flow_sde_step");
    save_step(ctx, sigma, sigma_prev, noise_level, sigma_max);
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["v_dtype"] = v.scalar_type();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, v, noise, sigma, sigma_prev, noise_level, sigma_max);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<StepBackwardSignature>("kernel_align::flow_sde_step_backward");
    const std::array<bool, 2> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    if (!mask[0] && !mask[1]) return {{}, {}, {}, {}, {}, {}, {}};
    auto [dx, dv] =
        op.call(grads[0], ctx->saved_data["x_dtype"].toScalarType(),
                ctx->saved_data["v_dtype"].toScalarType(), saved(ctx, "sigma"),
                saved(ctx, "sigma_prev"), saved(ctx, "noise_level"), saved(ctx, "sigma_max"), mask);
    return {mask[0] ? dx : at::Tensor(), mask[1] ? dv : at::Tensor(), {}, {}, {}, {}, {}};
  }
};

struct StepBackwardFunction : torch::autograd::Function<StepBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& dprev,
                               at::ScalarType dx_dtype, at::ScalarType dv_dtype, double sigma,
                               double sigma_prev, double noise_level, double sigma_max,
                               std::array<bool, 2> output_mask) {
    static const auto op =
        operator_handle<StepBackwardSignature>("kernel_align::flow_sde_step_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dx, dv] =
        op.call(dprev, dx_dtype, dv_dtype, sigma, sigma_prev, noise_level, sigma_max, output_mask);
    return {dx, dv};
  }
  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    no_double_backward(__func__, __FILE__, __LINE__);
  }
};

struct LogpFunction : torch::autograd::Function<LogpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& v,
                            const at::Tensor& prev, double sigma, double sigma_prev,
                            double noise_level, double sigma_max) {
    static const auto op = operator_handle<LogpSignature>("kernel_align::flow_sde_logp");
    save_step(ctx, sigma, sigma_prev, noise_level, sigma_max);
    ctx->save_for_backward({x, v, prev});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, v, prev, sigma, sigma_prev, noise_level, sigma_max);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<LogpBackwardSignature>("kernel_align::flow_sde_logp_backward");
    const std::array<bool, 2> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    if (!mask[0] && !mask[1]) return {{}, {}, {}, {}, {}, {}, {}};
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor dlogp = grads[0].is_contiguous() ? grads[0] : grads[0].contiguous();
    auto [dx, dv] = op.call(s[0], s[1], s[2], dlogp, saved(ctx, "sigma"), saved(ctx, "sigma_prev"),
                            saved(ctx, "noise_level"), saved(ctx, "sigma_max"), mask);
    return {mask[0] ? dx : at::Tensor(), mask[1] ? dv : at::Tensor(), {}, {}, {}, {}, {}};
  }
};

struct LogpBackwardFunction : torch::autograd::Function<LogpBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& x, const at::Tensor& v,
                               const at::Tensor& prev, const at::Tensor& dlogp, double sigma,
                               double sigma_prev, double noise_level, double sigma_max,
                               std::array<bool, 2> output_mask) {
    static const auto op =
        operator_handle<LogpBackwardSignature>("kernel_align::flow_sde_logp_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dx, dv] =
        op.call(x, v, prev, dlogp, sigma, sigma_prev, noise_level, sigma_max, output_mask);
    return {dx, dv};
  }
  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    no_double_backward(__func__, __FILE__, __LINE__);
  }
};

at::Tensor flow_sde_step_autograd(const at::Tensor& x, const at::Tensor& v, const at::Tensor& noise,
                                  double sigma, double sigma_prev, double noise_level,
                                  double sigma_max) {
  return StepFunction::apply(x, v, noise, sigma, sigma_prev, noise_level, sigma_max);
}

std::tuple<at::Tensor, at::Tensor> flow_sde_step_backward_autograd(
    const at::Tensor& dprev, at::ScalarType dx_dtype, at::ScalarType dv_dtype, double sigma,
    double sigma_prev, double noise_level, double sigma_max, std::array<bool, 2> output_mask) {
  const variable_list out = StepBackwardFunction::apply(
      dprev, dx_dtype, dv_dtype, sigma, sigma_prev, noise_level, sigma_max, output_mask);
  return {out[0], out[1]};
}

at::Tensor flow_sde_logp_autograd(const at::Tensor& x, const at::Tensor& v, const at::Tensor& prev,
                                  double sigma, double sigma_prev, double noise_level,
                                  double sigma_max) {
  return LogpFunction::apply(x, v, prev, sigma, sigma_prev, noise_level, sigma_max);
}

std::tuple<at::Tensor, at::Tensor> flow_sde_logp_backward_autograd(
    const at::Tensor& x, const at::Tensor& v, const at::Tensor& prev, const at::Tensor& dlogp,
    double sigma, double sigma_prev, double noise_level, double sigma_max,
    std::array<bool, 2> output_mask) {
  const variable_list out = LogpBackwardFunction::apply(x, v, prev, dlogp, sigma, sigma_prev,
                                                        noise_level, sigma_max, output_mask);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("flow_sde_step", &kernel_align::torch_ext::flow_sde_step);
  m.impl("flow_sde_step_backward", &kernel_align::torch_ext::flow_sde_step_backward);
  m.impl("flow_sde_logp", &kernel_align::torch_ext::flow_sde_logp);
  m.impl("flow_sde_logp_backward", &kernel_align::torch_ext::flow_sde_logp_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("flow_sde_step", &kernel_align::torch_ext::flow_sde_step);
  m.impl("flow_sde_step_backward", &kernel_align::torch_ext::flow_sde_step_backward);
  m.impl("flow_sde_logp", &kernel_align::torch_ext::flow_sde_logp);
  m.impl("flow_sde_logp_backward", &kernel_align::torch_ext::flow_sde_logp_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("flow_sde_step", &kernel_align::torch_ext::flow_sde_step_autograd);
  m.impl("flow_sde_step_backward", &kernel_align::torch_ext::flow_sde_step_backward_autograd);
  m.impl("flow_sde_logp", &kernel_align::torch_ext::flow_sde_logp_autograd);
  m.impl("flow_sde_logp_backward", &kernel_align::torch_ext::flow_sde_logp_backward_autograd);
}
