// kernel_align::activation and kernel_align::activation_backward: the elementwise
// activation under the contract (docs/contract.md section 14), their CPU and CUDA kernels
// and the Autograd kernel, in one file, a fragment of the kernel_align library as
// gate_residual.cpp is. The backward goes through the dispatcher (torch.compile's
// AOTAutograd sees both operators and their fake kernels, python/kernel_align/_ops.py); its
// own gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "api/ops/activation.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ActivationSignature = at::Tensor(const at::Tensor&, c10::string_view);
using ActivationBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&,
                                               c10::string_view);

ActivationOptions activation_options(c10::string_view kind) {
  return {activation_from_name(kind)};
}

// y (x's shape and dtype) = act(x).
at::Tensor activation(const at::Tensor& x, c10::string_view kind) {
  constexpr const char* op = "activation";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ActivationOptions options = activation_options(kind);
    StandIns outputs({xv});
    detail::activation_forward_call(xv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor y = new_output(x, x.scalar_type());
    activation_forward(xv, output_view(op, "y", y), options, context_of(x));
    return y;
  });
}

// dx (x's shape and dtype) = dy * act'(x).
at::Tensor activation_backward(const at::Tensor& x, const at::Tensor& dy, c10::string_view kind) {
  constexpr const char* op = "activation_backward";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView dyv = input_view(op, "dy", dy);
    const ActivationOptions options = activation_options(kind);
    StandIns outputs({xv, dyv});
    detail::activation_backward_call(xv, dyv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor dx = new_output(x, x.scalar_type());
    activation_backward(xv, dyv, output_view(op, "dx", dx), options, context_of(x));
    return dx;
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct ActivationFunction : torch::autograd::Function<ActivationFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view kind) {
    static const auto op = operator_handle<ActivationSignature>("kernel_align::activation");
    at::Tensor y;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      y = op.call(x, kind);
    }
    ctx->save_for_backward({x});
    ctx->saved_data["activation"] = std::string(kind);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<ActivationBackwardSignature>("kernel_align::activation_backward");
    const variable_list saved = ctx->get_saved_variables();
    return {op.call(saved[0], grads[0], ctx->saved_data["activation"].toStringView()), {}};
  }
};

struct ActivationBackwardFunction : torch::autograd::Function<ActivationBackwardFunction> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x, const at::Tensor& dy,
                            c10::string_view kind) {
    static const auto op =
        operator_handle<ActivationBackwardSignature>("kernel_align::activation_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, dy, kind);
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.activation: double backward (the gradient of a gradient) is not "
        "supported; only first-order gradients of this operator are");
  }
};

at::Tensor activation_autograd(const at::Tensor& x, c10::string_view kind) {
  return ActivationFunction::apply(x, kind);
}

at::Tensor activation_backward_autograd(const at::Tensor& x, const at::Tensor& dy,
                                        c10::string_view kind) {
  return ActivationBackwardFunction::apply(x, dy, kind);
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("activation", &kernel_align::torch_ext::activation);
  m.impl("activation_backward", &kernel_align::torch_ext::activation_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("activation", &kernel_align::torch_ext::activation);
  m.impl("activation_backward", &kernel_align::torch_ext::activation_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("activation", &kernel_align::torch_ext::activation_autograd);
  m.impl("activation_backward", &kernel_align::torch_ext::activation_backward_autograd);
}
