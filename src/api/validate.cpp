// Argument checks of every op. Each failure names the argument, what was expected
// and what was found (kernel_align::Error).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/problems.hpp"
#include "kernel_align/error.hpp"

namespace kernel_align::detail {
namespace {

void check_view(const std::string& name, const ConstTensorView& v, int min_rank, int max_rank,
                const std::string& rank_meaning) {
  if (v.data == nullptr) throw Error(name, "a non-null data pointer", "null");
  if (v.rank < min_rank || v.rank > max_rank) {
    throw Error(name, rank_meaning, "rank " + std::to_string(v.rank));
  }
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] <= 0) throw Error(name, "a non-empty tensor (every dim > 0)", describe(v));
    if (v.strides[i] < 0) throw Error(name, "non-negative strides", describe(v));
  }
}

int check_head_dim(const std::string& name, std::int64_t d) {
  if (d < 2 || d > kMaxHeadDim || d % 2 != 0) {
    throw Error(name, "an even last dim D from 2 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(d));
  }
  return static_cast<int>(d);
}

void check_same_shape(const std::string& name, const ConstTensorView& v,
                      const std::string& reference_name, const ConstTensorView& reference) {
  bool same = v.rank == reference.rank;
  for (int i = 0; same && i < v.rank; ++i) same = v.shape[i] == reference.shape[i];
  if (!same) {
    throw Error(name, "shape " + shape_string(reference) + " (the shape of " + reference_name + ")",
                "shape " + shape_string(v));
  }
}

// Element offset one past the last element the view can touch.
std::int64_t extent(const ConstTensorView& v) {
  std::int64_t last = 0;
  for (int i = 0; i < v.rank; ++i) last += (v.shape[i] - 1) * v.strides[i];
  return last + 1;
}

// Sufficient condition for distinct elements: ordered by stride, each dim steps
// past everything the smaller-stride dims span.
void check_distinct_elements(const std::string& name, const ConstTensorView& v) {
  // Insertion sort of at most 4 dims (std::sort trips g++ 12's -Warray-bounds).
  std::array<int, kMaxRank> order{};
  for (int i = 0; i < v.rank; ++i) {
    int j = i;
    for (; j > 0 && v.strides[order[j - 1]] > v.strides[i]; --j) order[j] = order[j - 1];
    order[j] = i;
  }
  std::int64_t spanned = 1;
  for (int k = 0; k < v.rank; ++k) {
    const int dim = order[k];
    if (v.shape[dim] == 1) continue;
    if (v.strides[dim] < spanned) {
      throw Error(name, "an output whose elements do not overlap", describe(v));
    }
    spanned = v.strides[dim] * (v.shape[dim] - 1) + spanned;
  }
}

bool same_view(const ConstTensorView& a, const ConstTensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape &&
         a.strides == b.strides;
}

// The output may be an input itself (in place) or lie apart from it; anything in
// between would let a kernel read what it already overwrote.
void check_aliasing(const std::string& out_name, const ConstTensorView& out,
                    const std::string& in_name, const ConstTensorView& in, bool in_place_allowed) {
  if (in_place_allowed && same_view(out, in)) return;
  const auto* out_begin = static_cast<const unsigned char*>(out.data);
  const auto* out_end = out_begin + extent(out) * static_cast<std::int64_t>(dtype_size(out.dtype));
  const auto* in_begin = static_cast<const unsigned char*>(in.data);
  const auto* in_end = in_begin + extent(in) * static_cast<std::int64_t>(dtype_size(in.dtype));
  if (out_begin < in_end && in_begin < out_end) {
    throw Error(out_name,
                in_place_allowed ? "memory apart from '" + in_name + "' or exactly the same view"
                                 : "memory apart from '" + in_name + "'",
                "an overlapping view " + describe(out));
  }
}

void check_eps(float eps) {
  if (!std::isfinite(eps) || eps < 0.0f) {
    throw Error("eps", "a finite number >= 0", std::to_string(eps));
  }
}

void check_weight(const std::optional<ConstTensorView>& weight, int d) {
  if (!weight) return;
  check_view("weight", *weight, 1, 1, "rank 1 ([D])");
  if (weight->shape[0] != d) {
    throw Error("weight", "length " + std::to_string(d) + " (D of x)",
                "length " + std::to_string(weight->shape[0]));
  }
}

void check_table(const std::string& name, const ConstTensorView& table, std::int64_t seq, int d,
                 const char* layout) {
  check_view(name, table, 2, 2, "rank 2 ([S, D/2])");
  if (table.dtype != DType::F32 || table.shape[0] != seq || table.shape[1] != d / 2) {
    throw Error(name,
                "fp32 [" + std::to_string(seq) + ", " + std::to_string(d / 2) +
                    "] (S of the input in layout " + layout + ", D/2)",
                std::string(dtype_name(table.dtype)) + " " + shape_string(table));
  }
}

}  // namespace

