// The CPU and CUDA kernels (one set of functions for both) of the norm and RoPE torch
// operators, whose schemas python/kernel_align/_ops.py defines with every other library
// op's (one table, from which the fake kernels are derived too). Each kernel views its tensors in
// place (data pointer, sizes, strides, device: no copies), allocates outputs like torch.empty_like
// (the fake kernels in python/kernel_align/_ops.py give the same shapes and strides) and calls the
// library entry point that every other front end uses, on torch's current stream for CUDA tensors.
// Autograd is in autograd.cpp.
//
// Outputs are allocated only once the call is known to be valid: the library's validation
// (api/ops/<op>.hpp) runs first on stand-in outputs (StandIns, outputs.hpp), then the outputs'
// size is checked against the device's memory, so that a bad D or a shape past the
// library's limits is named as such rather than failing in torch's allocator.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "api/ops/multi_axis_rope.hpp"
#include "api/ops/qk_norm_rope.hpp"
#include "api/ops/qk_rmsnorm.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

// Stands for a weight gradient that was not asked for: a schema cannot return an
// optional tensor.
at::Tensor no_gradient(const at::Tensor& like) {
  return at::empty({0}, like.options().dtype(at::kFloat));
}

float eps_of(double eps) {
  return fp32_option("eps", eps);
}

at::Tensor qk_rmsnorm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                      c10::string_view mode, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "qk_rmsnorm";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const auto wv = input_view(op, "weight", weight);
    const RmsNormOptions options{eps_of(eps), norm_mode_from_name(mode)};
    const at::ScalarType y_type = out_dtype.value_or(x.scalar_type());
    StandIns outputs({xv, wv});
    detail::rmsnorm_forward_call(xv, wv, outputs.like(xv, library_dtype(op, "out_dtype", y_type)),
                                 options);
    check_outputs_fit("x", x, outputs);
    at::Tensor y = new_output(x, y_type);
    qk_rmsnorm_forward(xv, wv, output_view(op, "out_dtype", y), options, context_of(x));
    return y;
  });
}

std::tuple<at::Tensor, at::Tensor> qk_rmsnorm_backward(const at::Tensor& x, const at::Tensor& dy,
                                                       const std::optional<at::Tensor>& weight,
                                                       double eps, c10::string_view mode,
                                                       bool compute_dw) {
  constexpr const char* op = "qk_rmsnorm_backward";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView dyv = input_view(op, "dy", dy);
    const auto wv = input_view(op, "weight", weight);
    if (compute_dw && !weight) throw Error("compute_dw", "false without a weight", "true");
    const RmsNormOptions options{eps_of(eps), norm_mode_from_name(mode)};
    StandIns outputs({xv, dyv, wv});
    const TensorView dx_stand_in = outputs.like(xv, xv.dtype);
    std::optional<TensorView> dw_stand_in;
    if (compute_dw) dw_stand_in = outputs.like(*wv, wv->dtype);
    detail::rmsnorm_backward_call(xv, dyv, wv, dx_stand_in, dw_stand_in, options);
    check_outputs_fit("x", x, outputs);
    at::Tensor dx = new_output(x, x.scalar_type());
    at::Tensor dw = compute_dw ? at::empty_like(*weight) : no_gradient(x);
    std::optional<TensorView> dwv;
    if (compute_dw) dwv = output_view(op, "dw", dw);
    qk_rmsnorm_backward(xv, dyv, wv, output_view(op, "dx", dx), dwv, options, context_of(x));
    return std::tuple{dx, dw};
  });
}

RopeOptions rope_options(c10::string_view pairing, c10::string_view layout) {
  return {pairing_from_name(pairing), layout_from_name(layout)};
}

at::Tensor multi_axis_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           c10::string_view pairing, c10::string_view layout) {
  constexpr const char* op = "multi_axis_rope";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const ConstTensorView cv = input_view(op, "cos", cos);
    const ConstTensorView sv = input_view(op, "sin", sin);
    const RopeOptions options = rope_options(pairing, layout);
    StandIns outputs({xv, cv, sv});
    detail::rope_call(Direction::Forward, xv, cv, sv, outputs.like(xv, xv.dtype), options);
    check_outputs_fit("x", x, outputs);
    at::Tensor y = new_output(x, x.scalar_type());
    multi_axis_rope_forward(xv, cv, sv, output_view(op, "y", y), options, context_of(x));
    return y;
  });
}

