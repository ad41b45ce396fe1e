// The fused op in the reference backend is its definition: the unfused reference
// ops one after the other, through an intermediate tensor of the storage dtype.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernel_align/contract/convert.hpp"
#include "reference/kernels.hpp"
#include "reference/reference.hpp"

namespace kernel_align::reference {
namespace {

// A contiguous tensor of `dtype` with the shape of `like`.
struct Intermediate {
  std::vector<std::uint32_t> storage;  // 4-byte words: aligned for every dtype
  TensorView view;

  Intermediate(const ConstTensorView& like, DType dtype) {
    const auto bytes = static_cast<std::size_t>(like.numel()) * dtype_size(dtype);
    storage.resize((bytes + 3) / 4);
    view = TensorView::contiguous(storage.data(), dtype,
                                  {like.shape[0], like.shape[1], like.shape[2], like.shape[3]});
  }
};

// The stream's table rows [seq_offset, seq_offset + S of the stream).
ConstTensorView table_rows(ConstTensorView table, std::int64_t seq_offset, std::int64_t rows) {
  table.data = static_cast<const float*>(table.data) + seq_offset * table.strides[0];
  table.shape[0] = rows;
  return table;
}

detail::RopeProblem rope_problem(const ConstTensorView& in,
                                 const detail::SequenceTensor& in_strides, const TensorView& out,
                                 const detail::SequenceTensor& out_strides,
                                 const ConstTensorView& cos, const ConstTensorView& sin,
                                 std::int64_t seq_offset, const RopeOptions& options,
                                 bool transpose, int d) {
  const bool bshd = options.layout == Layout::BSHD;
  detail::RopeProblem p;
  p.in = in;
  p.out = out;
  p.in_strides = in_strides;
  p.out_strides = out_strides;
  p.batch = in.shape[0];
  p.seq = in.shape[bshd ? 1 : 2];
  p.heads = in.shape[bshd ? 2 : 1];
  p.cos = table_rows(cos, seq_offset, p.seq);
  p.sin = table_rows(sin, seq_offset, p.seq);
  p.options = options;
  p.transpose = transpose;
  p.d = d;
  return p;
}

}  // namespace

void norm_rope_forward(const detail::NormRopeForwardProblem& p) {
  const Intermediate normalized(p.x, p.y.dtype);
  qk_rmsnorm_forward({p.x, p.weight, normalized.view, p.norm, p.d});
  multi_axis_rope(rope_problem(normalized.view,
                               detail::sequence_strides(normalized.view, p.rope.layout), p.y,
                               p.y_strides, p.cos, p.sin, p.seq_offset, p.rope, false, p.d));
}

void norm_rope_backward(const detail::NormRopeBackwardProblem& p) {
  const Intermediate g(p.dy, p.dy.dtype);
  multi_axis_rope(rope_problem(p.dy, p.dy_strides, g.view,
                               detail::sequence_strides(g.view, p.rope.layout), p.cos, p.sin,
                               p.seq_offset, p.rope, true, p.d));
  qk_rmsnorm_backward({p.x, g.view, p.weight, p.dx, p.dw, p.norm, p.d});
}

void add_qk_norm_rope_kernels(registry::Kernels& k) {
  k.set<OpType::QkNormRope, Direction::Forward>(
      [](const detail::QkNormRopeForwardProblem& p, registry::Execution& exec) {
        for (const auto& stream : p.streams) {
          record_scalar(exec, {detail::row_count(stream.x)});
          norm_rope_forward(stream);
        }
      });
  k.set<OpType::QkNormRope, Direction::Backward>(
      [](const detail::QkNormRopeBackwardProblem& p, registry::Execution& exec) {
        for (const auto& stream : p.streams) {
          record_scalar(exec, {detail::row_count(stream.x)});
          norm_rope_backward(stream);
        }
        detail::zero_empty_stream_grads_on_host(p);
      });
}

}  // namespace kernel_align::reference
