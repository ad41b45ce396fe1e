// Validated descriptions of one call, the form in which every backend receives
// work. Validation builds one (api/ops/<op>.cpp, as part of a call record: api/call.hpp)
// after checking every argument; a backend may assume all of it holds.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "api/activation_problem.hpp"
#include "api/adaln_problem.hpp"
#include "api/attention_problem.hpp"
#include "api/cfg_problem.hpp"
#include "api/flow_sde_problem.hpp"
#include "api/gate_residual_problem.hpp"
#include "api/gemm_problem.hpp"
#include "api/latent_problem.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"  // OpType, Direction

namespace kernel_align::detail {

// The rows of a view whose last dim is the row: row r is the r-th combination
// of the leading indices in row-major order, independent of the strides. Trivially
// copyable and KA_HD: device kernels take it by value.
class RowIndexer {
 public:
  RowIndexer() = default;
  explicit RowIndexer(const ConstTensorView& v) : leading_(v.rank - 1) {
    for (int i = 0; i < leading_; ++i) {
      shape_[i] = v.shape[i];
      strides_[i] = v.strides[i];
      rows_ *= v.shape[i];
    }
  }
  KA_HD std::int64_t rows() const { return rows_; }
  // Element offset of row r's first element.
  KA_HD std::int64_t offset(std::int64_t r) const {
    std::int64_t off = 0;
    for (int i = leading_ - 1; i >= 0; --i) {
      off += (r % shape_[i]) * strides_[i];
      r /= shape_[i];
    }
    return off;
  }

 private:
  int leading_ = 0;
  std::int64_t rows_ = 1;
  std::int64_t shape_[kMaxRank - 1]{};  // C arrays: usable in device code
  std::int64_t strides_[kMaxRank - 1]{};
};

// At most N items, held in place: the lists of a call (its tensor arguments, a fused
// call's streams) never allocate.
template <class T, int N>
class FixedList {
 public:
  void push_back(const T& item) {
    if (count_ == N) throw std::length_error("FixedList: more items than its capacity");
    items_[count_++] = item;
  }
  int size() const { return count_; }
  bool empty() const { return count_ == 0; }
  const T& front() const { return items_[0]; }
  T* begin() { return items_.data(); }
  T* end() { return items_.data() + count_; }
  const T* begin() const { return items_.data(); }
  const T* end() const { return items_.data() + count_; }