SequenceTensor sequence_strides(const ConstTensorView& v, Layout layout) {
  const bool bshd = layout == Layout::BSHD;
  return {v.strides[0], v.strides[bshd ? 1 : 2], v.strides[bshd ? 2 : 1], v.strides[3]};
}

RowIndexer::RowIndexer(const ConstTensorView& v) : leading_(v.rank - 1) {
  for (int i = 0; i < leading_; ++i) {
    shape_[i] = v.shape[i];
    strides_[i] = v.strides[i];
    rows_ *= v.shape[i];
  }
}

std::int64_t RowIndexer::offset(std::int64_t r) const {
  std::int64_t off = 0;
  for (int i = leading_ - 1; i >= 0; --i) {
    off += (r % shape_[i]) * strides_[i];
    r /= shape_[i];
  }
  return off;
}

RmsNormForwardProblem make_rmsnorm_forward(const ConstTensorView& x,
                                           const std::optional<ConstTensorView>& weight,
                                           const TensorView& y, const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, "rank 1 to 4 ([..., D])");
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_weight(weight, d);
  check_view("y", y, 1, kMaxRank, "rank 1 to 4 ([..., D])");
  check_same_shape("y", y, "x", x);
  check_distinct_elements("y", y);
  check_aliasing("y", y, "x", x, true);
  if (weight) check_aliasing("y", y, "weight", *weight, false);
  check_eps(options.eps);
  return {x, weight, y, options, d};
}

RmsNormBackwardProblem make_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                                             const std::optional<ConstTensorView>& weight,
                                             const TensorView& dx,
                                             const std::optional<TensorView>& dw,
                                             const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, "rank 1 to 4 ([..., D])");
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_view("dy", dy, 1, kMaxRank, "rank 1 to 4 ([..., D])");
  check_same_shape("dy", dy, "x", x);
  check_weight(weight, d);
  check_view("dx", dx, 1, kMaxRank, "rank 1 to 4 ([..., D])");
  check_same_shape("dx", dx, "x", x);
  check_distinct_elements("dx", dx);
  // Each dx element is written after the row's x and dy elements are read.
  check_aliasing("dx", dx, "x", x, true);
  check_aliasing("dx", dx, "dy", dy, true);
  if (weight) check_aliasing("dx", dx, "weight", *weight, false);
  if (dw) {
    if (!weight) throw Error("dw", "no dw without a weight", "a dw output");
    check_view("dw", *dw, 1, 1, "rank 1 ([D])");
    check_same_shape("dw", *dw, "weight", *weight);
    check_aliasing("dw", *dw, "x", x, false);
    check_aliasing("dw", *dw, "dy", dy, false);
    check_aliasing("dw", *dw, "weight", *weight, false);
    check_aliasing("dw", *dw, "dx", dx, false);
  }
  check_eps(options.eps);
  return {x, dy, weight, dx, dw, options, d};
}

