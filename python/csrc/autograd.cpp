// Autograd kernels of the three differentiable operators (qk_rmsnorm, multi_axis_rope,
// qk_norm_rope), registered for the Autograd dispatch key. Each records a
// torch::autograd::Function whose forward redispatches to the operator's own kernel
// below autograd and whose backward calls the matching *_backward operator, so eager
// calls, the autograd engine and torch.compile (AOTAutograd traces these through the
// dispatcher, reaching the fake kernels) all see the same operators.
//
// The backward operators have Autograd kernels too, so that a gradient computed with
// create_graph=True is never silently a constant: multi_axis_rope_backward is linear in dy
// and differentiable to any order (its gradient is the forward rotation); the gradient of
// qk_rmsnorm_backward or qk_norm_rope_backward (double backward, as a gradient penalty
// needs) is not implemented and raises a clear error when it is asked for.
//
// The in-place operators (multi_axis_rope_, qk_norm_rope_) get the two kernels torch
// generates for its own in-place ops: an ADInplaceOrView kernel that bumps the version
// counter of every tensor the op writes (so autograd refuses a backward that would read a
// saved tensor's overwritten value, and an inference tensor cannot be written outside
// inference mode), and an Autograd kernel: multi_axis_rope_ rebases x's history like any
// in-place op (its backward needs only the tables), qk_norm_rope_ refuses tensors that
// require grad (its backward needs the q and k it overwrites). The out= variants
// (*_out) get the same ADInplaceOrView kernel, boxed and shared by every mutating op
// (the written tensors are read off the schema), and one boxed Autograd kernel: torch's
// rule for out= functions, no gradient, so an argument that requires grad is refused.
//
// They are C++ rather than torch.library.register_autograd's Python kernel because every
// call passes through the Autograd key, gradients or not: after a kernel that streamed
// tens of MB through the caches, that Python round trip cost about 0.1 ms per call
// (docs/performance.md, "Binding overhead").
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<at::Tensor>;

// The operators' C++ signatures, as the CPU kernels in ops.cpp declare them; `typed`
// checks each against the registered schema.
using QkRmsNormSignature = at::Tensor(const at::Tensor&, const OptionalTensor&, double,
                                      c10::string_view, std::optional<at::ScalarType>);
using QkRmsNormBackwardSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                      const at::Tensor&,
                                                                      const OptionalTensor&, double,
                                                                      c10::string_view, bool);
using RopeSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 c10::string_view, c10::string_view);
using RopeInplaceSignature = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  c10::string_view, c10::string_view);
using QkNormRopeSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptionalTensor&, const OptionalTensor&,
    const OptionalTensor&, const OptionalTensor&, const at::Tensor&, const at::Tensor&,
    std::int64_t, double, c10::string_view, c10::string_view, c10::string_view,
    std::optional<at::ScalarType>);
using QkNormRopeInplaceSignature = void(const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                        const OptionalTensor&, const OptionalTensor&,
                                        const OptionalTensor&, const at::Tensor&, const at::Tensor&,
                                        std::int64_t, double, c10::string_view, c10::string_view,
                                        c10::string_view);
using QkNormRopeBackwardSignature =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
        const OptionalTensor&, const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
        const at::Tensor&, const at::Tensor&, std::int64_t, double, c10::string_view,
        c10::string_view, c10::string_view, std::array<bool, 4>);

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Runs `op` on the kernel below autograd (the CPU kernel, or the fake one when traced).
template <class Signature, class... Args>
auto redispatch(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(std::forward<Args>(args)...);
}

OptionalTensor optional_of(const at::Tensor& t) {
  return t.defined() ? OptionalTensor(t) : std::nullopt;
}

// The ops give cos/sin no gradient: refuse tables that require one rather than drop it.
// Checked only where autograd records the call.
void check_constant_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin) {
  if (c10::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())) {
    raise_value_error(op,
                      "arguments 'cos', 'sin': expected constant tables (no gradient flows "
                      "into them), found a table that requires grad (pass .detach())");
  }
}

