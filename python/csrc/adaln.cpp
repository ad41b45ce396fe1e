// kernel_align::adaln_modulation and kernel_align::adaln_modulation_backward: LayerNorm with
// AdaLN modulation under the contract (docs/contract.md section 12), their CPU and CUDA
// kernels and the Autograd kernel, in one file, a fragment of the kernel_align library as
// attention.cpp is. The backward goes through the dispatcher (torch.compile's AOTAutograd
// sees both operators and their fake kernels, python/kernel_align/_ops.py); its own
// gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "api/ops/adaln_modulation.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using AdaLnSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                  c10::string_view);
using AdaLnBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, double, c10::string_view);

AdaLnOptions adaln_options(double eps, c10::string_view mode) {
  return {fp32_option("eps", eps), norm_mode_from_name(mode)};
}

// y (x's shape and dtype) = LayerNorm(x) * (1 + scale) + shift.
at::Tensor adaln_modulation(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                            double eps, c10::string_view mode) {
  constexpr const char* op = "adaln_modulation";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView sv = input_view(op, "scale", scale);
    const ConstTensorView tv = input_view(op, "shift", shift);
    const AdaLnOptions options = adaln_options(eps, mode);
    StandIns outputs({xv, sv, tv});
    detail::adaln_forward_call(xv, sv, tv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor y = new_output(x, x.scalar_type());
    adaln_modulation_forward(xv, sv, tv, output_view(op, "y", y), options, context_of(x));
    return y;
  });
}

// out= (the Python function's): y written into `out`, named so in errors.
void adaln_modulation_out(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                          double eps, c10::string_view mode, const at::Tensor& out) {
  constexpr const char* op = "adaln_modulation";
  constexpr Rename kOutName[] = {{"y", "out"}};
  translate_errors(op, kOutName, [&] {
    adaln_modulation_forward(input_view(op, "x", x), input_view(op, "scale", scale),
                             input_view(op, "shift", shift), output_view(op, "out", out),
                             adaln_options(eps, mode), context_of(x));
  });
}

// (dx like x, dscale and dshift like scale) from dy.
std::tuple<at::Tensor, at::Tensor, at::Tensor> adaln_modulation_backward(const at::Tensor& x,
                                                                         const at::Tensor& scale,
                                                                         const at::Tensor& dy,
                                                                         double eps,
                                                                         c10::string_view mode) {
  constexpr const char* op = "adaln_modulation_backward";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView sv = input_view(op, "scale", scale);
    const ConstTensorView dyv = input_view(op, "dy", dy);
    const AdaLnOptions options = adaln_options(eps, mode);
    StandIns outputs({xv, sv, dyv});
    const TensorView dx_in = outputs.like(xv, xv.dtype);
    const TensorView dscale_in = outputs.like(sv, sv.dtype);
    const TensorView dshift_in = outputs.like(sv, sv.dtype);
    detail::adaln_backward_call(xv, sv, dyv, dx_in, dscale_in, dshift_in, options);
    check_outputs_fit("x", x, outputs);
    at::Tensor dx = new_output(x, x.scalar_type());
    at::Tensor dscale = new_output(scale, scale.scalar_type());
    at::Tensor dshift = new_output(scale, scale.scalar_type());
    adaln_modulation_backward(xv, sv, dyv, output_view(op, "dx", dx),
                              output_view(op, "dscale", dscale), output_view(op, "dshift", dshift),
                              options, context_of(x));
    return std::tuple{dx, dscale, dshift};
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct AdaLnFunction : torch::autograd::Function<AdaLnFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& shift, double eps, c10::string_view mode) {
    static const auto op = operator_handle<AdaLnSignature>("kernel_align::adaln_modulation");
    at::Tensor y;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      y = op.call(x, scale, shift, eps, mode);
    }
    ctx->save_for_backward({x, scale});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["mode"] = std::string(mode);
    ctx->saved_data["shift_dtype"] = shift.scalar_type();
    ctx->saved_data["shift_shape"] = shift.sizes();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<AdaLnBackwardSignature>("kernel_align::adaln_modulation_backward");
    const variable_list saved = ctx->get_saved_variables();
    auto [dx, dscale, dshift] =
        op.call(saved[0], saved[1], grads[0], ctx->saved_data["eps"].toDouble(),
                ctx->saved_data["mode"].toStringView());
    // dshift as shift is: [B, D] or [B, 1, D], of its dtype (the sums are scale's dtype).
    dshift = dshift.reshape(ctx->saved_data["shift_shape"].toIntVector())
                 .to(ctx->saved_data["shift_dtype"].toScalarType());
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(),
            ctx->needs_input_grad(1) ? dscale : at::Tensor(),
            ctx->needs_input_grad(2) ? dshift : at::Tensor(),
            {},
            {}};
  }
};

struct AdaLnBackwardFunction : torch::autograd::Function<AdaLnBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& x,
                               const at::Tensor& scale, const at::Tensor& dy, double eps,
                               c10::string_view mode) {
    static const auto op =
        operator_handle<AdaLnBackwardSignature>("kernel_align::adaln_modulation_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dx, dscale, dshift] = op.call(x, scale, dy, eps, mode);
    return {dx, dscale, dshift};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.adaln_modulation: double backward (the gradient of a gradient) is not "
        "supported; only first-order gradients of this operator are");
  }
};

at::Tensor adaln_modulation_autograd(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& shift, double eps, c10::string_view mode) {
  return AdaLnFunction::apply(x, scale, shift, eps, mode);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> adaln_modulation_backward_autograd(
    const at::Tensor& x, const at::Tensor& scale, const at::Tensor& dy, double eps,
    c10::string_view mode) {
  const variable_list grads = AdaLnBackwardFunction::apply(x, scale, dy, eps, mode);
  return {grads[0], grads[1], grads[2]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("adaln_modulation", &kernel_align::torch_ext::adaln_modulation);
  m.impl("adaln_modulation_out", &kernel_align::torch_ext::adaln_modulation_out);
  m.impl("adaln_modulation_backward", &kernel_align::torch_ext::adaln_modulation_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("adaln_modulation", &kernel_align::torch_ext::adaln_modulation);
  m.impl("adaln_modulation_out", &kernel_align::torch_ext::adaln_modulation_out);
  m.impl("adaln_modulation_backward", &kernel_align::torch_ext::adaln_modulation_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("adaln_modulation", &kernel_align::torch_ext::adaln_modulation_autograd);
  m.impl("adaln_modulation_backward", &kernel_align::torch_ext::adaln_modulation_backward_autograd);
}