RopeProblem make_rope(const ConstTensorView& in, const ConstTensorView& cos,
                      const ConstTensorView& sin, const TensorView& out, const RopeOptions& options,
                      bool transpose, const char* in_name, const char* out_name) {
  const char* layout = layout_name(options.layout);
  const std::string rank_meaning =
      std::string("rank 4 (layout ") + layout +
      (options.layout == Layout::BSHD ? ": [B, S, H, D])" : ": [B, H, S, D])");
  check_view(in_name, in, 4, 4, rank_meaning);
  const int d = check_head_dim(in_name, in.shape[3]);
  check_view(out_name, out, 4, 4, rank_meaning);
  check_same_shape(out_name, out, in_name, in);
  check_distinct_elements(out_name, out);
  check_aliasing(out_name, out, in_name, in, true);
  // The layout, not a flattened row index, says which dim is the sequence.
  const std::int64_t seq = in.shape[options.layout == Layout::BSHD ? 1 : 2];
  check_table("cos", cos, seq, d, layout);
  check_table("sin", sin, seq, d, layout);
  check_aliasing(out_name, out, "cos", cos, false);
  check_aliasing(out_name, out, "sin", sin, false);
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
  p.heads = in.shape[options.layout == Layout::BSHD ? 2 : 1];
  p.d = d;
  return p;
}

namespace {

// k (or dk_out) must agree with q (or dq_out) in B, S and D.
void check_matches(const ConstTensorView& k, const char* k_name, const ConstTensorView& q,
                   const char* q_name, Layout layout) {
  check_view(k_name, k, 4, 4, "rank 4 (as " + std::string(q_name) + ")");
  const int seq_dim = layout == Layout::BSHD ? 1 : 2;
  if (k.shape[0] != q.shape[0] || k.shape[seq_dim] != q.shape[seq_dim] ||
      k.shape[3] != q.shape[3]) {
    const auto bsd = [&](const ConstTensorView& v) {
      return "B = " + std::to_string(v.shape[0]) + ", S = " + std::to_string(v.shape[seq_dim]) +
             ", D = " + std::to_string(v.shape[3]);
    };
    throw Error(k_name, bsd(q) + " (those of " + q_name + ")", bsd(k));
  }
}

void check_text_len(std::int64_t text_len, std::int64_t seq) {
  if (text_len < 0 || text_len > seq) {
    throw Error("text_len", "0 to S = " + std::to_string(seq), std::to_string(text_len));
  }
}

// One of the four norm weights of a fused call, with the names messages give it.
struct WeightSlot {
  const char* weight_name;
  const char* grad_name;
  const std::optional<ConstTensorView>* weight;
  const std::optional<TensorView>* grad;  // null in the forward
  bool text;                              // text positions, else image positions
  bool q;                                 // a weight of q, else of k
};

std::array<WeightSlot, 4> weight_slots(const QkNormWeights& w, const QkNormWeightGrads* g) {
  return {
      {{"weights.text_q", "weight_grads.text_q", &w.text_q, g ? &g->text_q : nullptr, true, true},
       {"weights.image_q", "weight_grads.image_q", &w.image_q, g ? &g->image_q : nullptr, false,
        true},
       {"weights.text_k", "weight_grads.text_k", &w.text_k, g ? &g->text_k : nullptr, true, false},
       {"weights.image_k", "weight_grads.image_k", &w.image_k, g ? &g->image_k : nullptr, false,
        false}}};
}

// Every weight has length D; every gradient has its weight, length D, and lies apart
// from the other gradients.
void check_weight_slots(const std::array<WeightSlot, 4>& slots, int d) {
  for (std::size_t a = 0; a < slots.size(); ++a) {
    const WeightSlot& s = slots[a];
    if (*s.weight) {
      check_view(s.weight_name, **s.weight, 1, 1, "rank 1 ([D])");
      if ((*s.weight)->shape[0] != d) {
        throw Error(s.weight_name, "length " + std::to_string(d) + " (D of q)",
                    "length " + std::to_string((*s.weight)->shape[0]));
      }
    }
    if (s.grad == nullptr || !*s.grad) continue;
    if (!*s.weight) throw Error(s.grad_name, "no weight gradient without its weight", "one");
    check_view(s.grad_name, **s.grad, 1, 1, "rank 1 ([D])");
    check_same_shape(s.grad_name, **s.grad, s.weight_name, **s.weight);
    for (std::size_t b = 0; b < a; ++b) {
      if (slots[b].grad != nullptr && *slots[b].grad) {
        check_aliasing(s.grad_name, **s.grad, slots[b].grad_name, **slots[b].grad, false);
      }
    }
  }
}

// Sequence range of a stream: text [0, text_len), image [text_len, S).
std::pair<std::int64_t, std::int64_t> stream_range(bool text, std::int64_t text_len,
                                                   std::int64_t seq) {
  return text ? std::pair{std::int64_t{0}, text_len} : std::pair{text_len, seq};
}

}  // namespace