// The gradient of a gradient of `op`: not implemented, so the backward operator's node
// raises when create_graph=True asked for a graph and a loss reaches back through it.
[[noreturn]] void no_double_backward(const char* op) {
  throw c10::NotImplementedError(
      {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
      std::string("kernel_align.") + op +
          ": double backward (the gradient of a gradient, e.g. a gradient penalty through "
          "torch.autograd.grad(..., create_graph=True)) is not supported; only first-order "
          "gradients of this operator are");
}

struct QkRmsNormFunction : torch::autograd::Function<QkRmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptionalTensor& weight,
                            double eps, c10::string_view mode,
                            std::optional<at::ScalarType> out_dtype) {
    static const auto op = operator_handle<QkRmsNormSignature>("kernel_align::qk_rmsnorm");
    ctx->save_for_backward({x, weight.value_or(at::Tensor())});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["mode"] = std::string(mode);
    return redispatch(op, x, weight, eps, mode, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<QkRmsNormBackwardSignature>("kernel_align::qk_rmsnorm_backward");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[1];
    // Autograd's inputs are x and, when given, the weight (edge 1).
    const bool compute_dw = weight.defined() && ctx->needs_input_grad(1);
    // Through the dispatcher: with create_graph=True its Autograd kernel records a node.
    auto [dx, dw] =
        op.call(saved[0], grads[0], optional_of(weight), ctx->saved_data["eps"].toDouble(),
                ctx->saved_data["mode"].toStringView(), compute_dw);
    return {dx, compute_dw ? dw : at::Tensor(), {}, {}, {}};
  }
};

// qk_rmsnorm_backward itself: runs below autograd; its own gradient raises.
struct QkRmsNormBackwardFunction : torch::autograd::Function<QkRmsNormBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& x, const at::Tensor& dy,
                               const OptionalTensor& weight, double eps, c10::string_view mode,
                               bool compute_dw) {
    static const auto op =
        operator_handle<QkRmsNormBackwardSignature>("kernel_align::qk_rmsnorm_backward");
    auto [dx, dw] = redispatch(op, x, dy, weight, eps, mode, compute_dw);
    return {dx, dw};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    no_double_backward("qk_rmsnorm");
  }
};

// What the RoPE backwards read: the tables and the options.
void save_rope(AutogradContext* ctx, const at::Tensor& cos, const at::Tensor& sin,
               c10::string_view pairing, c10::string_view layout) {
  ctx->save_for_backward({cos, sin});
  ctx->saved_data["pairing"] = std::string(pairing);
  ctx->saved_data["layout"] = std::string(layout);
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, c10::string_view pairing,
                            c10::string_view layout) {
    static const auto op = operator_handle<RopeSignature>("kernel_align::multi_axis_rope");
    save_rope(ctx, cos, sin, pairing, layout);
    return redispatch(op, x, cos, sin, pairing, layout);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = operator_handle<RopeSignature>("kernel_align::multi_axis_rope_backward");
    const variable_list saved = ctx->get_saved_variables();
    // Through the dispatcher: with create_graph=True its Autograd kernel records a node.
    at::Tensor dx = op.call(grads[0], saved[0], saved[1], ctx->saved_data["pairing"].toStringView(),
                            ctx->saved_data["layout"].toStringView());
    return {dx, {}, {}, {}, {}};
  }
};

// multi_axis_rope_ recorded as an in-place op of x: mark_dirty rebases x's history onto
// this node (through CopySlices where x is a view) and bumps x's version, once, as torch's
// in-place ops do; hence the redispatch below ADInplaceOrView, whose kernel would bump it
// again. Rotation is linear, so the backward is RopeFunction's: it needs only the tables,
// not the x this overwrites.
struct RopeInplaceFunction : torch::autograd::Function<RopeInplaceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, c10::string_view pairing,
                            c10::string_view layout) {
    static const auto op = operator_handle<RopeInplaceSignature>("kernel_align::multi_axis_rope_");
    save_rope(ctx, cos, sin, pairing, layout);
    redispatch(op, x, cos, sin, pairing, layout);
    ctx->mark_dirty({x});
    return x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return RopeFunction::backward(ctx, std::move(grads));
  }
};

// multi_axis_rope_backward is the transpose rotation of dy: linear, so its gradient is
// the forward rotation of the incoming gradient, through the forward operator (itself
// differentiable): every order of derivative is exact.
struct RopeBackwardFunction : torch::autograd::Function<RopeBackwardFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& cos,
                            const at::Tensor& sin, c10::string_view pairing,
                            c10::string_view layout) {
    static const auto op = operator_handle<RopeSignature>("kernel_align::multi_axis_rope_backward");
    save_rope(ctx, cos, sin, pairing, layout);
    return redispatch(op, dy, cos, sin, pairing, layout);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = operator_handle<RopeSignature>("kernel_align::multi_axis_rope");
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor ddy =
        op.call(grads[0], saved[0], saved[1], ctx->saved_data["pairing"].toStringView(),
                ctx->saved_data["layout"].toStringView());
    return {ddy, {}, {}, {}, {}};
  }
};

