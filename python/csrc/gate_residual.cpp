// kernel_align::adaln_gate_residual and kernel_align::adaln_gate_residual_backward: the
// gated residual out = x + gate * y under the contract (docs/contract.md section 13), their
// CPU and CUDA kernels and the Autograd kernel, in one file, a fragment of the kernel_align
// library as adaln.cpp is. x's gradient is the upstream gradient itself; the backward
// operator gives y's and the gate's, through the dispatcher (torch.compile's AOTAutograd
// sees both operators and their fake kernels, python/kernel_align/_ops.py); its own
// gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "api/ops/adaln_gate_residual.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using GateSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 c10::string_view);
using GateBackwardSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                 const at::Tensor&,
                                                                 const at::Tensor&,
                                                                 c10::string_view);

// out (x's shape and dtype) = x + gate * y.
at::Tensor adaln_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                               c10::string_view mode) {
  constexpr const char* op = "adaln_gate_residual";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView gv = input_view(op, "gate", gate);
    const ConstTensorView yv = input_view(op, "y", y);
    const GateResidualOptions options{norm_mode_from_name(mode)};
    StandIns outputs({xv, gv, yv});
    detail::gate_residual_forward_call(xv, gv, yv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor out = new_output(x, x.scalar_type());
    adaln_gate_residual_forward(xv, gv, yv, output_view(op, "out", out), options, context_of(x));
    return out;
  });
}

// out= (the Python function's): the result written into `out` (which may be x or y).
void adaln_gate_residual_out(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                             c10::string_view mode, const at::Tensor& out) {
  constexpr const char* op = "adaln_gate_residual";
  translate_errors(op, [&] {
    adaln_gate_residual_forward(input_view(op, "x", x), input_view(op, "gate", gate),
                                input_view(op, "y", y), output_view(op, "out", out),
                                GateResidualOptions{norm_mode_from_name(mode)}, context_of(x));
  });
}

// (dy like y, dgate like gate) from dout.
std::tuple<at::Tensor, at::Tensor> adaln_gate_residual_backward(const at::Tensor& gate,
                                                                const at::Tensor& y,
                                                                const at::Tensor& dout,
                                                                c10::string_view mode) {
  constexpr const char* op = "adaln_gate_residual_backward";
  return translate_errors(op, [&] {
    const ConstTensorView gv = input_view(op, "gate", gate);
    const ConstTensorView yv = input_view(op, "y", y);
    const ConstTensorView dv = input_view(op, "dout", dout);
    const GateResidualOptions options{norm_mode_from_name(mode)};
    StandIns outputs({gv, yv, dv});
    const TensorView dy_in = outputs.like(yv, yv.dtype);
    const TensorView dgate_in = outputs.like(gv, gv.dtype);
    detail::gate_residual_backward_call(gv, yv, dv, dy_in, dgate_in, options);
    check_outputs_fit("y", y, outputs);
    at::Tensor dy = new_output(y, y.scalar_type());
    at::Tensor dgate = new_output(gate, gate.scalar_type());
    adaln_gate_residual_backward(gv, yv, dv, output_view(op, "dy", dy),
                                 output_view(op, "dgate", dgate), options, context_of(y));
    return std::tuple{dy, dgate};
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct GateFunction : torch::autograd::Function<GateFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                            const at::Tensor& y, c10::string_view mode) {
    static const auto op = operator_handle<GateSignature>("kernel_align::adaln_gate_residual");
    at::Tensor out;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = op.call(x, gate, y, mode);
    }
    ctx->save_for_backward({gate, y});
    ctx->saved_data["mode"] = std::string(mode);
    ctx->saved_data["x_dtype"] = x.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<GateBackwardSignature>("kernel_align::adaln_gate_residual_backward");
    const variable_list saved = ctx->get_saved_variables();
    auto [dy, dgate] =
        op.call(saved[0], saved[1], grads[0], ctx->saved_data["mode"].toStringView());
    // x's gradient is dout itself, in x's dtype.
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) dx = grads[0].to(ctx->saved_data["x_dtype"].toScalarType());
    return {dx,
            ctx->needs_input_grad(1) ? dgate : at::Tensor(),
            ctx->needs_input_grad(2) ? dy : at::Tensor(),
            {}};
  }
};

struct GateBackwardFunction : torch::autograd::Function<GateBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& gate,
                               const at::Tensor& y, const at::Tensor& dout, c10::string_view mode) {
    static const auto op =
        operator_handle<GateBackwardSignature>("kernel_align::adaln_gate_residual_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dy, dgate] = op.call(gate, y, dout, mode);
    return {dy, dgate};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.adaln_gate_residual: double backward (the gradient of a gradient) is not "
        "supported; only first-order gradients of this operator are");
  }
};

at::Tensor adaln_gate_residual_autograd(const at::Tensor& x, const at::Tensor& gate,
                                        const at::Tensor& y, c10::string_view mode) {
  return GateFunction::apply(x, gate, y, mode);
}

std::tuple<at::Tensor, at::Tensor> adaln_gate_residual_backward_autograd(const at::Tensor& gate,
                                                                         const at::Tensor& y,
                                                                         const at::Tensor& dout,
                                                                         c10::string_view mode) {
  const variable_list grads = GateBackwardFunction::apply(gate, y, dout, mode);
  return {grads[0], grads[1]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("adaln_gate_residual", &kernel_align::torch_ext::adaln_gate_residual);
  m.impl("adaln_gate_residual_out", &kernel_align::torch_ext::adaln_gate_residual_out);
  m.impl("adaln_gate_residual_backward", &kernel_align::torch_ext::adaln_gate_residual_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("adaln_gate_residual", &kernel_align::torch_ext::adaln_gate_residual);
  m.impl("adaln_gate_residual_out", &kernel_align::torch_ext::adaln_gate_residual_out);
  m.impl("adaln_gate_residual_backward", &kernel_align::torch_ext::adaln_gate_residual_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("adaln_gate_residual", &kernel_align::torch_ext::adaln_gate_residual_autograd);
  m.impl("adaln_gate_residual_backward",
         &kernel_align::torch_ext::adaln_gate_residual_backward_autograd);
}