// The library's output of the in-place RoPE is the Python function's x.
constexpr Rename kRopeInPlaceNames[] = {{"y", "x"}};

void multi_axis_rope_inplace(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             c10::string_view pairing, c10::string_view layout) {
  constexpr const char* op = "multi_axis_rope_";
  translate_errors(op, kRopeInPlaceNames, [&] {
    const TensorView xv = output_view(op, "x", x);
    multi_axis_rope_forward(xv, input_view(op, "cos", cos), input_view(op, "sin", sin), xv,
                            rope_options(pairing, layout), context_of(x));
  });
}

at::Tensor multi_axis_rope_backward(const at::Tensor& dy, const at::Tensor& cos,
                                    const at::Tensor& sin, c10::string_view pairing,
                                    c10::string_view layout) {
  constexpr const char* op = "multi_axis_rope_backward";
  return translate_errors(op, [&] {
    const ConstTensorView dyv = input_view(op, "dy", dy);
    const ConstTensorView cv = input_view(op, "cos", cos);
    const ConstTensorView sv = input_view(op, "sin", sin);
    const RopeOptions options = rope_options(pairing, layout);
    StandIns outputs({dyv, cv, sv});
    detail::rope_call(Direction::Backward, dyv, cv, sv, outputs.like(dyv, dyv.dtype), options);
    check_outputs_fit("dy", dy, outputs);
    at::Tensor dx = new_output(dy, dy.scalar_type());
    multi_axis_rope_backward(dyv, cv, sv, output_view(op, "dx", dx), options, context_of(dy));
    return dx;
  });
}

using OptionalTensor = std::optional<at::Tensor>;

// The fused ops' arguments as the Python functions name them: the library's
// "weights.text_q" is text_q_weight, and in place its outputs q_out and k_out are q and k
// (the functional op's outputs are new tensors, which no message names).
constexpr Rename kFusedNames[] = {{"weights.text_q", "text_q_weight"},
                                  {"weights.text_k", "text_k_weight"},
                                  {"weights.image_q", "image_q_weight"},
                                  {"weights.image_k", "image_k_weight"},
                                  {"q_out", "q"},
                                  {"k_out", "k"}};

QkNormWeights norm_weights(const char* op, const OptionalTensor& text_q,
                           const OptionalTensor& text_k, const OptionalTensor& image_q,
                           const OptionalTensor& image_k) {
  return {input_view(op, "text_q_weight", text_q), input_view(op, "text_k_weight", text_k),
          input_view(op, "image_q_weight", image_q), input_view(op, "image_k_weight", image_k)};
}

QkNormRopeOptions fused_options(std::int64_t text_len, double eps, c10::string_view mode,
                                c10::string_view pairing, c10::string_view layout) {
  const RopeOptions rope = rope_options(pairing, layout);
  return {eps_of(eps), norm_mode_from_name(mode), rope.pairing, rope.layout, text_len};
}

std::tuple<at::Tensor, at::Tensor> qk_norm_rope(
    const at::Tensor& q, const at::Tensor& k, const OptionalTensor& text_q_weight,
    const OptionalTensor& text_k_weight, const OptionalTensor& image_q_weight,
    const OptionalTensor& image_k_weight, const at::Tensor& cos, const at::Tensor& sin,
    std::int64_t text_len, double eps, c10::string_view mode, c10::string_view pairing,
    c10::string_view layout, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "qk_norm_rope";
  return translate_errors(op, kFusedNames, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const QkNormWeights weights =
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight);
    const ConstTensorView cv = input_view(op, "cos", cos);
    const ConstTensorView sv = input_view(op, "sin", sin);
    const QkNormRopeOptions options = fused_options(text_len, eps, mode, pairing, layout);
    const at::ScalarType q_type = out_dtype.value_or(q.scalar_type());
    const at::ScalarType k_type = out_dtype.value_or(k.scalar_type());
    StandIns outputs(
        {qv, kv, weights.text_q, weights.text_k, weights.image_q, weights.image_k, cv, sv});
    const TensorView q_stand_in = outputs.like(qv, library_dtype(op, "out_dtype", q_type));
    const TensorView k_stand_in = outputs.like(kv, library_dtype(op, "out_dtype", k_type));
    detail::qk_norm_rope_forward_call(qv, kv, weights, cv, sv, q_stand_in, k_stand_in, options);
    check_outputs_fit("q", q, outputs);
    at::Tensor q_out = new_output(q, q_type);
    at::Tensor k_out = new_output(k, k_type);
    qk_norm_rope_forward(qv, kv, weights, cv, sv, output_view(op, "out_dtype", q_out),
                         output_view(op, "out_dtype", k_out), options, context_of(q));
    return std::tuple{q_out, k_out};
  });
}

