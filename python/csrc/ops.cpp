// The kernel_align:: torch operators: schemas and their CPU and CUDA kernels (one set of
// functions for both). Each kernel views its tensors in place (data pointer, sizes,
// strides, device: no copies), allocates outputs like torch.empty_like (the fake kernels
// in python/kernel_align/_ops.py give the same shapes and strides) and calls the library
// entry point that every other front end uses, on torch's current stream for CUDA
// tensors. Autograd is in autograd.cpp, the fake kernels are registered from Python.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_align/ops.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

at::Tensor empty_like_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return at::empty_like(t, t.options().dtype(dtype));
}

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
    const RmsNormOptions options{eps_of(eps), parse_norm_mode(mode)};
    at::Tensor y = empty_like_dtype(x, out_dtype.value_or(x.scalar_type()));
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
    const RmsNormOptions options{eps_of(eps), parse_norm_mode(mode)};
    at::Tensor dx = empty_like_dtype(x, x.scalar_type());
    at::Tensor dw = compute_dw ? at::empty_like(*weight) : no_gradient(x);
    std::optional<TensorView> dwv;
    if (compute_dw) dwv = output_view(op, "dw", dw);
    qk_rmsnorm_backward(xv, dyv, wv, output_view(op, "dx", dx), dwv, options, context_of(x));
    return std::tuple{dx, dw};
  });
}

RopeOptions rope_options(c10::string_view pairing, c10::string_view layout) {
  return {parse_pairing(pairing), parse_layout(layout)};
}

at::Tensor multi_axis_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           c10::string_view pairing, c10::string_view layout) {
  constexpr const char* op = "multi_axis_rope";
  return translate_errors(op, [&] {
    const ConstTensorView xv = input_view(op, "x", x);
    const RopeOptions options = rope_options(pairing, layout);
    at::Tensor y = at::empty_like(x);
    multi_axis_rope_forward(xv, input_view(op, "cos", cos), input_view(op, "sin", sin),
                            output_view(op, "y", y), options, context_of(x));
    return y;
  });
}

void multi_axis_rope_inplace(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             c10::string_view pairing, c10::string_view layout) {
  constexpr const char* op = "multi_axis_rope_";
  translate_errors(op, [&] {
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
    const RopeOptions options = rope_options(pairing, layout);
    at::Tensor dx = at::empty_like(dy);
    multi_axis_rope_backward(dyv, input_view(op, "cos", cos), input_view(op, "sin", sin),
                             output_view(op, "dx", dx), options, context_of(dy));
    return dx;
  });
}

using OptionalTensor = std::optional<at::Tensor>;

QkNormWeights norm_weights(const char* op, const OptionalTensor& text_q,
                           const OptionalTensor& text_k, const OptionalTensor& image_q,
                           const OptionalTensor& image_k) {
  return {input_view(op, "text_q_weight", text_q), input_view(op, "text_k_weight", text_k),
          input_view(op, "image_q_weight", image_q), input_view(op, "image_k_weight", image_k)};
}

QkNormRopeOptions fused_options(std::int64_t text_len, double eps, c10::string_view mode,
                                c10::string_view pairing, c10::string_view layout) {
  const RopeOptions rope = rope_options(pairing, layout);
  return {eps_of(eps), parse_norm_mode(mode), rope.pairing, rope.layout, text_len};
}