constexpr std::size_t kWeights = 4;  // text q, text k, image q, image k: the schema's order

struct QkNormRopeFunction : torch::autograd::Function<QkNormRopeFunction> {
  static constexpr std::size_t kArguments = 14;  // forward's, after the context

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const OptionalTensor& text_q_weight,
                               const OptionalTensor& text_k_weight,
                               const OptionalTensor& image_q_weight,
                               const OptionalTensor& image_k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, std::int64_t text_len, double eps,
                               c10::string_view mode, c10::string_view pairing,
                               c10::string_view layout, std::optional<at::ScalarType> out_dtype) {
    static const auto op = operator_handle<QkNormRopeSignature>("kernel_align::qk_norm_rope");
    ctx->save_for_backward(
        {q, k, text_q_weight.value_or(at::Tensor()), text_k_weight.value_or(at::Tensor()),
         image_q_weight.value_or(at::Tensor()), image_k_weight.value_or(at::Tensor()), cos, sin});
    ctx->saved_data["text_len"] = text_len;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["mode"] = std::string(mode);
    ctx->saved_data["pairing"] = std::string(pairing);
    ctx->saved_data["layout"] = std::string(layout);
    auto [q_out, k_out] =
        redispatch(op, q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight, cos, sin,
                   text_len, eps, mode, pairing, layout, out_dtype);
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<QkNormRopeBackwardSignature>("kernel_align::qk_norm_rope_backward");
    const variable_list saved = ctx->get_saved_variables();
    // Autograd's inputs are q, k (edges 0 and 1), the weights that were given, cos, sin.
    std::array<bool, kWeights> compute_dw{};
    std::array<OptionalTensor, kWeights> weights;
    std::size_t edge = 2;
    for (std::size_t i = 0; i < kWeights; ++i) {
      weights[i] = optional_of(saved[2 + i]);
      if (weights[i]) compute_dw[i] = ctx->needs_input_grad(edge++);
    }
    // Through the dispatcher: with create_graph=True its Autograd kernel records a node.
    auto [dq, dk, dw0, dw1, dw2, dw3] = op.call(
        saved[0], saved[1], grads[0], grads[1], weights[0], weights[1], weights[2], weights[3],
        saved[6], saved[7], ctx->saved_data["text_len"].toInt(), ctx->saved_data["eps"].toDouble(),
        ctx->saved_data["mode"].toStringView(), ctx->saved_data["pairing"].toStringView(),
        ctx->saved_data["layout"].toStringView(), compute_dw);
    const std::array<at::Tensor, kWeights> dw{dw0, dw1, dw2, dw3};
    variable_list grads_in(kArguments);  // none for cos, sin and the options
    grads_in[0] = dq;
    grads_in[1] = dk;
    for (std::size_t i = 0; i < kWeights; ++i) {
      if (compute_dw[i]) grads_in[2 + i] = dw[i];
    }
    return grads_in;
  }
};

// qk_norm_rope_backward itself: runs below autograd; its own gradient raises.
struct QkNormRopeBackwardFunction : torch::autograd::Function<QkNormRopeBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& dq_out, const at::Tensor& dk_out,
                               const OptionalTensor& text_q_weight,
                               const OptionalTensor& text_k_weight,
                               const OptionalTensor& image_q_weight,
                               const OptionalTensor& image_k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, std::int64_t text_len, double eps,
                               c10::string_view mode, c10::string_view pairing,
                               c10::string_view layout, std::array<bool, kWeights> compute_dw) {
    static const auto op =
        operator_handle<QkNormRopeBackwardSignature>("kernel_align::qk_norm_rope_backward");
    auto [dq, dk, dw0, dw1, dw2, dw3] =
        redispatch(op, q, k, dq_out, dk_out, text_q_weight, text_k_weight, image_q_weight,
                   image_k_weight, cos, sin, text_len, eps, mode, pairing, layout, compute_dw);
    return {dq, dk, dw0, dw1, dw2, dw3};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    no_double_backward("qk_norm_rope");
  }
};

at::Tensor qk_rmsnorm_autograd(const at::Tensor& x, const OptionalTensor& weight, double eps,
                               c10::string_view mode, std::optional<at::ScalarType> out_dtype) {
  return QkRmsNormFunction::apply(x, weight, eps, mode, out_dtype);
}

