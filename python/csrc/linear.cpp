// kernel_align::linear and kernel_align::linear_backward: torch's Linear under the
// contract's linear tree (docs/contract.md section 10), their CPU and CUDA kernels and
// linear's Autograd kernel, in one file (the schemas are a row each of _ops.py's operator
// table), with the two shard utilities, defined here as a fragment of the kernel_align
// library.
//
// linear's backward is linear_backward through the dispatcher (so torch.compile's
// AOTAutograd sees both operators and their fake kernels, python/kernel_align/_ops.py);
// linear_backward's own gradient (double backward) raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "api/ops/linear.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using OptionalTensor = std::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using LinearSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                   c10::string_view, std::optional<at::ScalarType>);
using LinearBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptionalTensor&, const at::Tensor&,
    c10::string_view, std::array<bool, 3>);

// x's sizes with the last one replaced by `last`.
std::vector<std::int64_t> sizes_with_last(const at::Tensor& x, std::int64_t last) {
  std::vector<std::int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = last;
  return sizes;
}

// y = act(x weight^T + bias) in out_dtype (default x's), contiguous.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias,
                  c10::string_view activation, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "linear";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView wv = input_view(op, "weight", weight);
    const auto bv = input_view(op, "bias", bias);
    const LinearOptions options{activation_from_name(activation)};
    const std::int64_t n = wv.rank == 2 ? wv.shape[0] : 1;
    const at::ScalarType y_type = out_dtype.value_or(x.scalar_type());
    StandIns outputs({xv, wv, bv});
    detail::linear_forward_call(
        xv, wv, bv, outputs.like(xv, library_dtype(op, "out_dtype", y_type), n), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor y = with_huge_pages(at::empty(sizes_with_last(x, n), x.options().dtype(y_type)));
    linear_forward(xv, wv, bv, output_view(op, "y", y), options, context_of(x));
    return y;
  });
}

// (dx, dw, db) where output_mask asks for them (each an empty tensor where it does not).
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward(
    const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias, const at::Tensor& dy,
    c10::string_view activation, std::array<bool, 3> output_mask) {
  constexpr const char* op = "linear_backward";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView wv = input_view(op, "weight", weight);
    const auto bv = input_view(op, "bias", bias);
    const ConstTensorView dyv = input_view(op, "dy", dy);
    const LinearOptions options{activation_from_name(activation)};
    if (output_mask[2] && !bias) throw Error("output_mask", "no db without a bias", "db asked");
    StandIns outputs({xv, wv, bv, dyv});
    std::optional<TensorView> dx_in, dw_in, db_in;
    if (output_mask[0]) dx_in = outputs.like(xv, xv.dtype);
    if (output_mask[1]) dw_in = outputs.like(wv, wv.dtype);
    if (output_mask[2]) db_in = outputs.like(*bv, bv->dtype);
    detail::linear_backward_call(xv, wv, bv, dyv, dx_in, dw_in, db_in, options);
    check_outputs_fit("x", x, outputs);
    const auto none = [&] { return at::empty({0}, x.options()); };
    at::Tensor dx = output_mask[0] ? new_output(x, x.scalar_type()) : none();
    at::Tensor dw = output_mask[1] ? at::empty_like(weight) : none();
    at::Tensor db = output_mask[2] ? at::empty_like(*bias) : none();
    std::optional<TensorView> dxv, dwv, dbv;
    if (output_mask[0]) dxv = output_view(op, "dx", dx);
    if (output_mask[1]) dwv = output_view(op, "dw", dw);
    if (output_mask[2]) dbv = output_view(op, "db", db);
    linear_backward(xv, wv, bv, dyv, dxv, dwv, dbv, options, context_of(x));
    return std::tuple{dx, dw, db};
  });
}

// Whether K split into `parts` equal shards is reproduced by the contract's tree
// (contract::linear_shards_reproduce, docs/contract.md section 10).
bool linear_shards_reproduce(std::int64_t k, std::int64_t parts) {
  return contract::linear_shards_reproduce(k, parts);
}

