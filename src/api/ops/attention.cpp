// joint attention: q, k, v [B, S, H, D] (or bhsd) with a key-padding mask. Its validator (each
// argument checked and named, the call's tensors listed once for the aliasing rule) and its public
// functions (kernel_align/ops.hpp).
#include "api/ops/attention.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

namespace {

// The dims of a 4-D view in `layout` in the order (batch, sequence, head, d).
std::array<std::int64_t, 4> bshd_order(const std::array<std::int64_t, kMaxRank>& dims,
                                       Layout layout) {
  if (layout == Layout::BSHD) return {dims[0], dims[1], dims[2], dims[3]};
  return {dims[0], dims[2], dims[1], dims[3]};
}

AttentionInput attention_input(const ConstTensorView& v, Layout layout) {
  return {v.data, v.dtype, bshd_order(v.strides, layout)};
}

AttentionOutput attention_output(const TensorView& v, Layout layout) {
  return {v.data, v.dtype, bshd_order(v.strides, layout)};
}

// q, k, v and the mask of an attention call; returns q's dims as (B, S, H, D).
std::array<std::int64_t, 4> check_attention_inputs(const ConstTensorView& q,
                                                   const ConstTensorView& k,
                                                   const ConstTensorView& v,
                                                   const std::optional<ConstTensorView>& mask,
                                                   Layout layout) {
  const bool bshd = layout == Layout::BSHD;
  const std::string_view rank4 =
      bshd ? "rank 4 ([B, S, H, D], layout bshd)" : "rank 4 ([B, H, S, D], layout bhsd)";
  check_view("q", q, 4, 4, {rank4});
  const std::array<std::int64_t, 4> dims = bshd_order(q.shape, layout);
  if (dims[3] > kMaxHeadDim) {
    throw Error("q", "a last dim D from 1 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(dims[3]));
  }
  check_view("k", k, 4, 4, {rank4});
  check_same_shape("k", k, "q", q);
  check_view("v", v, 4, 4, {rank4});
  check_same_shape("v", v, "q", q);
  if (mask) {
    check_view_extents("mask", *mask, 2, 2, {"rank 2 ([B, S])"});
    if (mask->dtype != DType::Bool) {
      throw Error("mask", "dtype bool (true for a token that takes part)",
                  std::string("dtype ") + dtype_name(mask->dtype));
    }
    if (mask->shape[0] != dims[0] || mask->shape[1] != dims[1]) {
      throw Error(
          "mask",
          "shape [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "] ([B, S] of q)",
          "shape " + shape_string(*mask));
    }
  }
  return dims;
}

AttentionMask attention_mask(const std::optional<ConstTensorView>& mask) {
  if (!mask) return {};
  return {static_cast<const std::uint8_t*>(mask->data), mask->strides[0], mask->strides[1]};
}

CallRecord attention_record(Direction direction, const AttentionOptions& options,
                            DType output_dtype) {
  CallRecord record = record_of(OpType::Attention, direction, output_dtype);
  add_option(record, choice("layout", layout_name(options.layout)));
  return record;
}

}  // namespace

Call<AttentionProblem> attention_forward_call(const ConstTensorView& q, const ConstTensorView& k,
                                              const ConstTensorView& v,
                                              const std::optional<ConstTensorView>& mask,
                                              const TensorView& out,
                                              const AttentionOptions& options) {
  const Layout layout = options.layout;
  const std::array<std::int64_t, 4> dims = check_attention_inputs(q, k, v, mask, layout);
  check_view("out", out, 4, 4, {"rank 4 (the shape of q)"});
  check_same_shape("out", out, "q", q);
  Call<AttentionProblem> call{attention_record(Direction::Forward, options, out.dtype), {}};
  check_call(call.record, {q, k, v, mask, out});
  call.problem = {dims[0],
                  dims[1],
                  dims[2],
                  dims[3],
                  attention_input(q, layout),
                  attention_input(k, layout),
                  attention_input(v, layout),
                  attention_mask(mask),
                  attention_output(out, layout)};
  return call;
}

Call<AttentionBackwardProblem> attention_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
    const std::optional<ConstTensorView>& mask, const ConstTensorView& out,
    const ConstTensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
    const AttentionOptions& options) {
  const Layout layout = options.layout;
  const std::array<std::int64_t, 4> dims = check_attention_inputs(q, k, v, mask, layout);
  const auto check_like_q = [&](const char* name, const ConstTensorView& t) {
    check_view(name, t, 4, 4, {"rank 4 (the shape of q)"});
    check_same_shape(name, t, "q", q);
  };
  check_like_q("out", out);
  check_like_q("dout", dout);
  check_like_q("dq", dq);
  check_like_q("dk", dk);
  check_like_q("dv", dv);
  Call<AttentionBackwardProblem> call{attention_record(Direction::Backward, options, dq.dtype), {}};
  check_call(call.record, {q, k, v, mask, out, dout, dq, dk, dv});
  call.problem = {dims[0],
                  dims[1],
                  dims[2],
                  dims[3],
                  attention_input(q, layout),
                  attention_input(k, layout),
                  attention_input(v, layout),
                  attention_mask(mask),
                  attention_input(out, layout),
                  attention_input(dout, layout),
                  attention_output(dq, layout),
                  attention_output(dk, layout),
                  attention_output(dv, layout)};
  return call;
}

}  // namespace detail

void attention_forward(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       const std::optional<ConstTensorView>& mask, const TensorView& out,
                       const AttentionOptions& options, const ExecutionContext& context) {
  detail::run<OpType::Attention, Direction::Forward>(
      context, [&] { return detail::attention_forward_call(q, k, v, mask, out, options); });
}

void attention_backward(const ConstTensorView& q, const ConstTensorView& k,
                        const ConstTensorView& v, const std::optional<ConstTensorView>& mask,
                        const ConstTensorView& out, const ConstTensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& options, const ExecutionContext& context) {
  detail::run<OpType::Attention, Direction::Backward>(context, [&] {
    return detail::attention_backward_call(q, k, v, mask, out, dout, dq, dk, dv, options);
  });
}

}  // namespace kernel_align
