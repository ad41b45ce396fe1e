// The row-kernel tables of the CPU paths, and the validated problems as RowPlans. This
// file is compiled for the baseline CPU: it reads the problem structs (std::optional,
// tensor views) so that the files compiled for an instruction set never do.
#include "cpu/kernels.hpp"

#include <string>

#include "kernel_align/error.hpp"

namespace kernel_align::cpu {
namespace {

static_assert(kMaxRowLength == kMaxHeadDim);

// The leading dims of a view of rank 1..4, right-aligned into kLeadingDims dims.
void set_leading(const ConstTensorView& v, std::int64_t (&extents)[kLeadingDims],
                 std::int64_t (&strides)[kLeadingDims]) {
  const int leading = v.rank - 1;
  for (int dim = 0; dim < kLeadingDims; ++dim) {
    const int from = dim - (kLeadingDims - leading);
    extents[dim] = from >= 0 ? v.shape[from] : 1;
    strides[dim] = from >= 0 ? v.strides[from] : 0;
  }
}

RowInput input_of(const ConstTensorView& v, std::int64_t (&extents)[kLeadingDims]) {
  RowInput in;
  in.data = v.data;
  in.dtype = v.dtype;
  set_leading(v, extents, in.strides);
  in.step = v.strides[v.rank - 1];
  return in;
}

RowOutput output_of(const TensorView& v, std::int64_t (&extents)[kLeadingDims]) {
  RowOutput out;
  out.data = v.data;
  out.dtype = v.dtype;
  set_leading(v, extents, out.strides);
  out.step = v.strides[v.rank - 1];
  return out;
}

NormParams norm_of(const std::optional<ConstTensorView>& weight, const RmsNormOptions& options) {
  NormParams norm;
  if (weight) {
    norm.weight = weight->data;
    norm.weight_dtype = weight->dtype;
    norm.weight_step = weight->strides[0];
  }
  norm.mode = options.mode;
  norm.eps = options.eps;
  return norm;
}

RopeParams rope_of(const ConstTensorView& cos, const ConstTensorView& sin, std::int64_t seq_offset,
                   const RopeOptions& options, bool transpose) {
  RopeParams rope;
  rope.cos = static_cast<const float*>(cos.data);
  rope.sin = static_cast<const float*>(sin.data);
  rope.cos_strides[0] = cos.strides[0];
  rope.cos_strides[1] = cos.strides[1];
  rope.sin_strides[0] = sin.strides[0];
  rope.sin_strides[1] = sin.strides[1];
  // Rows are the leading dims in the view's order: (b, s, h) or (b, h, s).
  rope.seq_dim = options.layout == Layout::BSHD ? 1 : 2;
  rope.seq_offset = seq_offset;
  rope.interleaved = options.pairing == Pairing::Interleaved;
  rope.transpose = transpose;
  return rope;
}

// The rows of `x` (and of `dy`, for a backward; null otherwise) into rows of `out`: the
// part of a plan every op fills. The op then sets the norm and rope parameters it uses.
RowPlan rows_plan(int d, const ConstTensorView& x, const ConstTensorView* dy,
                  const TensorView& out) {
  RowPlan plan;
  plan.d = d;
  plan.x = input_of(x, plan.extents);
  if (dy != nullptr) plan.dy = input_of(*dy, plan.extents);
  plan.out = output_of(out, plan.extents);
  return plan;
}

// A [B, S, D] tensor of adaln_modulation or adaln_gate_residual as rows (1, b, s).
template <class Row, class Strided>
Row token_rows(const Strided& t) {
  Row row;
  row.data = t.data;
  row.dtype = t.dtype;
  row.strides[0] = 0;
  row.strides[1] = t.strides[0];
  row.strides[2] = t.strides[1];
  row.step = t.strides[2];
  return row;
}

// The [B, S, D] tokens of a modulation call as rows of D elements: x and, for a backward,
// dy (its second input) into out, in the call's rounding mode. The op then sets the
// modulation vectors it uses.
template <class Problem>
RowPlan tokens_plan(const Problem& p, const detail::AdaLnInput& x, const detail::AdaLnInput* dy,
                    const detail::AdaLnOutput& out) {
  RowPlan plan;
  plan.extents[0] = 1;
  plan.extents[1] = p.batch;
  plan.extents[2] = p.seq;
  plan.d = p.dim;
  plan.x = token_rows<RowInput>(x);
  if (dy != nullptr) plan.dy = token_rows<RowInput>(*dy);
  plan.out = token_rows<RowOutput>(out);
  plan.modulation.mode = p.mode;
  return plan;
}

// A [B, D] modulation (a sequence stride of 0) as a sample's vector.
SampleVector sample_vector(const detail::AdaLnInput& v) {
  return {v.data, v.dtype, v.strides[0], v.strides[2]};
}

}  // namespace

RowPlan row_plan(const detail::RmsNormForwardProblem& p) {
  RowPlan plan = rows_plan(p.d, p.x, nullptr, p.y);
  plan.norm = norm_of(p.weight, p.options);
  return plan;
}

RowPlan row_plan(const detail::RmsNormBackwardProblem& p) {
  RowPlan plan = rows_plan(p.d, p.x, &p.dy, p.dx);
  plan.norm = norm_of(p.weight, p.options);
  return plan;
}

RowPlan row_plan(const detail::RopeProblem& p) {
  RowPlan plan = rows_plan(p.d, p.in, nullptr, p.out);
  plan.rope = rope_of(p.cos, p.sin, 0, p.options, p.transpose);
  return plan;
}

RowPlan row_plan(const detail::NormRopeForwardProblem& p) {
  RowPlan plan = rows_plan(p.d, p.x, nullptr, p.y);
  plan.norm = norm_of(p.weight, p.norm);
  plan.rope = rope_of(p.cos, p.sin, p.seq_offset, p.rope, false);
  return plan;
}

RowPlan row_plan(const detail::NormRopeBackwardProblem& p) {
  RowPlan plan = rows_plan(p.d, p.x, &p.dy, p.dx);
  plan.norm = norm_of(p.weight, p.norm);
  plan.rope = rope_of(p.cos, p.sin, p.seq_offset, p.rope, true);
  return plan;
}

RowPlan row_plan(const detail::GateResidualProblem& p) {
  RowPlan plan = tokens_plan(p, p.x, &p.y, p.out);
  plan.modulation.gate = sample_vector(p.gate);
  return plan;
}

RowPlan row_plan(const detail::GateResidualBackwardProblem& p) {
  RowPlan plan = tokens_plan(p, p.dout, &p.y, p.dy);
  plan.modulation.gate = sample_vector(p.gate);
  return plan;
}

RowPlan row_plan(const detail::AdaLnProblem& p) {
  RowPlan plan = tokens_plan(p, p.x, nullptr, p.y);
  plan.modulation.scale = sample_vector(p.scale);
  plan.modulation.shift = sample_vector(p.shift);
  plan.modulation.eps = p.eps;
  return plan;
}

RowPlan row_plan(const detail::AdaLnBackwardProblem& p) {
  RowPlan plan = tokens_plan(p, p.x, &p.dy, p.dx);
  plan.modulation.scale = sample_vector(p.scale);
  plan.modulation.eps = p.eps;
  plan.modulation.sums_scale = p.dscale.data != nullptr;
  plan.modulation.sums_shift = p.dshift.data != nullptr;
  return plan;
}

const RowKernels& row_kernels(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return portable_row_kernels;
#if defined(__x86_64__)
    case Isa::Avx2:
      return avx2_row_kernels;
    case Isa::Avx512:
      return avx512_row_kernels;
#else
    case Isa::Avx2:
    case Isa::Avx512:
      break;
#endif
  }
  throw Error("isa", "a path this build has (portable on this architecture)",
              std::string(isa_name(isa)));
}

}  // namespace kernel_align::cpu