std::tuple<at::Tensor, at::Tensor> qk_norm_rope(
    const at::Tensor& q, const at::Tensor& k, const OptionalTensor& text_q_weight,
    const OptionalTensor& text_k_weight, const OptionalTensor& image_q_weight,
    const OptionalTensor& image_k_weight, const at::Tensor& cos, const at::Tensor& sin,
    std::int64_t text_len, double eps, c10::string_view mode, c10::string_view pairing,
    c10::string_view layout, std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "qk_norm_rope";
  return translate_errors(op, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const QkNormWeights weights =
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight);
    const QkNormRopeOptions options = fused_options(text_len, eps, mode, pairing, layout);
    at::Tensor q_out = empty_like_dtype(q, out_dtype.value_or(q.scalar_type()));
    at::Tensor k_out = empty_like_dtype(k, out_dtype.value_or(k.scalar_type()));
    qk_norm_rope_forward(qv, kv, weights, input_view(op, "cos", cos), input_view(op, "sin", sin),
                         output_view(op, "out_dtype", q_out), output_view(op, "out_dtype", k_out),
                         options, context_of(q));
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
  translate_errors(op, [&] {
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
  return translate_errors(op, [&] {
    const ConstTensorView qv = input_view(op, "q", q);
    const ConstTensorView kv = input_view(op, "k", k);
    const QkNormWeights weights =
        norm_weights(op, text_q_weight, text_k_weight, image_q_weight, image_k_weight);
    const QkNormRopeOptions options = fused_options(text_len, eps, mode, pairing, layout);
    // In the schema's order: text q, text k, image q, image k.
    const std::array<const OptionalTensor*, 4> weight_tensors{&text_q_weight, &text_k_weight,
                                                              &image_q_weight, &image_k_weight};
    std::array<at::Tensor, 4> dw;
    std::array<std::optional<TensorView>, 4> dw_views;
    for (std::size_t i = 0; i < dw.size(); ++i) {
      if (compute_dw[i] && !*weight_tensors[i]) {
        throw Error("compute_dw", "false for an absent weight",
                    "true at index " + std::to_string(i));
      }
      dw[i] = compute_dw[i] ? at::empty_like(**weight_tensors[i]) : no_gradient(q);
      if (compute_dw[i]) dw_views[i] = output_view(op, "dw", dw[i]);
    }
    at::Tensor dq = empty_like_dtype(q, q.scalar_type());
    at::Tensor dk = empty_like_dtype(k, k.scalar_type());
    qk_norm_rope_backward(
        qv, kv, input_view(op, "dq_out", dq_out), input_view(op, "dk_out", dk_out), weights,
        input_view(op, "cos", cos), input_view(op, "sin", sin), output_view(op, "dq", dq),
        output_view(op, "dk", dk), {dw_views[0], dw_views[1], dw_views[2], dw_views[3]}, options,
        context_of(q));
    return SixTensors{dq, dk, dw[0], dw[1], dw[2], dw[3]};
  });
}

}  // namespace
}  // namespace kernel_align::torch_ext

// The norm mode is `norm_mode` in the schemas: torch's dispatch to Python modes passes a
// `mode` argument of its own, which an op argument of that name collides with.
TORCH_LIBRARY(kernel_align, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def(
      "qk_rmsnorm(Tensor x, Tensor? weight=None, float eps=1e-06, str norm_mode='single', "
      "ScalarType? out_dtype=None) -> Tensor",
      tags);
  m.def(
      "qk_rmsnorm_backward(Tensor x, Tensor dy, Tensor? weight, float eps, str norm_mode, "
      "bool compute_dw) -> (Tensor dx, Tensor dw)",
      tags);
  m.def(
      "multi_axis_rope(Tensor x, Tensor cos, Tensor sin, str pairing='interleaved', "
      "str layout='bshd') -> Tensor",
      tags);
  m.def(
      "multi_axis_rope_(Tensor(a!) x, Tensor cos, Tensor sin, str pairing='interleaved', "
      "str layout='bshd') -> ()",
      tags);
  m.def(
      "multi_axis_rope_backward(Tensor dy, Tensor cos, Tensor sin, str pairing, str layout) "
      "-> Tensor",
      tags);
  m.def(
      "qk_norm_rope(Tensor q, Tensor k, Tensor? text_q_weight, Tensor? text_k_weight, "
      "Tensor? image_q_weight, Tensor? image_k_weight, Tensor cos, Tensor sin, int text_len, "
      "float eps=1e-06, str norm_mode='diffusers', str pairing='interleaved', str layout='bshd', "
      "ScalarType? out_dtype=None) -> (Tensor q_out, Tensor k_out)",
      tags);
  m.def(
      "qk_norm_rope_(Tensor(a!) q, Tensor(b!) k, Tensor? text_q_weight, Tensor? text_k_weight, "
      "Tensor? image_q_weight, Tensor? image_k_weight, Tensor cos, Tensor sin, int text_len, "
      "float eps=1e-06, str norm_mode='diffusers', str pairing='interleaved', str layout='bshd') "
      "-> ()",
      tags);
  m.def(
      "qk_norm_rope_backward(Tensor q, Tensor k, Tensor dq_out, Tensor dk_out, "
      "Tensor? text_q_weight, Tensor? text_k_weight, Tensor? image_q_weight, "
      "Tensor? image_k_weight, Tensor cos, Tensor sin, int text_len, float eps, str norm_mode, "
      "str pairing, str layout, bool[4] compute_dw) -> (Tensor dq, Tensor dk, "
      "Tensor dw_text_q, Tensor dw_text_k, Tensor dw_image_q, Tensor dw_image_k)",
      tags);
}

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
