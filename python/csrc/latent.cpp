// kernel_align::latent_normalize and kernel_align::latent_pack: the VAE latents'
// per-channel normalization and the 2x2 patchify of Qwen-Image's pipelines under the
// contract (docs/contract.md section 16), their backwards, CPU and CUDA kernels and
// Autograd kernels, in one file, a fragment of the kernel_align library as activation.cpp
// is. The gradients flow to the latents only (mean and std are constants, as the
// pipelines build them from the VAE's config: one that requires grad gets none, as
// flow_sde's noise). The backwards go through the dispatcher (torch.compile's AOTAutograd
// sees them and their fake kernels, python/kernel_align/_ops.py). Every one of the four is
// linear in its tensor, so each has an exact gradient of every order: the normalization's
// backward is its own gradient, the pack's backward (the unpack) and the pack are each
// other's.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/SymInt.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <utility>

#include "api/ops/latent.hpp"
#include "kernel_align/ops.hpp"
#include "outputs.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using NormalizeSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      c10::string_view);
using NormalizeBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&,
                                              c10::string_view);
using PackSignature = at::Tensor(const at::Tensor&);
using PackBackwardSignature = at::Tensor(const at::Tensor&, c10::SymInt, c10::SymInt);

LatentNormalizeOptions normalize_options(c10::string_view transform) {
  return {latent_transform_from_name(transform)};
}

// y (z's shape and dtype) = (z - mean) / std or z / (1 / std) + mean, per channel.
at::Tensor latent_normalize(const at::Tensor& z, const at::Tensor& mean, const at::Tensor& stddev,
                            c10::string_view transform) {
  constexpr const char* op = "latent_normalize";
  return translate_errors(op, [&] {
    const ConstTensorView zv = input_view(op, "z", z);
    const ConstTensorView mv = input_view(op, "mean", mean);
    const ConstTensorView sv = input_view(op, "std", stddev);
    const LatentNormalizeOptions options = normalize_options(transform);
    StandIns outputs({zv, mv, sv});
    detail::latent_normalize_forward_call(zv, mv, sv, outputs.like(zv, zv.dtype), options);
    check_outputs_fit("z", z, outputs);
    at::Tensor y = new_output(z, z.scalar_type());
    latent_normalize_forward(zv, mv, sv, output_view(op, "y", y), options, context_of(z));
    return y;
  });
}

// dz (dy's shape and dtype) = dy / std or dy / (1 / std), per channel.
at::Tensor latent_normalize_backward(const at::Tensor& dy, const at::Tensor& stddev,
                                     c10::string_view transform) {
  constexpr const char* op = "latent_normalize_backward";
  return translate_errors(op, [&] {
    const ConstTensorView gv = input_view(op, "dy", dy);
    const ConstTensorView sv = input_view(op, "std", stddev);
    const LatentNormalizeOptions options = normalize_options(transform);
    StandIns outputs({gv, sv});
    detail::latent_normalize_backward_call(gv, sv, outputs.like(gv, gv.dtype), options);
    check_outputs_fit("dy", dy, outputs);
    at::Tensor dz = new_output(dy, dy.scalar_type());
    latent_normalize_backward(gv, sv, output_view(op, "dz", dz), options, context_of(dy));
    return dz;
  });
}

// The operators' arguments are the Python functions' (latent_pack, latent_unpack): the
// library's errors name its own x, dy and dx, which are latents, tokens, and the latents a
// call makes, whose sizes are height and width (odd, not positive, not those of tokens).
constexpr Rename kPackNames[] = {{"x", "latents"}};
constexpr Rename kUnpackNames[] = {{"dy", "tokens"}, {"dx", "height, width"}};

// tokens [B, H/2 * W/2, 4C] (contiguous, the latents' dtype) of latents [B, C, H, W].
at::Tensor latent_pack(const at::Tensor& latents) {
  constexpr const char* op = "latent_pack";
  return translate_errors(op, kPackNames, [&] {
    const ConstTensorView xv = input_view(op, "latents", latents);
    StandIns outputs({xv});
    const TensorView stand_in = outputs.packed(xv);
    detail::latent_pack_forward_call(xv, stand_in);
    check_outputs_fit("latents", latents, outputs);
    at::Tensor tokens = with_huge_pages(
        at::empty({stand_in.shape[0], stand_in.shape[1], stand_in.shape[2]}, latents.options()));
    latent_pack_forward(xv, output_view(op, "tokens", tokens), context_of(latents));
    return tokens;
  });
}

