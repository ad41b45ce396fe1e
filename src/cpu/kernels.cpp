// The kernel tables of the CPU paths. This file is compiled for the baseline CPU: it
// turns each validated problem into a RowPlan (plain data, row_plan.hpp) and calls
// the row kernels of the path, which live in files compiled for their instruction set.
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

}  // namespace

RowPlan plan_of(const detail::RmsNormForwardProblem& p) {
  RowPlan plan;
  plan.d = p.d;
  plan.x = input_of(p.x, plan.extents);
  plan.out = output_of(p.y, plan.extents);
  plan.norm = norm_of(p.weight, p.options);
  return plan;
}

RowPlan plan_of(const detail::RmsNormBackwardProblem& p) {
  RowPlan plan;
  plan.d = p.d;
  plan.x = input_of(p.x, plan.extents);
  plan.dy = input_of(p.dy, plan.extents);
  plan.out = output_of(p.dx, plan.extents);
  plan.norm = norm_of(p.weight, p.options);
  return plan;
}

RowPlan plan_of(const detail::RopeProblem& p) {
  RowPlan plan;
  plan.d = p.d;
  plan.x = input_of(p.in, plan.extents);
  plan.out = output_of(p.out, plan.extents);
  plan.rope = rope_of(p.cos, p.sin, 0, p.options, p.transpose);
  return plan;
}

RowPlan plan_of(const detail::NormRopeForwardProblem& p) {
  RowPlan plan;
  plan.d = p.d;
  plan.x = input_of(p.x, plan.extents);
  plan.out = output_of(p.y, plan.extents);
  plan.norm = norm_of(p.weight, p.norm);
  plan.rope = rope_of(p.cos, p.sin, p.seq_offset, p.rope, false);
  return plan;
}

RowPlan plan_of(const detail::NormRopeBackwardProblem& p) {
  RowPlan plan;
  plan.d = p.d;
  plan.x = input_of(p.x, plan.extents);
  plan.dy = input_of(p.dy, plan.extents);
  plan.out = output_of(p.dx, plan.extents);
  plan.norm = norm_of(p.weight, p.norm);
  plan.rope = rope_of(p.cos, p.sin, p.seq_offset, p.rope, true);
  return plan;
}

namespace {

constexpr Kernels kPortable = kernels_over<portable_row_kernels>();
#if defined(__x86_64__)
constexpr Kernels kAvx2 = kernels_over<avx2_row_kernels>();
constexpr Kernels kAvx512 = kernels_over<avx512_row_kernels>();
#endif

}  // namespace

const Kernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return kPortable;
#if defined(__x86_64__)
    case Isa::Avx2:
      return kAvx2;
    case Isa::Avx512:
      return kAvx512;
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
