// kernel_align::attention and kernel_align::attention_backward: joint attention under the
// contract (docs/contract.md section 11), their CPU and CUDA kernels and attention's
// Autograd kernel, in one file, a fragment of the kernel_align library as linear.cpp is.
//
// attention's backward is attention_backward through the dispatcher (so torch.compile's
// AOTAutograd sees both operators and their fake kernels, python/kernel_align/_ops.py);
// attention_backward's own gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "api/ops/attention.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using OptionalTensor = std::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using AttentionSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const OptionalTensor&, c10::string_view);
using AttentionBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptionalTensor&,
    const at::Tensor&, const at::Tensor&, c10::string_view);

// out (q's shape and dtype, laid out as q) = attention of q, k, v over the mask's tokens.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const OptionalTensor& mask, c10::string_view layout) {
  constexpr const char* op = "attention";
  return translate_errors(op, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const ConstTensorView vv = input_view(op, "v", v);
    const auto mv = mask_view(op, "mask", mask);
    const AttentionOptions options{layout_from_name(layout)};
    StandIns outputs({qv, kv, vv, mv});
    detail::attention_forward_call(qv, kv, vv, mv, outputs.like(qv, qv.dtype), options);
    check_outputs_fit("q", q, outputs);
    at::Tensor out = new_output(q, q.scalar_type());
    attention_forward(qv, kv, vv, mv, output_view(op, "out", out), options, context_of(q));
    return out;
  });
}

// (dq, dk, dv), each of the dtype of its input, from the forward's out and its gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptionalTensor& mask,
    const at::Tensor& out, const at::Tensor& dout, c10::string_view layout) {
  constexpr const char* op = "attention_backward";
  return translate_errors(op, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const ConstTensorView vv = input_view(op, "v", v);
    const auto mv = mask_view(op, "mask", mask);
    const ConstTensorView ov = input_view(op, "out", out);
    const ConstTensorView dov = input_view(op, "dout", dout);
    const AttentionOptions options{layout_from_name(layout)};
    StandIns outputs({qv, kv, vv, mv, ov, dov});
    const TensorView dq_in = outputs.like(qv, qv.dtype);
    const TensorView dk_in = outputs.like(kv, kv.dtype);
    const TensorView dv_in = outputs.like(vv, vv.dtype);
    detail::attention_backward_call(qv, kv, vv, mv, ov, dov, dq_in, dk_in, dv_in, options);
    check_outputs_fit("q", q, outputs);
    at::Tensor dq = new_output(q, q.scalar_type());
    at::Tensor dk = new_output(k, k.scalar_type());
    at::Tensor dv = new_output(v, v.scalar_type());
    attention_backward(qv, kv, vv, mv, ov, dov, output_view(op, "dq", dq),
                       output_view(op, "dk", dk), output_view(op, "dv", dv), options,
                       context_of(q));
    return std::tuple{dq, dk, dv};
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const OptionalTensor& mask,
                            c10::string_view layout) {
    static const auto op = operator_handle<AttentionSignature>("kernel_align::attention");
    at::Tensor out;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = op.call(q, k, v, mask, layout);
    }
    ctx->save_for_backward({q, k, v, mask.value_or(at::Tensor()), out});
    ctx->saved_data["layout"] = std::string(layout);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<AttentionBackwardSignature>("kernel_align::attention_backward");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& mask = saved[3];
    // Through the dispatcher: with create_graph=True its Autograd kernel records a node.
    auto [dq, dk, dv] =
        op.call(saved[0], saved[1], saved[2], mask.defined() ? OptionalTensor(mask) : std::nullopt,
                saved[4], grads[0], ctx->saved_data["layout"].toStringView());
    return {ctx->needs_input_grad(0) ? dq : at::Tensor(),
            ctx->needs_input_grad(1) ? dk : at::Tensor(),
            ctx->needs_input_grad(2) ? dv : at::Tensor(),
            {},
            {}};
  }
};

struct AttentionBackwardFunction : torch::autograd::Function<AttentionBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const OptionalTensor& mask,
                               const at::Tensor& out, const at::Tensor& dout,
                               c10::string_view layout) {
    static const auto op =
        operator_handle<AttentionBackwardSignature>("kernel_align::attention_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dq, dk, dv] = op.call(q, k, v, mask, out, dout, layout);
    return {dq, dk, dv};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.attention: double backward (the gradient of a gradient, e.g. a gradient "
        "penalty through torch.autograd.grad(..., create_graph=True)) is not supported; only "
        "first-order gradients of this operator are");
  }
};

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const OptionalTensor& mask, c10::string_view layout) {
  return AttentionFunction::apply(q, k, v, mask, layout);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptionalTensor& mask,
    const at::Tensor& out, const at::Tensor& dout, c10::string_view layout) {
  const variable_list grads = AttentionBackwardFunction::apply(q, k, v, mask, out, dout, layout);
  return {grads[0], grads[1], grads[2]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("attention", &kernel_align::torch_ext::attention);
  m.impl("attention_backward", &kernel_align::torch_ext::attention_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("attention", &kernel_align::torch_ext::attention);
  m.impl("attention_backward", &kernel_align::torch_ext::attention_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("attention", &kernel_align::torch_ext::attention_autograd);
  m.impl("attention_backward", &kernel_align::torch_ext::attention_backward_autograd);
}