// latents [B, C, height, width] (contiguous, the tokens' dtype) of tokens [B, S, 4C]: the
// pack's inverse and gradient.
at::Tensor latent_pack_backward(const at::Tensor& tokens, c10::SymInt height, c10::SymInt width) {
  constexpr const char* op = "latent_pack_backward";
  return translate_errors(op, kUnpackNames, [&] {
    const ConstTensorView tv = input_view(op, "tokens", tokens);
    StandIns outputs({tv});
    const TensorView stand_in = outputs.unpacked(tv, height.expect_int(), width.expect_int());
    detail::latent_pack_backward_call(tv, stand_in);
    check_outputs_fit("tokens", tokens, outputs);
    at::Tensor latents = with_huge_pages(
        at::empty({stand_in.shape[0], stand_in.shape[1], stand_in.shape[2], stand_in.shape[3]},
                  tokens.options()));
    latent_pack_backward(tv, output_view(op, "latents", latents), context_of(tokens));
    return latents;
  });
}

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Runs `op` on the kernel below autograd (the CPU or CUDA kernel, or the fake one when
// traced).
template <class Signature, class... Args>
at::Tensor redispatch(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(std::forward<Args>(args)...);
}

// dz = latent_normalize_backward(dy, std): through the dispatcher, so that with
// create_graph=True its Autograd kernel records a node.
at::Tensor normalize_gradient(AutogradContext* ctx, const at::Tensor& grad) {
  static const auto op =
      operator_handle<NormalizeBackwardSignature>("kernel_align::latent_normalize_backward");
  return op.call(grad, ctx->get_saved_variables()[0], ctx->saved_data["transform"].toStringView());
}

struct NormalizeFunction : torch::autograd::Function<NormalizeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& z, const at::Tensor& mean,
                            const at::Tensor& stddev, c10::string_view transform) {
    static const auto op = operator_handle<NormalizeSignature>("kernel_align::latent_normalize");
    ctx->save_for_backward({stddev});
    ctx->saved_data["transform"] = std::string(transform);
    return redispatch(op, z, mean, stddev, transform);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {normalize_gradient(ctx, grads[0]), {}, {}, {}};
  }
};

// latent_normalize_backward is dy scaled per channel: linear in dy, its gradient is the
// same scaling of the incoming gradient, exact to any order.
struct NormalizeBackwardFunction : torch::autograd::Function<NormalizeBackwardFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& stddev,
                            c10::string_view transform) {
    static const auto op =
        operator_handle<NormalizeBackwardSignature>("kernel_align::latent_normalize_backward");
    ctx->save_for_backward({stddev});
    ctx->saved_data["transform"] = std::string(transform);
    return redispatch(op, dy, stddev, transform);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {normalize_gradient(ctx, grads[0]), {}, {}};
  }
};

// The pack is a permutation: its gradient is the inverse permutation, the unpack, and the
// unpack's is the pack. Both through the dispatcher, each differentiable in turn.
struct PackFunction : torch::autograd::Function<PackFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& latents) {
    static const auto op = operator_handle<PackSignature>("kernel_align::latent_pack");
    at::Tensor tokens = redispatch(op, latents);
    // After the call, which refused latents that are not [B, C, H, W]. Symbolic under
    // torch.compile's dynamic shapes.
    ctx->saved_data["height"] = latents.sym_size(2);
    ctx->saved_data["width"] = latents.sym_size(3);
    return tokens;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        operator_handle<PackBackwardSignature>("kernel_align::latent_pack_backward");
    return {op.call(grads[0], ctx->saved_data["height"].toSymInt(),
                    ctx->saved_data["width"].toSymInt())};
  }
};

struct UnpackFunction : torch::autograd::Function<UnpackFunction> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& tokens,
                            const c10::SymInt& height, const c10::SymInt& width) {
    static const auto op =
        operator_handle<PackBackwardSignature>("kernel_align::latent_pack_backward");
    return redispatch(op, tokens, height, width);
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    static const auto op = operator_handle<PackSignature>("kernel_align::latent_pack");
    return {op.call(grads[0]), {}, {}};
  }
};

at::Tensor latent_normalize_autograd(const at::Tensor& z, const at::Tensor& mean,
                                     const at::Tensor& stddev, c10::string_view transform) {
  return NormalizeFunction::apply(z, mean, stddev, transform);
}

at::Tensor latent_normalize_backward_autograd(const at::Tensor& dy, const at::Tensor& stddev,
                                              c10::string_view transform) {
  return NormalizeBackwardFunction::apply(dy, stddev, transform);
}

at::Tensor latent_pack_autograd(const at::Tensor& latents) {
  return PackFunction::apply(latents);
}

// SymInts by value, as torch requires of a kernel's signature.
at::Tensor latent_pack_backward_autograd(const at::Tensor& tokens, c10::SymInt height,
                                         c10::SymInt width) {
  return UnpackFunction::apply(tokens, height, width);
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_IMPL(kernel_align, CPU, m) {
  m.impl("latent_normalize", &kernel_align::torch_ext::latent_normalize);
  m.impl("latent_normalize_backward", &kernel_align::torch_ext::latent_normalize_backward);
  m.impl("latent_pack", &kernel_align::torch_ext::latent_pack);
  m.impl("latent_pack_backward", &kernel_align::torch_ext::latent_pack_backward);
}

// CUDA tensors reach the same kernels, as ops.cpp's (which says why).
TORCH_LIBRARY_IMPL(kernel_align, CUDA, m) {
  m.impl("latent_normalize", &kernel_align::torch_ext::latent_normalize);
  m.impl("latent_normalize_backward", &kernel_align::torch_ext::latent_normalize_backward);
  m.impl("latent_pack", &kernel_align::torch_ext::latent_pack);
  m.impl("latent_pack_backward", &kernel_align::torch_ext::latent_pack_backward);
}

TORCH_LIBRARY_IMPL(kernel_align, Autograd, m) {
  m.impl("latent_normalize", &kernel_align::torch_ext::latent_normalize_autograd);
  m.impl("latent_normalize_backward", &kernel_align::torch_ext::latent_normalize_backward_autograd);
  m.impl("latent_pack", &kernel_align::torch_ext::latent_pack_autograd);
  m.impl("latent_pack_backward", &kernel_align::torch_ext::latent_pack_backward_autograd);
}