void qk_norm_rope_inplace(const at::Tensor& q, const at::Tensor& k,
                          const OptionalTensor& text_q_weight, const OptionalTensor& text_k_weight,
                          const OptionalTensor& image_q_weight,
                          const OptionalTensor& image_k_weight, const at::Tensor& cos,
                          const at::Tensor& sin, std::int64_t text_len, double eps,
                          c10::string_view mode, c10::string_view pairing,
                          c10::string_view layout) {
  constexpr const char* op = "qk_norm_rope_";
  translate_errors(op, kFusedNames, [&] {
    const TensorView qv = output_view(op, "q", q);
    const TensorView kv = output_view(op, "k", k);
    qk_norm_rope_forward(
        qv, kv, norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight),
        input_view(op, "cos", cos), input_view(op, "sin", sin), qv, kv,
        fused_options(text_len, eps, mode, pairing, layout), context_of(q));
  });
}

using SixTensors =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

SixTensors qk_norm_rope_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& dq_out,
                                 const at::Tensor& dk_out, const OptionalTensor& text_q_weight,
                                 const OptionalTensor& text_k_weight,
                                 const OptionalTensor& image_q_weight,
                                 const OptionalTensor& image_k_weight, const at::Tensor& cos,
                                 const at::Tensor& sin, std::int64_t text_len, double eps,
                                 c10::string_view mode, c10::string_view pairing,
                                 c10::string_view layout, std::array<bool, 4> compute_dw) {
  constexpr const char* op = "qk_norm_rope_backward";
  return translate_errors(op, kFusedNames, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const ConstTensorView dqv = input_view(op, "dq_out", dq_out);
    const ConstTensorView dkv = input_view(op, "dk_out", dk_out);
    const QkNormWeights weights =
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight);
    const ConstTensorView cv = input_view(op, "cos", cos);
    const ConstTensorView sv = input_view(op, "sin", sin);
    const QkNormRopeOptions options = fused_options(text_len, eps, mode, pairing, layout);
    // In the schema's order: text q, text k, image q, image k.
    const std::array<const std::optional<ConstTensorView>*, 4> weight_views{
        &weights.text_q, &weights.text_k, &weights.image_q, &weights.image_k};
    StandIns outputs({qv, kv, dqv, dkv, weights.text_q, weights.text_k, weights.image_q,
                      weights.image_k, cv, sv});
    const TensorView dq_stand_in = outputs.like(qv, qv.dtype);
    const TensorView dk_stand_in = outputs.like(kv, kv.dtype);
    std::array<std::optional<TensorView>, 4> dw_stand_ins;
    for (std::size_t i = 0; i < dw_stand_ins.size(); ++i) {
      if (compute_dw[i] && !*weight_views[i]) {
        throw Error("compute_dw", "false for an absent weight",
                    "true at index " + std::to_string(i));
      }
      if (compute_dw[i])
        dw_stand_ins[i] = outputs.like(**weight_views[i], (*weight_views[i])->dtype);
    }
    detail::qk_norm_rope_backward_call(
        qv, kv, dqv, dkv, weights, cv, sv, dq_stand_in, dk_stand_in,
        {dw_stand_ins[0], dw_stand_ins[1], dw_stand_ins[2], dw_stand_ins[3]}, options);
    check_outputs_fit("q", q, outputs);
    const std::array<const OptionalTensor*, 4> weight_tensors{&text_q_weight, &text_k_weight,
                                                              &image_q_weight, &image_k_weight};
    std::array<at::Tensor, 4> dw;
    std::array<std::optional<TensorView>, 4> dw_views;
    for (std::size_t i = 0; i < dw.size(); ++i) {
      dw[i] = compute_dw[i] ? at::empty_like(**weight_tensors[i]) : no_gradient(q);
      if (compute_dw[i]) dw_views[i] = output_view(op, "dw", dw[i]);
    }
    at::Tensor dq = new_output(q, q.scalar_type());
    at::Tensor dk = new_output(k, k.scalar_type());
    qk_norm_rope_backward(
        qv, kv, dqv, dkv, weights, cv, sv, output_view(op, "dq", dq), output_view(op, "dk", dk),
        {dw_views[0], dw_views[1], dw_views[2], dw_views[3]}, options, context_of(q));
    return SixTensors{dq, dk, dw[0], dw[1], dw[2], dw[3]};
  });
}

