// The operators. Every function validates its arguments first and throws
// kernel_align::Error naming the bad one; nothing is written when it throws.
// Results follow docs/contract.md bit for bit, on every device.
//
// Every tensor of a call lives on one device (TensorView::device; an Error names two
// that differ), which picks the registry's platform and so the backends. `context`
// says where the work is queued (device.hpp): CPU calls are synchronous; CUDA calls
// queue their kernels on context.cuda_stream and return.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernel_align/options.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align {

// y = qk_rmsnorm(x) over the last dim D (even, 2..4096). x: 1-4-D, any dtype.
// weight: 1-D [D] or absent. y: the shape of x, any dtype (its dtype is the
// output dtype). y may be x itself (same data, strides and dtype); any other
// overlap of y with an input is rejected. Errors name x (rank, D, empty, strides,
// alignment), weight (rank, length), y (shape, overlap), eps (not finite or < 0) or, for
// tensors on two devices or a call no backend can run, the tensor or "backend".
void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options = {},
                        const ExecutionContext& context = {});

// dx (shape of x) and, when a weight is given and dw is asked for, dw ([D]) from
// the upstream gradient dy (shape of x). The mode only affects dw, which sums
// dy * (the normalised value the forward multiplied by the weight) over all rows in
// fixed 256-row blocks (docs/contract.md section 3). Any dtypes. dx may be x or dy itself;
// dw must overlap nothing. Errors as the forward, and dy or dx (shape of x), dw (given
// without a weight, or not of the weight's shape).
void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options = {},
                         const ExecutionContext& context = {});

// y = multi_axis_rope(x). x and y: 4-D in `layout`; the sequence dim (and only it)
// selects the table row. cos, sin: fp32 [S, D/2], column i for pair i. y may be x.
// x and y any dtype (y's is the output's). Errors name x (rank, D), y (shape of x,
// overlap), cos or sin (not fp32 [S, D/2] for the S of x in `layout`).
void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options, const ExecutionContext& context = {});

// dx = transpose rotation of dy (the rotation by -angle): the gradient of
// multi_axis_rope_forward with the same tables and options. dy, dx: 4-D in `layout`, any
// dtypes; dx may be dy. Errors as the forward, naming dy and dx.
void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options, const ExecutionContext& context = {});

// The four learned norm weights of a diffusers Qwen-Image block: one pair for the
// text tokens (sequence positions < text_len) and one for the image tokens. An
// absent weight is a parameter-free norm (the seed).
struct QkNormWeights {
  std::optional<ConstTensorView> text_q, text_k, image_q, image_k;
};

// The gradients of QkNormWeights, outputs of qk_norm_rope_backward: a present one is
// computed (its weight must be present, same shape), an absent one is not. None may
// overlap another tensor of the call.
struct QkNormWeightGrads {
  std::optional<TensorView> text_q, text_k, image_q, image_k;
};

// q_out = rope(qk_rmsnorm(q)), k_out likewise, in one pass over memory; bytes equal to
// qk_rmsnorm_forward into a tensor of q_out's dtype (text and image positions with
// their weights) followed by multi_axis_rope_forward. q and k: 4-D in the layout, the
// same B, S and D (head counts may differ); q_out may be q, k_out may be k. cos, sin:
// fp32 [S, D/2]; weights: [D] each, any dtype. Errors name q, k (shape), q_out, k_out
// (shape, overlap), cos, sin, text_len (not 0..S), weights.text_q etc. (rank, length,
// overlap with an output) and eps.
void qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                          const QkNormWeights& weights, const ConstTensorView& cos,
                          const ConstTensorView& sin, const TensorView& q_out,
                          const TensorView& k_out, const QkNormRopeOptions& options,
                          const ExecutionContext& context = {});

// Gradients of qk_norm_rope_forward: bytes equal to multi_axis_rope_backward of dq_out
// into a tensor of dq_out's dtype, then qk_rmsnorm_backward over the text and image
// positions separately (each with its own dw partition). dq may be dq_out or q, dk may be
// dk_out or k. q, k: the forward's inputs (shapes of dq_out, dk_out); dq, dk: their
// shapes. A weight gradient of a stream without positions (text_len 0 or S) is +0.
// Errors as the forward, and weight_grads.text_q etc. (without their weight, or not of
// its shape).
void qk_norm_rope_backward(const ConstTensorView& q, const ConstTensorView& k,
                           const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                           const QkNormWeights& weights, const ConstTensorView& cos,
                           const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
                           const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options,
                           const ExecutionContext& context = {});

