// The operators. Every function validates its arguments first and throws
// kernel_align::Error naming the bad one; nothing is written when it throws.
// Results follow docs/contract.md bit for bit.
#pragma once

#include <optional>

#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align {

using contract::NormMode;

inline constexpr int kMaxHeadDim = 4096;

struct RmsNormOptions {
  float eps = 1e-6f;
  NormMode mode = NormMode::Single;
};

// y = qk_rmsnorm(x) over the last dim D (even, 2..4096). x: 1-4-D, any dtype.
// weight: 1-D [D] or absent. y: the shape of x, any dtype (its dtype is the
// output dtype). y may be x itself (same data, strides and dtype); any other
// overlap of y with an input is rejected.
void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options = {});

// dx (shape of x) and, when a weight is given and dw is asked for, dw ([D]) from
// the upstream gradient dy (shape of x). The mode only affects dw, which sums
// dy * (the normalised value the forward multiplied by the weight).
void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options = {});

enum class Pairing : unsigned char {
  Half,         // (x[i], x[i + D/2]): rotate-half, the seed
  Interleaved,  // (x[2i], x[2i + 1]): adjacent pairs, diffusers' Qwen-Image
};

enum class Layout : unsigned char {
  BSHD,  // [batch, sequence, heads, head_dim]: diffusers
  BHSD,  // [batch, heads, sequence, head_dim]
};

struct RopeOptions {
  Pairing pairing = Pairing::Interleaved;
  Layout layout = Layout::BSHD;
};

// y = multi_axis_rope(x). x and y: 4-D in `layout`; the sequence dim (and only it)
// selects the table row. cos, sin: fp32 [S, D/2], column i for pair i. y may be x.
void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options);

// dx = transpose rotation of dy.
void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options);

const char* pairing_name(Pairing p);
const char* layout_name(Layout l);
const char* norm_mode_name(NormMode m);

}  // namespace kernel_align