// The unsharded linear output from the fp32 partial sums of `partials.size()` row-parallel
// shards (each the linear of its K/P columns, no bias, out_dtype fp32), in shard order:
// combined by the top levels of the linear tree (contract::linear_combine_shards), then
// the bias, the activation and the one rounding to out_dtype (contract::linear_output,
// store_output). CPU tensors.
at::Tensor linear_combine_shards(at::TensorList partials, const OptionalTensor& bias,
                                 c10::string_view activation, at::ScalarType out_dtype) {
  constexpr const char* op = "linear_combine_shards";
  return translate_errors(op, [&] {
    const auto count = static_cast<std::int64_t>(partials.size());
    if (count < 1 || count > contract::kLinearMaxShards || (count & (count - 1)) != 0) {
      throw Error("partials", "a power of two of shards from 1 to 64", std::to_string(count));
    }
    const at::Tensor& first = partials[0];
    for (std::int64_t i = 0; i < count; ++i) {
      const at::Tensor& p = partials[static_cast<std::size_t>(i)];
      if (!p.is_cpu() || p.scalar_type() != at::kFloat || !p.is_contiguous() ||
          p.sizes() != first.sizes() || p.dim() < 1) {
        throw Error("partials",
                    "contiguous fp32 CPU tensors of one shape [..., N] (each shard's linear "
                    "with out_dtype=torch.float32)",
                    "partial " + std::to_string(i) + " of " + torch_dtype_name(p.scalar_type()) +
                        " on " + p.device().str());
      }
    }
    const std::int64_t n = first.size(-1);
    const auto act = static_cast<contract::Activation>(activation_from_name(activation));
    const DType out = library_dtype(op, "out_dtype", out_dtype);
    const auto bv = input_view(op, "bias", bias);
    if (bv && (bv->rank != 1 || bv->shape[0] != n || !bias->is_cpu())) {
      throw Error("bias", "a CPU tensor [" + std::to_string(n) + "] (N of the partials)",
                  shape_string(*bv));
    }
    at::Tensor y = at::empty(first.sizes(), first.options().dtype(out_dtype));
    std::vector<const float*> sources;
    for (const at::Tensor& p : partials) sources.push_back(p.data_ptr<float>());
    const std::int64_t elements = first.numel();
    float sums[contract::kLinearMaxShards];
    for (std::int64_t e = 0; e < elements; ++e) {
      for (std::int64_t i = 0; i < count; ++i) sums[i] = sources[static_cast<std::size_t>(i)][e];
      const float total = contract::linear_combine_shards(sums, static_cast<int>(count));
      float bias_value = 0.0f;
      if (bv) bias_value = contract::load_f32(bv->dtype, bv->data, (e % n) * bv->strides[0]);
      contract::store_output(out, y.data_ptr(), e,
                             contract::linear_output(total, bv ? &bias_value : nullptr, act));
    }
    return y;
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const OptionalTensor& bias, c10::string_view activation,
                            std::optional<at::ScalarType> out_dtype) {
    static const auto op = operator_handle<LinearSignature>("kernel_align::linear");
    ctx->save_for_backward({x, weight, bias.value_or(at::Tensor())});
    ctx->saved_data["activation"] = std::string(activation);
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, weight, bias, activation, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<LinearBackwardSignature>("kernel_align::linear_backward");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& bias = saved[2];
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   bias.defined() && ctx->needs_input_grad(2)};
    // dy as autograd hands it may be any view (an expanded ones of a sum): the library
    // takes rows that flatten to one stride, which a contiguous copy always has.
    const at::Tensor dy = grads[0].is_contiguous() ? grads[0] : grads[0].contiguous();
    // Through the dispatcher: with create_graph=True its Autograd kernel records a node.
    auto [dx, dw, db] =
        op.call(saved[0], saved[1], bias.defined() ? OptionalTensor(bias) : std::nullopt, dy,
                ctx->saved_data["activation"].toStringView(), mask);
    return {mask[0] ? dx : at::Tensor(),
            mask[1] ? dw : at::Tensor(),
            mask[2] ? db : at::Tensor(),
            {},
            {}};
  }
};

struct LinearBackwardFunction : torch::autograd::Function<LinearBackwardFunction> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& x,
                               const at::Tensor& weight, const OptionalTensor& bias,
                               const at::Tensor& dy, c10::string_view activation,
                               std::array<bool, 3> output_mask) {
    static const auto op =
        operator_handle<LinearBackwardSignature>("kernel_align::linear_backward");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dx, dw, db] = op.call(x, weight, bias, dy, activation, output_mask);
    return {dx, dw, db};
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
        "kernel_align.linear: double backward (the gradient of a gradient, e.g. a gradient "
        "penalty through torch.autograd.grad(..., create_graph=True)) is not supported; only "
        "first-order gradients of this operator are");
  }
};

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight,
                           const OptionalTensor& bias, c10::string_view activation,
                           std::optional<at::ScalarType> out_dtype) {
  return LinearFunction::apply(x, weight, bias, activation, out_dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_autograd(
    const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias, const at::Tensor& dy,
    c10::string_view activation, std::array<bool, 3> output_mask) {
  const variable_list out =
      LinearBackwardFunction::apply(x, weight, bias, dy, activation, output_mask);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_FRAGMENT(kernel_align, m) {
  m.def("linear_shards_reproduce(int k, int parts) -> bool",
        &kernel_align::torch_ext::linear_shards_reproduce);
  m.def(
      "linear_combine_shards(Tensor[] partials, Tensor? bias, str activation, "
      "ScalarType out_dtype) -> Tensor",
      &kernel_align::torch_ext::linear_combine_shards);
}

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("linear", &kernel_align::torch_ext::linear);
  m.impl("linear_backward", &kernel_align::torch_ext::linear_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("linear", &kernel_align::torch_ext::linear);
  m.impl("linear_backward", &kernel_align::torch_ext::linear_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("linear", &kernel_align::torch_ext::linear_autograd);
  m.impl("linear_backward", &kernel_align::torch_ext::linear_backward_autograd);
}