// ---- out= variants -----------------------------------------------------------------
//
// Each op with its outputs given instead of allocated (kernel_align.qk_rmsnorm(...,
// out=y)): a training loop reuses its buffers and allocates nothing per call. The outputs
// are validated by the library like any output (shape, dtype, device, strides, overlap
// with the inputs and each other) before any byte is written. The outputs' dtypes are the
// out tensors' own (out_dtype is theirs). Messages name the forwards' outputs as the
// Python functions do ('out', or 'out[i]' of a tuple), the backwards' as their schemas.

constexpr Rename kOutNames[] = {{"y", "out"}};

void qk_rmsnorm_out(const at::Tensor& x, const OptionalTensor& weight, double eps,
                    c10::string_view mode, const at::Tensor& out) {
  constexpr const char* op = "qk_rmsnorm";
  translate_errors(op, kOutNames, [&] {
    qk_rmsnorm_forward(input_view(op, "x", x), input_view(op, "weight", weight),
                       output_view(op, "out", out),
                       RmsNormOptions{eps_of(eps), norm_mode_from_name(mode)}, context_of(x));
  });
}

void qk_rmsnorm_backward_out(const at::Tensor& x, const at::Tensor& dy,
                             const OptionalTensor& weight, double eps, c10::string_view mode,
                             const at::Tensor& dx, const OptionalTensor& dw) {
  constexpr const char* op = "qk_rmsnorm_backward_out";
  translate_errors(op, [&] {
    std::optional<TensorView> dwv;
    if (dw) dwv = output_view(op, "dw", *dw);
    qk_rmsnorm_backward(input_view(op, "x", x), input_view(op, "dy", dy),
                        input_view(op, "weight", weight), output_view(op, "dx", dx), dwv,
                        RmsNormOptions{eps_of(eps), norm_mode_from_name(mode)}, context_of(x));
  });
}

void multi_axis_rope_out(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         c10::string_view pairing, c10::string_view layout, const at::Tensor& out) {
  constexpr const char* op = "multi_axis_rope";
  translate_errors(op, kOutNames, [&] {
    multi_axis_rope_forward(input_view(op, "x", x), input_view(op, "cos", cos),
                            input_view(op, "sin", sin), output_view(op, "out", out),
                            rope_options(pairing, layout), context_of(x));
  });
}

void multi_axis_rope_backward_out(const at::Tensor& dy, const at::Tensor& cos,
                                  const at::Tensor& sin, c10::string_view pairing,
                                  c10::string_view layout, const at::Tensor& dx) {
  constexpr const char* op = "multi_axis_rope_backward_out";
  translate_errors(op, [&] {
    multi_axis_rope_backward(input_view(op, "dy", dy), input_view(op, "cos", cos),
                             input_view(op, "sin", sin), output_view(op, "dx", dx),
                             rope_options(pairing, layout), context_of(dy));
  });
}

// The fused ops' weights as in kFusedNames; the forward's outputs are the out tuple's
// elements, the backward's weight gradients its schema's dw_*.
constexpr Rename kFusedOutNames[] = {{"weights.text_q", "text_q_weight"},
                                     {"weights.text_k", "text_k_weight"},
                                     {"weights.image_q", "image_q_weight"},
                                     {"weights.image_k", "image_k_weight"},
                                     {"q_out", "out[0]"},
                                     {"k_out", "out[1]"}};
constexpr Rename kFusedBackwardOutNames[] = {
    {"weights.text_q", "text_q_weight"},    {"weights.text_k", "text_k_weight"},
    {"weights.image_q", "image_q_weight"},  {"weights.image_k", "image_k_weight"},
    {"weight_grads.text_q", "dw_text_q"},   {"weight_grads.text_k", "dw_text_k"},
    {"weight_grads.image_q", "dw_image_q"}, {"weight_grads.image_k", "dw_image_k"}};