// y = act(x w^T + b): torch's Linear under the contract's linear tree (docs/contract.md
// section 10), so that a row of y depends on that row of x, on w and on b alone, never on
// the other rows, the thread count, the instruction set or the device. x: [..., K] (rank
// 1-4, leading dims that flatten to one row stride: a contiguous or row-sliced tensor),
// weight: [N, K], bias: [N] or absent, y: [..., N] with x's leading dims; any dtypes and
// strides otherwise (y's dtype is the output's). y may overlap no input. Errors name x
// (rank, leading dims), weight (rank, K), bias (length), y (shape, overlap) or "backend".
void linear_forward(const ConstTensorView& x, const ConstTensorView& weight,
                    const std::optional<ConstTensorView>& bias, const TensorView& y,
                    const LinearOptions& options = {}, const ExecutionContext& context = {});

// Gradients of linear_forward from dy ([..., N], the shape of y), each computed where
// given: dx (shape of x) = dz w, dw (shape of weight) = dz^T x, db ([N]; needs a bias) =
// the sum of dz over rows, where dz = dy without an activation, else the activation's
// backward of dy at the forward's pre-activation value, recomputed by the same tree (fp32,
// never rounded to a narrower dtype). dw and db sum over the rows by the linear tree over
// M: deterministic, independent of threads and instruction sets, and (as any sum over a
// batch) not batch-invariant. No output may overlap another tensor of the call; at least
// one is given. Errors as the forward, and dy, dx (none of the three given), dw, db (shape,
// overlap; db without a bias).
void linear_backward(const ConstTensorView& x, const ConstTensorView& weight,
                     const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
                     const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
                     const std::optional<TensorView>& db, const LinearOptions& options = {},
                     const ExecutionContext& context = {});

// out = softmax(q k^T / sqrt(D) over the valid keys) v per sample and head: joint
// attention under docs/contract.md section 11 (attention-v1), in which every sum runs over
// the sample's valid tokens in their order, so a sample's bytes do not depend on the
// padding around it, its batch, the thread count or the instruction set. q, k, v: 4-D in
// `options.layout` ([B, S, H, D] or [B, H, S, D]) of one shape, D from 1 to kMaxHeadDim,
// any float dtypes and strides. mask: [B, S] of dtype Bool, true for a token that takes
// part (diffusers' encoder_hidden_states_mask joined with the image tokens), or absent
// (every token does). A masked token's output is +0, and so is every output of a sample
// without a valid token. out: q's shape, any float dtype (the output's); it may overlap no
// input. Errors name q (rank, D), k or v (not q's shape), mask (rank, dtype, shape), out
// (shape, overlap) or "backend".
void attention_forward(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       const std::optional<ConstTensorView>& mask, const TensorView& out,
                       const AttentionOptions& options = {}, const ExecutionContext& context = {});

// Gradients of attention_forward: dq, dk, dv (q's shape, any float dtypes) from dout, the
// gradient of out, and out, the forward's output (both q's shape; the softmax gradient's
// row sums are those of dout * out, as torch's flash backward takes them). Masked tokens'
// gradients are +0. No output may overlap another tensor of the call. Errors as the
// forward, and out, dout, dq, dk, dv (shape, overlap).
void attention_backward(const ConstTensorView& q, const ConstTensorView& k,
                        const ConstTensorView& v, const std::optional<ConstTensorView>& mask,
                        const ConstTensorView& out, const ConstTensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& options = {}, const ExecutionContext& context = {});

// y = LayerNorm(x) * (1 + scale) + shift: the LayerNorm without affine of a Qwen-Image
// block's norm1/norm2 fused with its AdaLN modulation (docs/contract.md section 12,
// adaln-v1). x: [B, S, D] (D from 1 to kMaxHeadDim), scale and shift: [B, D] or [B, 1, D]
// (a sample's modulation, shared by its tokens), y: x's shape; any float dtypes and
// strides. The row's mean and variance take the row tree, so a token's bytes depend on its
// row and its sample's scale and shift alone. options.mode = Diffusers rounds as diffusers'
// `_modulate` does in the model's dtype; Single rounds once. y may be x (in place) and
// overlap no other input. Errors name x (rank, D), scale or shift (shape), y (shape,
// overlap) and eps.
void adaln_modulation_forward(const ConstTensorView& x, const ConstTensorView& scale,
                              const ConstTensorView& shift, const TensorView& y,
                              const AdaLnOptions& options = {},
                              const ExecutionContext& context = {});

// Gradients of adaln_modulation_forward from dy (x's shape): dx (x's shape; may be x or
// dy), and, each where given, dscale and dshift (scale's shape): per sample, the sums over
// its tokens of dy * LayerNorm(x) and of dy, in fixed blocks of kDwBlockRows tokens
// (contract section 12): deterministic, and per sample, so batch-invariant. No other
// output may overlap another tensor. Errors as the forward, and dy, dx, dscale, dshift.
void adaln_modulation_backward(const ConstTensorView& x, const ConstTensorView& scale,
                               const ConstTensorView& dy, const TensorView& dx,
                               const std::optional<TensorView>& dscale,
                               const std::optional<TensorView>& dshift,
                               const AdaLnOptions& options = {},
                               const ExecutionContext& context = {});

