// kernel_align::true_cfg: true classifier-free guidance with Qwen-Image's norm rescale
// under the contract (docs/contract.md section 17), its backward, CPU and CUDA kernels and
// Autograd kernels, in one file, a fragment of the kernel_align library as activation.cpp
// is. The gradients flow to cond and uncond (the transformer's two predictions); the
// backward goes through the dispatcher (torch.compile's AOTAutograd sees it and its fake
// kernel, python/kernel_align/_ops.py); its own gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

#include "api/ops/true_cfg.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using CfgSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using CfgBackwardSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                const at::Tensor&,
                                                                const at::Tensor&, double,
                                                                std::array<bool, 2>);

// The guidance scale as the contract computes with it (a Python float rounded to fp32 by
// the front ends' one rule, fp32_option).
TrueCfgOptions cfg_options(double scale) {
  return {fp32_option("scale", scale)};
}

at::Tensor none_like(const at::Tensor& t) {
  return at::empty({0}, t.options());
}

// v (cond's shape and dtype) = c * (|cond| / |c|), c = uncond + scale (cond - uncond), per
// row.
at::Tensor true_cfg(const at::Tensor& cond, const at::Tensor& uncond, double scale) {
  constexpr const char* op = "true_cfg";
  return translate_errors(op, [&] {
    const ConstTensorView cv = input_view(op, "cond", cond);
    const ConstTensorView uv = input_view(op, "uncond", uncond);
    const TrueCfgOptions options = cfg_options(scale);
    StandIns outputs({cv, uv});
    detail::true_cfg_forward_call(cv, uv, outputs.like(cv, cv.dtype), options);
    check_outputs_fit("cond", cond, outputs);
    at::Tensor v = new_output(cond, cond.scalar_type());
    true_cfg_forward(cv, uv, output_view(op, "v", v), options, context_of(cond));
    return v;
  });
}

// (dcond like cond, duncond like uncond) where output_mask asks for them (an empty tensor
// where not).
std::tuple<at::Tensor, at::Tensor> true_cfg_backward(const at::Tensor& cond,
                                                     const at::Tensor& uncond, const at::Tensor& dv,
                                                     double scale,
                                                     std::array<bool, 2> output_mask) {
  constexpr const char* op = "true_cfg_backward";
  return translate_errors(op, [&] {
    const ConstTensorView cv = input_view(op, "cond", cond);
    const ConstTensorView uv = input_view(op, "uncond", uncond);
    const ConstTensorView gv = input_view(op, "dv", dv);
    const TrueCfgOptions options = cfg_options(scale);
    StandIns outputs({cv, uv, gv});
    std::optional<TensorView> dcond_in, duncond_in;
    if (output_mask[0]) dcond_in = outputs.like(cv, cv.dtype);
    if (output_mask[1]) duncond_in = outputs.like(uv, uv.dtype);
    detail::true_cfg_backward_call(cv, uv, gv, dcond_in, duncond_in, options);
    check_outputs_fit("cond", cond, outputs);
    at::Tensor dcond = output_mask[0] ? new_output(cond, cond.scalar_type()) : none_like(cond);
    at::Tensor duncond =
        output_mask[1] ? new_output(uncond, uncond.scalar_type()) : none_like(cond);
    std::optional<TensorView> dcv, duv;
    if (output_mask[0]) dcv = output_view(op, "dcond", dcond);
    if (output_mask[1]) duv = output_view(op, "duncond", duncond);
    true_cfg_backward(cv, uv, gv, dcv, duv, options, context_of(cond));
    return std::tuple{dcond, duncond};
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct CfgFunction : torch::autograd::Function<CfgFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& cond, const at::Tensor& uncond,
                            double scale) {
    static const auto op = operator_handle<CfgSignature>("kernel_align::true_cfg");
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({cond, uncond});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(cond, uncond, scale);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = operator_handle<CfgBackwardSignature>("kernel_align::true_cfg_backward");
    const std::array<bool, 2> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    if (!mask[0] && !mask[1]) return {{}, {}, {}};
    const variable_list s = ctx->get_saved_variables();
    auto [dcond, duncond] =
        op.call(s[0], s[1], grads[0], ctx->saved_data["scale"].toDouble(), mask);
    return {mask[0] ? dcond : at::Tensor(), mask[1] ? duncond : at::Tensor(), {}};
  }
};

struct CfgBackwardFunction : torch::autograd::Function<CfgBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& cond,
                               const at::Tensor& uncond, const at::Tensor& dv, double scale,
                               std::array<bool, 2> output_mask) {
    static const auto op = operator_handle<CfgBackwardSignature>("kernel_align::true_cfg_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dcond, duncond] = op.call(cond, uncond, dv, scale, output_mask);
    return {dcond, duncond};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.true_cfg: double backward (the gradient of a gradient) is not "
        "supported; only first-order gradients of this operator are");
  }
};

at::Tensor true_cfg_autograd(const at::Tensor& cond, const at::Tensor& uncond, double scale) {
  return CfgFunction::apply(cond, uncond, scale);
}

std::tuple<at::Tensor, at::Tensor> true_cfg_backward_autograd(const at::Tensor& cond,
                                                              const at::Tensor& uncond,
                                                              const at::Tensor& dv, double scale,
                                                              std::array<bool, 2> output_mask) {
  const variable_list out = CfgBackwardFunction::apply(cond, uncond, dv, scale, output_mask);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("true_cfg", &kernel_align::torch_ext::true_cfg);
  m.impl("true_cfg_backward", &kernel_align::torch_ext::true_cfg_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("true_cfg", &kernel_align::torch_ext::true_cfg);
  m.impl("true_cfg_backward", &kernel_align::torch_ext::true_cfg_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("true_cfg", &kernel_align::torch_ext::true_cfg_autograd);
  m.impl("true_cfg_backward", &kernel_align::torch_ext::true_cfg_backward_autograd);
}