void qk_norm_rope_out(const at::Tensor& q, const at::Tensor& k, const OptionalTensor& text_q_weight,
                      const OptionalTensor& text_k_weight, const OptionalTensor& image_q_weight,
                      const OptionalTensor& image_k_weight, const at::Tensor& cos,
                      const at::Tensor& sin, std::int64_t text_len, double eps,
                      c10::string_view mode, c10::string_view pairing, c10::string_view layout,
                      const at::Tensor& q_out, const at::Tensor& k_out) {
  constexpr const char* op = "qk_norm_rope";
  translate_errors(op, kFusedOutNames, [&] {
    qk_norm_rope_forward(
        input_view(op, "q", q), input_view(op, "k", k),
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight),
        input_view(op, "cos", cos), input_view(op, "sin", sin), output_view(op, "out[0]", q_out),
        output_view(op, "out[1]", k_out), fused_options(text_len, eps, mode, pairing, layout),
        context_of(q));
  });
}

void qk_norm_rope_backward_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& dq_out,
                               const at::Tensor& dk_out, const OptionalTensor& text_q_weight,
                               const OptionalTensor& text_k_weight,
                               const OptionalTensor& image_q_weight,
                               const OptionalTensor& image_k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, std::int64_t text_len, double eps,
                               c10::string_view mode, c10::string_view pairing,
                               c10::string_view layout, const at::Tensor& dq, const at::Tensor& dk,
                               const OptionalTensor& dw_text_q, const OptionalTensor& dw_text_k,
                               const OptionalTensor& dw_image_q, const OptionalTensor& dw_image_k) {
  constexpr const char* op = "qk_norm_rope_backward_out";
  translate_errors(op, kFusedBackwardOutNames, [&] {
    const std::array<const OptionalTensor*, 4> dw{&dw_text_q, &dw_text_k, &dw_image_q, &dw_image_k};
    constexpr std::array<const char*, 4> kDwNames{"dw_text_q", "dw_text_k", "dw_image_q",
                                                  "dw_image_k"};
    std::array<std::optional<TensorView>, 4> dw_views;
    for (std::size_t i = 0; i < dw.size(); ++i) {
      if (*dw[i]) dw_views[i] = output_view(op, kDwNames[i], **dw[i]);
    }
    qk_norm_rope_backward(
        input_view(op, "q", q), input_view(op, "k", k), input_view(op, "dq_out", dq_out),
        input_view(op, "dk_out", dk_out),
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight),
        input_view(op, "cos", cos), input_view(op, "sin", sin), output_view(op, "dq", dq),
        output_view(op, "dk", dk), {dw_views[0], dw_views[1], dw_views[2], dw_views[3]},
        fused_options(text_len, eps, mode, pairing, layout), context_of(q));
  });
}

}  // namespace
}  // namespace kernel_align::torch_ext

namespace kernel_align::torch_ext {
namespace {

void register_kernels(torch::Library& m) {
  m.impl("qk_rmsnorm", &qk_rmsnorm);
  m.impl("qk_rmsnorm_backward", &qk_rmsnorm_backward);
  m.impl("multi_axis_rope", &multi_axis_rope);
  m.impl("multi_axis_rope_", &multi_axis_rope_inplace);
  m.impl("multi_axis_rope_backward", &multi_axis_rope_backward);
  m.impl("qk_norm_rope", &qk_norm_rope);
  m.impl("qk_norm_rope_", &qk_norm_rope_inplace);
  m.impl("qk_norm_rope_backward", &qk_norm_rope_backward);
  m.impl("qk_rmsnorm_out", &qk_rmsnorm_out);
  m.impl("qk_rmsnorm_backward_out", &qk_rmsnorm_backward_out);
  m.impl("multi_axis_rope_out", &multi_axis_rope_out);
  m.impl("multi_axis_rope_backward_out", &multi_axis_rope_backward_out);
  m.impl("qk_norm_rope_out", &qk_norm_rope_out);
  m.impl("qk_norm_rope_backward_out", &qk_norm_rope_backward_out);
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  kernel_align::torch_ext::register_kernels(m);
}

// CUDA tensors reach the same kernels, which queue the library's CUDA backend on torch's
// current stream (context_of). In an extension built without it they are refused before
// any access: the view check names the device and the backends, where the dispatcher
// would say that no CUDA kernel exists.
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  kernel_align::torch_ext::register_kernels(m);
}