// out = x + gate * y: a Qwen-Image block's gated residual (`hidden_states + gate *
// attn_output`, and the MLP's; docs/contract.md section 13). x, y and out: [B, S, D] (D
// from 1 to kMaxHeadDim), gate: [B, D] or [B, 1, D] (a sample's, shared by its tokens); any
// float dtypes and strides. Elementwise: a token's bytes depend on its own elements and
// its sample's gate alone. options.mode = Diffusers rounds gate * y to out's dtype before
// the add, as torch computes it in the model's dtype; Single rounds once. out may be x or
// y (in place) and overlap no other input. Errors name x (rank, D), gate and y (shape)
// and out (shape, overlap).
void adaln_gate_residual_forward(const ConstTensorView& x, const ConstTensorView& gate,
                                 const ConstTensorView& y, const TensorView& out,
                                 const GateResidualOptions& options = {},
                                 const ExecutionContext& context = {});

// Gradients of adaln_gate_residual_forward from dout (y's shape): dy = gate * dout (y's
// shape; may be dout or y), and, where given, dgate (gate's shape): per sample, the sum
// over its tokens of dout * y in fixed blocks of kDwBlockRows tokens (contract section
// 13): deterministic, and per sample, so batch-invariant. The gradient of x is dout
// itself and is not computed. Errors as the forward, and dout, dy, dgate.
void adaln_gate_residual_backward(const ConstTensorView& gate, const ConstTensorView& y,
                                  const ConstTensorView& dout, const TensorView& dy,
                                  const std::optional<TensorView>& dgate,
                                  const GateResidualOptions& options = {},
                                  const ExecutionContext& context = {});

// y = act(x) elementwise, under the contract (docs/contract.md section 14): silu (x *
// sigmoid(x)) or tanh-approximated GELU with the contract's own exp and tanh (linear's
// activations, section 10), or none (y = x in y's dtype); one rounding to y's dtype. x
// and y: rank 1 to 4, the same shape, any float dtypes and strides; y may be x (in place)
// and overlap no other input. An element's bytes depend on that element alone. Errors
// name x (rank), y (shape, overlap).
void activation_forward(const ConstTensorView& x, const TensorView& y,
                        const ActivationOptions& options = {},
                        const ExecutionContext& context = {});

// dx = dy * act'(x) elementwise (the derivative the contract's section 10 defines for
// linear's backward epilogue), one rounding to dx's dtype. dx may be x or dy. Errors as the
// forward, and dy, dx.
void activation_backward(const ConstTensorView& x, const ConstTensorView& dy, const TensorView& dx,
                         const ActivationOptions& options = {},
                         const ExecutionContext& context = {});

// One step of Flow-GRPO's SDE sampler (docs/contract.md section 15), fp32 arithmetic
// whatever the dtypes: prev = mean + noise_scale * noise, mean = x * x_scale + v * v_scale,
// the constants flow_sde_coefficients(sigma, sigma_prev, noise_level, sigma_max)
// (tables.hpp), one rounding to prev's dtype. x (the latents x_t), v (the model's
// velocity), noise and prev: rank 2 to 4, dim 0 the samples, the same shape, any float
// dtypes and strides; prev may be x or noise (in place). Errors name x, v, noise, prev,
// and sigma, sigma_prev, noise_level, sigma_max (also a step whose constants are not
// finite fp32).
void flow_sde_step_forward(const ConstTensorView& x, const ConstTensorView& v,
                           const ConstTensorView& noise, const TensorView& prev,
                           const FlowSdeOptions& options, const ExecutionContext& context = {});

// The step's gradients: dx = dprev * x_scale, dv = dprev * v_scale (noise gets none), each
// rounded once to its dtype; either may be absent, not both. Errors as the forward, and
// dprev, dx, dv.
void flow_sde_step_backward(const ConstTensorView& dprev, const std::optional<TensorView>& dx,
                            const std::optional<TensorView>& dv, const FlowSdeOptions& options,
                            const ExecutionContext& context = {});

// logp[b]: the step's Gaussian log-density of prev given x and v, the mean over sample b's
// N elements (Flow-GRPO's): -(S_b * inverse_two_variance) / N + log_normalizer, with S_b
// the sum of the squared distances prev - mean by linear's tree (section 10) over the
// sample's elements in row-major order. logp: fp32 [B]. A sample's bytes depend on that
// sample alone. Errors as flow_sde_step_forward, and logp.
void flow_sde_logp_forward(const ConstTensorView& x, const ConstTensorView& v,
                           const ConstTensorView& prev, const TensorView& logp,
                           const FlowSdeOptions& options, const ExecutionContext& context = {});