at::Tensor multi_axis_rope_autograd(const at::Tensor& x, const at::Tensor& cos,
                                    const at::Tensor& sin, c10::string_view pairing,
                                    c10::string_view layout) {
  check_constant_tables("multi_axis_rope", cos, sin);
  return RopeFunction::apply(x, cos, sin, pairing, layout);
}

std::tuple<at::Tensor, at::Tensor> qk_norm_rope_autograd(
    const at::Tensor& q, const at::Tensor& k, const OptionalTensor& text_q_weight,
    const OptionalTensor& text_k_weight, const OptionalTensor& image_q_weight,
    const OptionalTensor& image_k_weight, const at::Tensor& cos, const at::Tensor& sin,
    std::int64_t text_len, double eps, c10::string_view mode, c10::string_view pairing,
    c10::string_view layout, std::optional<at::ScalarType> out_dtype) {
  check_constant_tables("qk_norm_rope", cos, sin);
  const variable_list out =
      QkNormRopeFunction::apply(q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight,
                                cos, sin, text_len, eps, mode, pairing, layout, out_dtype);
  return {out[0], out[1]};
}

// The in-place ops' Autograd kernels. Their tables follow the functional ops' rule; the
// redispatch goes on to the ADInplaceOrView kernels below, which bump the versions.
void multi_axis_rope_inplace_autograd(c10::DispatchKeySet keys, const at::Tensor& x,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      c10::string_view pairing, c10::string_view layout) {
  static const auto op = operator_handle<RopeInplaceSignature>("kernel_align::multi_axis_rope_");
  check_constant_tables("multi_axis_rope_", cos, sin);
  if (c10::GradMode::is_enabled() && x.requires_grad()) {
    // torch's own check, before the write: a leaf that requires grad (or a view of one,
    // or a view that cannot be rebased) is refused with torch's message.
    torch::autograd::check_inplace(x, true);
    RopeInplaceFunction::apply(x, cos, sin, pairing, layout);
    return;
  }
  const at::AutoDispatchBelowAutograd below_autograd;
  op.redispatch(keys & c10::after_autograd_keyset, x, cos, sin, pairing, layout);
}

void qk_norm_rope_inplace_autograd(c10::DispatchKeySet keys, const at::Tensor& q,
                                   const at::Tensor& k, const OptionalTensor& text_q_weight,
                                   const OptionalTensor& text_k_weight,
                                   const OptionalTensor& image_q_weight,
                                   const OptionalTensor& image_k_weight, const at::Tensor& cos,
                                   const at::Tensor& sin, std::int64_t text_len, double eps,
                                   c10::string_view mode, c10::string_view pairing,
                                   c10::string_view layout) {
  static const auto op = operator_handle<QkNormRopeInplaceSignature>("kernel_align::qk_norm_rope_");
  check_constant_tables("qk_norm_rope_", cos, sin);
  const auto requires_grad = [](const OptionalTensor& t) { return t && t->requires_grad(); };
  if (c10::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || requires_grad(text_q_weight) ||
       requires_grad(text_k_weight) || requires_grad(image_q_weight) ||
       requires_grad(image_k_weight))) {
    raise_value_error("qk_norm_rope_",
                      "expected tensors without autograd (the in-place op overwrites q and k, "
                      "which its backward needs), found one that requires grad: use "
                      "qk_norm_rope, or torch.no_grad()");
  }
  const at::AutoDispatchBelowAutograd below_autograd;
  op.redispatch(keys & c10::after_autograd_keyset, q, k, text_q_weight, text_k_weight,
                image_q_weight, image_k_weight, cos, sin, text_len, eps, mode, pairing, layout);
}

// An inference tensor has no version counter: outside inference mode, bumping it raises
// torch's "Inplace update to inference tensor outside InferenceMode" error. Raised here,
// before the write, so that the refused call leaves the tensor as it was.
void check_writable(const at::Tensor& t) {
  if (t.is_inference() && !c10::InferenceMode::is_enabled()) torch::autograd::increment_version(t);
}

// The ADInplaceOrView kernel of every mutating operator (the in-place ops and the out=
// variants), as torch generates them for its own: the op below this key, then a version
// bump of each tensor it wrote. Boxed, one for all: the written tensors are the arguments
// whose schema annotation says so (Tensor(a!)), an absent optional one skipped.
void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const std::size_t first = stack->size() - arguments.size();
  std::vector<at::Tensor> written;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor())
      written.push_back(value.toTensor());
  }
  for (const at::Tensor& t : written) check_writable(t);
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) torch::autograd::increment_version(t);
}

