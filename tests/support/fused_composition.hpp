// The fused qk_norm_rope ops written as the composition their documentation
// promises, out of the unfused public ops (run on whatever backend is set): the
// oracle the fused ops' bytes are compared with.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernel_align/ops.hpp"
#include "support/tensors.hpp"

namespace kernel_align::test {

// Sequence positions [begin, end) of a 4-D view in `layout`.
template <class View>
View sequence_slice(View v, Layout layout, std::int64_t begin, std::int64_t end) {
  const int seq_dim = layout == Layout::BSHD ? 1 : 2;
  using Byte =
      std::conditional_t<std::is_same_v<View, ConstTensorView>, const std::byte, std::byte>;
  v.data = static_cast<Byte*>(v.data) +
           begin * v.strides[seq_dim] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[seq_dim] = end - begin;
  return v;
}

inline std::int64_t sequence_length(const ConstTensorView& v, Layout layout) {
  return v.shape[layout == Layout::BSHD ? 1 : 2];
}

// Writes +0 to every element of `v`.
inline void fill_zero(const TensorView& v) {
  for_each_index(v, [&](std::int64_t, const std::array<std::int64_t, 4>& idx) {
    const std::int64_t offset = view_offset(v, idx);
    if (v.dtype == DType::F32) {
      static_cast<float*>(v.data)[offset] = 0.0f;
    } else {
      static_cast<std::uint16_t*>(v.data)[offset] = 0;
    }
  });
}

inline HostTensor like(DType dtype, const ConstTensorView& v) {
  return HostTensor(dtype, std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + v.rank));
}

// qk_rmsnorm_forward of the text and the image positions (each with its weights)
// into a tensor of q_out's dtype, then multi_axis_rope_forward into q_out; k alike.
inline void composed_qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                                          const QkNormWeights& weights, const ConstTensorView& cos,
                                          const ConstTensorView& sin, const TensorView& q_out,
                                          const TensorView& k_out,
                                          const QkNormRopeOptions& options) {
  const RmsNormOptions norm{options.eps, options.mode};
  const RopeOptions rope{options.pairing, options.layout};
  const Layout layout = options.layout;
  const std::int64_t text = options.text_len;
  const auto one = [&](const ConstTensorView& x, const TensorView& out,
                       const std::optional<ConstTensorView>& text_w,
                       const std::optional<ConstTensorView>& image_w) {
    const std::int64_t seq = sequence_length(x, layout);
    HostTensor normed = like(out.dtype, x);
    if (text > 0) {
      qk_rmsnorm_forward(sequence_slice(x, layout, 0, text), text_w,
                         sequence_slice(normed.view(), layout, 0, text), norm);
    }
    if (text < seq) {
      qk_rmsnorm_forward(sequence_slice(x, layout, text, seq), image_w,
                         sequence_slice(normed.view(), layout, text, seq), norm);
    }
    multi_axis_rope_forward(normed.cview(), cos, sin, out, rope);
  };
  one(q, q_out, weights.text_q, weights.image_q);
  one(k, k_out, weights.text_k, weights.image_k);
}

// multi_axis_rope_backward of dq_out into a tensor of dq_out's dtype, then
// qk_rmsnorm_backward over the text positions and over the image positions, each
// with its own weight gradient (a stream without positions sums no rows: +0);
// k alike.
inline void composed_qk_norm_rope_backward(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options) {
  const RmsNormOptions norm{options.eps, options.mode};
  const RopeOptions rope{options.pairing, options.layout};
  const Layout layout = options.layout;
  const std::int64_t text = options.text_len;
  const auto one = [&](const ConstTensorView& x, const ConstTensorView& dy, const TensorView& dx,
                       const std::optional<ConstTensorView>& text_w,
                       const std::optional<ConstTensorView>& image_w,
                       const std::optional<TensorView>& text_dw,
                       const std::optional<TensorView>& image_dw) {
    const std::int64_t seq = sequence_length(x, layout);
    HostTensor g = like(dy.dtype, dy);
    multi_axis_rope_backward(dy, cos, sin, g.view(), rope);
    if (text > 0) {
      qk_rmsnorm_backward(sequence_slice(x, layout, 0, text),
                          sequence_slice(g.cview(), layout, 0, text), text_w,
                          sequence_slice(dx, layout, 0, text), text_dw, norm);
    } else if (text_dw) {
      fill_zero(*text_dw);
    }
    if (text < seq) {
      qk_rmsnorm_backward(sequence_slice(x, layout, text, seq),
                          sequence_slice(g.cview(), layout, text, seq), image_w,
                          sequence_slice(dx, layout, text, seq), image_dw, norm);
    } else if (image_dw) {
      fill_zero(*image_dw);
    }
  };
  one(q, dq_out, dq, weights.text_q, weights.image_q, weight_grads.text_q, weight_grads.image_q);
  one(k, dk_out, dk, weights.text_k, weights.image_k, weight_grads.text_k, weight_grads.image_k);
}

}  // namespace kernel_align::test