// The gradients of logp with respect to x and v (prev is a constant, as Flow-GRPO detaches
// it): with g = dlogp[b] * 2 inverse_two_variance / N, dmean_i = g (prev_i - mean_i),
// dv = dmean * v_scale, dx = dmean * x_scale, each rounded once; either may be absent, not
// both. dlogp: fp32 [B]. Errors as the forward, and dlogp, dx, dv.
void flow_sde_logp_backward(const ConstTensorView& x, const ConstTensorView& v,
                            const ConstTensorView& prev, const ConstTensorView& dlogp,
                            const std::optional<TensorView>& dx,
                            const std::optional<TensorView>& dv, const FlowSdeOptions& options,
                            const ExecutionContext& context = {});

// The VAE latents' per-channel normalization as Qwen-Image's pipelines compute it
// (docs/contract.md section 16), fp32 arithmetic whatever the dtypes, one rounding to y's
// dtype: Normalize y = (z - mean[c]) / std[c]; Denormalize y = z / (1 / std[c]) + mean[c]
// (the pipelines divide by latents_std = 1 / std). z and y: [B, C, L] or [B, C, H, W],
// dim 1 the channel, the same shape, any float dtypes and strides; y may be z (in place).
// mean and std: [C], any float dtypes, widened to fp32. Errors name z (rank), mean, std
// (shape), y (shape, overlap).
void latent_normalize_forward(const ConstTensorView& z, const ConstTensorView& mean,
                              const ConstTensorView& std, const TensorView& y,
                              const LatentNormalizeOptions& options = {},
                              const ExecutionContext& context = {});

// dz = dy / std[c] (Normalize) or dy / (1 / std[c]) (Denormalize), one rounding to dz's
// dtype: the gradient with respect to z (the constants take none). dz may be dy. Errors
// name dy, std, dz.
void latent_normalize_backward(const ConstTensorView& dy, const ConstTensorView& std,
                               const TensorView& dz, const LatentNormalizeOptions& options = {},
                               const ExecutionContext& context = {});

// Qwen-Image's 2x2 patchify (the pipelines' _pack_latents, docs/contract.md section 16):
// y[b, i * W/2 + j, 4c + 2di + dj] = x[b, c, 2i + di, 2j + dj]. x: [B, C, H, W] with H and W
// even; y: [B, H/2 * W/2, 4C] of x's dtype; any strides; an exact permutation (every
// element's bytes copied). y overlaps nothing. Errors name x (rank, odd H or W: the
// pipelines' latent sizes are 2 * (pixels // 16)) and y (shape, dtype, overlap).
void latent_pack_forward(const ConstTensorView& x, const TensorView& y,
                         const ExecutionContext& context = {});

// Its inverse (the pipelines' _unpack_latents) and its gradient: dx[b, c, 2i + di, 2j + dj]
// = dy[b, i * W/2 + j, 4c + 2di + dj], H and W those of dx. dy: [B, S, 4C]; dx:
// [B, C, H, W] of dy's dtype with H and W even and H/2 * W/2 = S. Errors name dy, dx.
void latent_pack_backward(const ConstTensorView& dy, const TensorView& dx,
                          const ExecutionContext& context = {});

// True classifier-free guidance with Qwen-Image's norm rescale, per row (the last dim, a
// token's channels; docs/contract.md section 17), fp32 arithmetic whatever the dtypes:
// c = uncond + scale (cond - uncond), v = c * (|cond| / |c|), the norms' sums of squares
// by the row tree; one rounding to v's dtype. cond, uncond and v: rank 1 to 4, the same
// shape, any float dtypes and strides; v may be cond or uncond (in place). A row's bytes
// depend on that row alone. Errors name cond, uncond, v and scale (not finite).
void true_cfg_forward(const ConstTensorView& cond, const ConstTensorView& uncond,
                      const TensorView& v, const TrueCfgOptions& options = {},
                      const ExecutionContext& context = {});

// Its gradients with respect to cond and uncond (the contract's formulas, section 17),
// each rounded once; either may be absent, not both. Errors as the forward, and dv, dcond,
// duncond.
void true_cfg_backward(const ConstTensorView& cond, const ConstTensorView& uncond,
                       const ConstTensorView& dv, const std::optional<TensorView>& dcond,
                       const std::optional<TensorView>& duncond, const TrueCfgOptions& options = {},
                       const ExecutionContext& context = {});

// An option given as a double (a Python float, a number on the command line) as the
// fp32 value the contract computes with, rounded to nearest: Error naming `argument`
// when the value is not finite, overflows fp32 or underflows to 0 from a nonzero value
// (eps = 1e-50 would become 0 and a zero row NaN). The one rule of every front end for
// eps and theta. Zero and negative values pass (the op's own check decides).
float fp32_option(const std::string& argument, double value);

}  // namespace kernel_align
