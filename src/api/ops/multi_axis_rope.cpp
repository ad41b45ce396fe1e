// multi_axis_rope: x [B, S, H, D] or [B, H, S, D] rotated by the fp32 tables. Its validator (each
// argument checked and named, the call's tensors listed once for the aliasing rule) and its public
// functions (kernel_align/ops.hpp).
#include "api/ops/multi_axis_rope.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

namespace {

void check_table(const char* name, const ConstTensorView& table, std::int64_t seq, int d,
                 const char* layout) {
  check_view(name, table, 2, 2, {"rank 2 ([S, D/2])"});
  if (table.dtype != DType::F32 || table.shape[0] != seq || table.shape[1] != d / 2) {
    throw Error(name,
                "fp32 [" + std::to_string(seq) + ", " + std::to_string(d / 2) +
                    "] (S of the input in layout " + layout + ", D/2)",
                std::string(dtype_name(table.dtype)) + " " + shape_string(table));
  }
}

// The rotation of `in` into `out` (`in_name`, `out_name` in messages): shapes and

}  // namespace

SequenceTensor sequence_strides(const ConstTensorView& v, Layout layout) {
  const bool bshd = layout == Layout::BSHD;
  return {v.strides[0], v.strides[bshd ? 1 : 2], v.strides[bshd ? 2 : 1], v.strides[3]};
}

RopeProblem rope_problem(const ConstTensorView& in, const ConstTensorView& cos,
                         const ConstTensorView& sin, const TensorView& out,
                         const RopeOptions& options, bool transpose, const char* in_name,
                         const char* out_name) {
  const bool bshd = options.layout == Layout::BSHD;
  const char* layout = layout_name(options.layout);
  const Words rank_meaning = {"rank 4 (layout ", layout,
                              bshd ? ": [B, S, H, D])" : ": [B, H, S, D])"};
  check_view(in_name, in, 4, 4, rank_meaning);
  const int d = check_head_dim(in_name, in.shape[3]);
  check_view(out_name, out, 4, 4, rank_meaning);
  check_same_shape(out_name, out, in_name, in);
  // The layout, not a flattened row index, says which dim is the sequence.
  const std::int64_t seq = in.shape[bshd ? 1 : 2];
  check_table("cos", cos, seq, d, layout);
  check_table("sin", sin, seq, d, layout);
  RopeProblem p;
  p.in = in;
  p.out = out;
  p.in_strides = sequence_strides(in, options.layout);
  p.out_strides = sequence_strides(out, options.layout);
  p.cos = cos;
  p.sin = sin;
  p.options = options;
  p.transpose = transpose;
  p.batch = in.shape[0];
  p.seq = seq;
  p.heads = in.shape[bshd ? 2 : 1];
  p.d = d;
  return p;
}

Call<RopeProblem> rope_call(Direction direction, const ConstTensorView& in,
                            const ConstTensorView& cos, const ConstTensorView& sin,
                            const TensorView& out, const RopeOptions& options) {
  const bool backward = direction == Direction::Backward;
  const char* in_name = backward ? "dy" : "x";
  const char* out_name = backward ? "dx" : "y";
  const RopeProblem problem = rope_problem(in, cos, sin, out, options, backward, in_name, out_name);
  Call<RopeProblem> call{record_of(OpType::MultiAxisRope, direction, out.dtype), problem};
  add_option(call.record, choice("layout", layout_name(options.layout)));
  add_option(call.record, choice("pairing", pairing_name(options.pairing)));
  check_call(call.record, {in, cos, sin, out});
  return call;
}

}  // namespace detail

void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options, const ExecutionContext& context) {
  detail::run<OpType::MultiAxisRope, Direction::Forward>(
      context, [&] { return detail::rope_call(Direction::Forward, x, cos, sin, y, options); });
}

void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options, const ExecutionContext& context) {
  detail::run<OpType::MultiAxisRope, Direction::Backward>(
      context, [&] { return detail::rope_call(Direction::Backward, dy, cos, sin, dx, options); });
}

}  // namespace kernel_align