 private:
  std::array<T, N> items_{};
  int count_ = 0;
};

// The number of rows of a validated view (its elements over the last dim's length).
inline std::int64_t row_count(const ConstTensorView& v) {
  return v.numel() / v.shape[v.rank - 1];
}

struct RmsNormForwardProblem {
  ConstTensorView x;
  std::optional<ConstTensorView> weight;
  TensorView y;
  RmsNormOptions options;
  int d = 0;
};

struct RmsNormBackwardProblem {
  ConstTensorView x;
  ConstTensorView dy;
  std::optional<ConstTensorView> weight;
  TensorView dx;
  std::optional<TensorView> dw;
  RmsNormOptions options;
  int d = 0;
};

// A 4-D tensor addressed as (batch, sequence, head, d) whatever its layout.
struct SequenceTensor {
  std::int64_t stride_batch = 0;
  std::int64_t stride_seq = 0;
  std::int64_t stride_head = 0;
  std::int64_t stride_d = 0;
};

// The (batch, sequence, head, d) strides of a 4-D view in `layout`.
SequenceTensor sequence_strides(const ConstTensorView& v, Layout layout);

struct RopeProblem {
  ConstTensorView in;
  TensorView out;
  SequenceTensor in_strides;
  SequenceTensor out_strides;
  ConstTensorView cos;
  ConstTensorView sin;
  RopeOptions options;
  bool transpose = false;  // backward
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t heads = 0;
  int d = 0;
};

// One stream (the text or the image positions) of q or k in the fused op: x and y
// are views of that stream's sequence range; the table row of local sequence index
// s is seq_offset + s.
struct NormRopeForwardProblem {
  ConstTensorView x;
  TensorView y;
  std::optional<ConstTensorView> weight;
  SequenceTensor x_strides;
  SequenceTensor y_strides;
  ConstTensorView cos;
  ConstTensorView sin;
  std::int64_t seq_offset = 0;
  RmsNormOptions norm;
  RopeOptions rope;
  int d = 0;
};

// Gradients of one stream: g = rope-transpose(dy) rounded to dy's dtype, then the
// rmsnorm backward of (x, g).
struct NormRopeBackwardProblem {
  ConstTensorView x;
  ConstTensorView dy;
  TensorView dx;
  std::optional<ConstTensorView> weight;
  std::optional<TensorView> dw;
  SequenceTensor x_strides;
  SequenceTensor dy_strides;
  SequenceTensor dx_strides;
  ConstTensorView cos;
  ConstTensorView sin;
  std::int64_t seq_offset = 0;
  RmsNormOptions norm;
  RopeOptions rope;
  int d = 0;
};

// The four streams of a fused call, in the order q text, q image, k text, k image
// (streams with no positions are left out).
inline constexpr int kMaxStreams = 4;
struct QkNormRopeForwardProblem {
  FixedList<NormRopeForwardProblem, kMaxStreams> streams;
};
struct QkNormRopeBackwardProblem {
  FixedList<NormRopeBackwardProblem, kMaxStreams> streams;
  // Weight gradients of streams with no rows: every backend stores +0 into them.
  FixedList<TensorView, kMaxStreams> empty_stream_grads;
};

// Stores +0 into the empty streams' weight gradients, for backends whose outputs are in
// host memory.
inline void zero_empty_stream_grads_on_host(const QkNormRopeBackwardProblem& p) {
  for (const TensorView& dw : p.empty_stream_grads) {
    for (std::int64_t i = 0; i < dw.shape[0]; ++i) {
      contract::store_output(dw.dtype, dw.data, i * dw.strides[0], 0.0f);
    }
  }
}

// The view restricted to sequence positions [begin, end) of `layout`.
template <class View>
View sequence_slice(const View& v, Layout layout, std::int64_t begin, std::int64_t end) {
  return narrow(v, layout == Layout::BSHD ? 1 : 2, begin, end);
}

// Rows of a 4-D view in its own dim order: (b, s, h) for BSHD, (b, h, s) for BHSD.
// Row r's local sequence index.
KA_HD inline std::int64_t row_sequence_index(std::int64_t r, std::int64_t dim1, std::int64_t dim2,
                                             Layout layout) {
  return layout == Layout::BSHD ? (r / dim2) % dim1 : r % dim2;
}

// The problem each (op, direction) kernel takes: Problem<OpType::QkRmsNorm,
// Direction::Forward> is RmsNormForwardProblem. The registry's kernel slots are typed by it.
template <OpType op, Direction d>
struct ProblemOf;
#define KERNEL_ALIGN_PROBLEM(op, direction, problem)   \
  template <>                                          \
  struct ProblemOf<OpType::op, Direction::direction> { \
    using type = problem;                              \
  };
KERNEL_ALIGN_PROBLEM(QkRmsNorm, Forward, RmsNormForwardProblem)
KERNEL_ALIGN_PROBLEM(QkRmsNorm, Backward, RmsNormBackwardProblem)
KERNEL_ALIGN_PROBLEM(MultiAxisRope, Forward, RopeProblem)
KERNEL_ALIGN_PROBLEM(MultiAxisRope, Backward, RopeProblem)
KERNEL_ALIGN_PROBLEM(QkNormRope, Forward, QkNormRopeForwardProblem)
KERNEL_ALIGN_PROBLEM(QkNormRope, Backward, QkNormRopeBackwardProblem)
KERNEL_ALIGN_PROBLEM(Linear, Forward, GemmProblem)
KERNEL_ALIGN_PROBLEM(Linear, Backward, LinearBackwardProblem)
KERNEL_ALIGN_PROBLEM(Attention, Forward, AttentionProblem)
KERNEL_ALIGN_PROBLEM(Attention, Backward, AttentionBackwardProblem)
KERNEL_ALIGN_PROBLEM(AdaLnModulation, Forward, AdaLnProblem)
KERNEL_ALIGN_PROBLEM(AdaLnModulation, Backward, AdaLnBackwardProblem)
KERNEL_ALIGN_PROBLEM(AdaLnGateResidual, Forward, GateResidualProblem)
KERNEL_ALIGN_PROBLEM(AdaLnGateResidual, Backward, GateResidualBackwardProblem)
KERNEL_ALIGN_PROBLEM(Activation, Forward, ActivationProblem)
KERNEL_ALIGN_PROBLEM(Activation, Backward, ActivationBackwardProblem)
KERNEL_ALIGN_PROBLEM(FlowSdeStep, Forward, FlowSdeStepProblem)
KERNEL_ALIGN_PROBLEM(FlowSdeStep, Backward, FlowSdeStepBackwardProblem)
KERNEL_ALIGN_PROBLEM(FlowSdeLogp, Forward, FlowSdeLogpProblem)
KERNEL_ALIGN_PROBLEM(FlowSdeLogp, Backward, FlowSdeLogpBackwardProblem)
KERNEL_ALIGN_PROBLEM(LatentNormalize, Forward, LatentNormalizeProblem)
KERNEL_ALIGN_PROBLEM(LatentNormalize, Backward, LatentNormalizeProblem)
KERNEL_ALIGN_PROBLEM(LatentPack, Forward, LatentPackProblem)
KERNEL_ALIGN_PROBLEM(LatentPack, Backward, LatentUnpackProblem)
KERNEL_ALIGN_PROBLEM(TrueCfg, Forward, TrueCfgProblem)
KERNEL_ALIGN_PROBLEM(TrueCfg, Backward, TrueCfgBackwardProblem)
#undef KERNEL_ALIGN_PROBLEM
template <OpType op, Direction d>
using Problem = typename ProblemOf<op, d>::type;

}  // namespace kernel_align::detail