// The Autograd kernel of the out= variants: torch's rule for its own out= functions,
// which do not support automatic differentiation. While grad mode is on, an argument that
// requires grad (an input, or an out tensor) is refused before anything is written, with
// torch's RuntimeError and the argument's name; otherwise the op runs below autograd.
void refuse_grad_for_out(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                         torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const std::size_t first = stack->size() - arguments.size();
  if (c10::GradMode::is_enabled()) {
    for (std::size_t i = 0; i < arguments.size(); ++i) {
      const c10::IValue& value = (*stack)[first + i];
      TORCH_CHECK(!value.isTensor() || !value.toTensor().requires_grad(), "kernel_align.",
                  op.schema().name().substr(std::string_view("kernel_align::").size()),
                  ": argument '", arguments[i].name(),
                  "': functions with out=... arguments don't support automatic "
                  "differentiation, but this argument requires grad (call it without out=, "
                  "or under torch.no_grad())");
    }
  }
  const at::AutoDispatchBelowAutograd below_autograd;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

std::tuple<at::Tensor, at::Tensor> qk_rmsnorm_backward_autograd(const at::Tensor& x,
                                                                const at::Tensor& dy,
                                                                const OptionalTensor& weight,
                                                                double eps, c10::string_view mode,
                                                                bool compute_dw) {
  const variable_list out = QkRmsNormBackwardFunction::apply(x, dy, weight, eps, mode, compute_dw);
  return {out[0], out[1]};
}

at::Tensor multi_axis_rope_backward_autograd(const at::Tensor& dy, const at::Tensor& cos,
                                             const at::Tensor& sin, c10::string_view pairing,
                                             c10::string_view layout) {
  check_constant_tables("multi_axis_rope_backward", cos, sin);
  return RopeBackwardFunction::apply(dy, cos, sin, pairing, layout);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
qk_norm_rope_backward_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& dq_out,
                               const at::Tensor& dk_out, const OptionalTensor& text_q_weight,
                               const OptionalTensor& text_k_weight,
                               const OptionalTensor& image_q_weight,
                               const OptionalTensor& image_k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, std::int64_t text_len, double eps,
                               c10::string_view mode, c10::string_view pairing,
                               c10::string_view layout, std::array<bool, kWeights> compute_dw) {
  check_constant_tables("qk_norm_rope_backward", cos, sin);
  const variable_list out = QkNormRopeBackwardFunction::apply(
      q, k, dq_out, dk_out, text_q_weight, text_k_weight, image_q_weight, image_k_weight, cos, sin,
      text_len, eps, mode, pairing, layout, compute_dw);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

// The out= variants (ops.cpp, adaln.cpp, gate_residual.cpp): refused under autograd, their outputs'
// versions bumped.
constexpr const char* kOutOperators[] = {"qk_rmsnorm_out",       "qk_rmsnorm_backward_out",
                                         "multi_axis_rope_out",  "multi_axis_rope_backward_out",
                                         "qk_norm_rope_out",     "qk_norm_rope_backward_out",
                                         "adaln_modulation_out", "adaln_gate_residual_out"};

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("qk_rmsnorm", &kernel_align::torch_ext::qk_rmsnorm_autograd);
  m.impl("multi_axis_rope", &kernel_align::torch_ext::multi_axis_rope_autograd);
  m.impl("qk_norm_rope", &kernel_align::torch_ext::qk_norm_rope_autograd);
  m.impl("qk_rmsnorm_backward", &kernel_align::torch_ext::qk_rmsnorm_backward_autograd);
  m.impl("multi_axis_rope_backward", &kernel_align::torch_ext::multi_axis_rope_backward_autograd);
  m.impl("qk_norm_rope_backward", &kernel_align::torch_ext::qk_norm_rope_backward_autograd);
  m.impl("multi_axis_rope_", &kernel_align::torch_ext::multi_axis_rope_inplace_autograd);
  m.impl("qk_norm_rope_", &kernel_align::torch_ext::qk_norm_rope_inplace_autograd);
  for (const char* name : kOutOperators) {
    m.impl(
        name,
        torch::CppFunction::makeFromBoxedFunction<&kernel_align::torch_ext::refuse_grad_for_out>());
  }
}

TORCH_LIBRARY_IMPL(kernel_align, ADInplaceOrView, m) {
  for (const char* name : {"multi_axis_rope_", "qk_norm_rope_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &kernel_align::torch_ext::bump_written_versions>());
  }
  for (const char* name : kOutOperators) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &kernel_align::torch_ext::bump_written_versions>());
  }
}