QkNormRopeForwardProblem make_qk_norm_rope_forward(
    const ConstTensorView& q, const ConstTensorView& k, const QkNormWeights& weights,
    const ConstTensorView& cos, const ConstTensorView& sin, const TensorView& q_out,
    const TensorView& k_out, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = make_rope(q, cos, sin, q_out, rope, false, "q", "q_out");
  check_matches(k, "k", q, "q", options.layout);
  const RopeProblem k_rope = make_rope(k, cos, sin, k_out, rope, false, "k", "k_out");
  check_text_len(options.text_len, q_rope.seq);
  check_aliasing("q_out", q_out, "k", k, false);
  check_aliasing("q_out", q_out, "k_out", k_out, false);
  check_aliasing("k_out", k_out, "q", q, false);
  const auto slots = weight_slots(weights, nullptr);
  check_weight_slots(slots, q_rope.d);
  check_eps(options.eps);

  QkNormRopeForwardProblem problem;
  const RmsNormOptions norm{options.eps, options.mode};
  for (const WeightSlot& slot : slots) {
    const RopeProblem& rp =
        slot.weight_name[std::string_view(slot.weight_name).size() - 1] == 'q' ? q_rope : k_rope;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) continue;
    problem.streams.push_back({sequence_slice(rp.in, options.layout, begin, end),
                               sequence_slice(rp.out, options.layout, begin, end), *slot.weight,
                               rp.in_strides, rp.out_strides, cos, sin, begin, norm, rope, rp.d});
  }
  return problem;
}

QkNormRopeBackwardProblem make_qk_norm_rope_backward(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = make_rope(dq_out, cos, sin, dq, rope, true, "dq_out", "dq");
  check_matches(dk_out, "dk_out", dq_out, "dq_out", options.layout);
  const RopeProblem k_rope = make_rope(dk_out, cos, sin, dk, rope, true, "dk_out", "dk");
  check_view("q", q, 4, 4, "rank 4 (the shape of dq_out)");
  check_same_shape("q", q, "dq_out", dq_out);
  check_view("k", k, 4, 4, "rank 4 (the shape of dk_out)");
  check_same_shape("k", k, "dk_out", dk_out);
  check_text_len(options.text_len, q_rope.seq);
  // dq may be dq_out or q itself (each row is read whole before it is written).
  check_aliasing("dq", dq, "q", q, true);
  check_aliasing("dk", dk, "k", k, true);
  check_aliasing("dq", dq, "k", k, false);
  check_aliasing("dq", dq, "dk_out", dk_out, false);
  check_aliasing("dk", dk, "q", q, false);
  check_aliasing("dk", dk, "dq_out", dq_out, false);
  check_aliasing("dq", dq, "dk", dk, false);
  const auto slots = weight_slots(weights, &weight_grads);
  check_weight_slots(slots, q_rope.d);
  check_eps(options.eps);

  QkNormRopeBackwardProblem problem;
  const RmsNormOptions norm{options.eps, options.mode};
  for (const WeightSlot& slot : slots) {
    const RopeProblem& rp = slot.q ? q_rope : k_rope;
    const ConstTensorView& x_full = slot.q ? q : k;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) {
      // A stream without positions sums no rows: its weight gradient is +0.
      if (*slot.grad) problem.empty_stream_grads.push_back(**slot.grad);
      continue;
    }
    const ConstTensorView x = sequence_slice(x_full, options.layout, begin, end);
    const ConstTensorView dy = sequence_slice(rp.in, options.layout, begin, end);
    const TensorView dx = sequence_slice(rp.out, options.layout, begin, end);
    // The rmsnorm-level checks (aliasing of dw with x, dy, dx and the weight).
    const RmsNormBackwardProblem n =
        make_rmsnorm_backward(x, dy, *slot.weight, dx, *slot.grad, norm);
    problem.streams.push_back({x, dy, dx, n.weight, n.dw, sequence_strides(x_full, options.layout),
                               rp.in_strides, rp.out_strides, cos, sin, begin, norm, rope, rp.d});
  }
  return problem;
}

}  // namespace kernel_align::detail
