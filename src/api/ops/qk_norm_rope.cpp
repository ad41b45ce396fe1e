// qk_norm_rope, the fused QK norm and RoPE: q and k split into their text and image streams. Its
// validator (each argument checked and named, the call's tensors listed once for the aliasing rule)
// and its public functions (kernel_align/ops.hpp).
#include "api/ops/qk_norm_rope.hpp"

#include <array>
#include <utility>

#include "api/ops/multi_axis_rope.hpp"
#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

namespace {

// k (or dk_out) must agree with q (or dq_out) in B, S and D.
void check_matches(const ConstTensorView& k, const char* k_name, const ConstTensorView& q,
                   const char* q_name, Layout layout) {
  check_view(k_name, k, 4, 4, {"rank 4 (as ", q_name, ")"});
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

// One of the four norm weights of a fused call and its gradient, with their names in
// messages (the trace's are the descriptor's).
struct WeightSlot {
  const char* weight_argument;  // "weights.text_q"
  const char* grad_argument;    // "weight_grads.text_q"
  const std::optional<ConstTensorView>* weight;
  const std::optional<TensorView>* grad;  // null in the forward
  bool text;                              // text positions, else image positions
  bool q;                                 // a weight of q, else of k
};

// In the order of the API's structs and of the trace: text_q, text_k, image_q, image_k.
using WeightSlots = std::array<WeightSlot, 4>;

WeightSlots weight_slots(const QkNormWeights& w, const QkNormWeightGrads* g) {
  return {
      {{"weights.text_q", "weight_grads.text_q", &w.text_q, g ? &g->text_q : nullptr, true, true},
       {"weights.text_k", "weight_grads.text_k", &w.text_k, g ? &g->text_k : nullptr, true, false},
       {"weights.image_q", "weight_grads.image_q", &w.image_q, g ? &g->image_q : nullptr, false,
        true},
       {"weights.image_k", "weight_grads.image_k", &w.image_k, g ? &g->image_k : nullptr, false,
        false}}};
}

// The slots in the order of the streams (problems.hpp): q text, q image, k text, k image.
constexpr std::array<int, 4> kStreamOrder = {0, 2, 1, 3};

// Every weight has length D; every gradient has its weight and length D.
void check_weight_slots(const WeightSlots& slots, int d) {
  for (const WeightSlot& s : slots) {
    if (*s.weight) {
      check_view(s.weight_argument, **s.weight, 1, 1, {kVectorRank});
      if ((*s.weight)->shape[0] != d) {
        throw Error(s.weight_argument, "length " + std::to_string(d) + " (D of q)",
                    "length " + std::to_string((*s.weight)->shape[0]));
      }
    }
    if (s.grad == nullptr || !*s.grad) continue;
    if (!*s.weight) throw Error(s.grad_argument, "no weight gradient without its weight", "one");
    check_view(s.grad_argument, **s.grad, 1, 1, {kVectorRank});
    check_same_shape(s.grad_argument, **s.grad, s.weight_argument, **s.weight);
  }
}

CallRecord fused_record(Direction direction, const QkNormRopeOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::QkNormRope, direction, output_dtype);
  add_option(record, choice("layout", layout_name(options.layout)));
  add_option(record, choice("pairing", pairing_name(options.pairing)));
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  add_option(record, integer_value("text_len", options.text_len));
  return record;
}

// Sequence range of a stream: text [0, text_len), image [text_len, S).
std::pair<std::int64_t, std::int64_t> stream_range(bool text, std::int64_t text_len,
                                                   std::int64_t seq) {
  return text ? std::pair{std::int64_t{0}, text_len} : std::pair{text_len, seq};
}

}  // namespace

Call<QkNormRopeForwardProblem> qk_norm_rope_forward_call(
    const ConstTensorView& q, const ConstTensorView& k, const QkNormWeights& weights,
    const ConstTensorView& cos, const ConstTensorView& sin, const TensorView& q_out,
    const TensorView& k_out, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = rope_problem(q, cos, sin, q_out, rope, false, "q", "q_out");
  check_matches(k, "k", q, "q", options.layout);
  const RopeProblem k_rope = rope_problem(k, cos, sin, k_out, rope, false, "k", "k_out");
  check_text_len(options.text_len, q_rope.seq);
  const WeightSlots slots = weight_slots(weights, nullptr);
  check_weight_slots(slots, q_rope.d);
  Call<QkNormRopeForwardProblem> call{fused_record(Direction::Forward, options, q_out.dtype), {}};
  check_call(call.record, {q, k, weights.text_q, weights.text_k, weights.image_q, weights.image_k,
                           cos, sin, q_out, k_out});

  const RmsNormOptions norm{options.eps, options.mode};
  for (const int i : kStreamOrder) {
    const WeightSlot& slot = slots[static_cast<std::size_t>(i)];
    const RopeProblem& rp = slot.q ? q_rope : k_rope;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) continue;
    call.problem.streams.push_back({sequence_slice(rp.in, options.layout, begin, end),
                                    sequence_slice(rp.out, options.layout, begin, end),
                                    *slot.weight, rp.in_strides, rp.out_strides, cos, sin, begin,
                                    norm, rope, rp.d});
  }
  return call;
}

Call<QkNormRopeBackwardProblem> qk_norm_rope_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = rope_problem(dq_out, cos, sin, dq, rope, true, "dq_out", "dq");
  check_matches(dk_out, "dk_out", dq_out, "dq_out", options.layout);
  const RopeProblem k_rope = rope_problem(dk_out, cos, sin, dk, rope, true, "dk_out", "dk");
  check_view("q", q, 4, 4, {"rank 4 (the shape of dq_out)"});
  check_same_shape("q", q, "dq_out", dq_out);
  check_view("k", k, 4, 4, {"rank 4 (the shape of dk_out)"});
  check_same_shape("k", k, "dk_out", dk_out);
  check_text_len(options.text_len, q_rope.seq);
  const WeightSlots slots = weight_slots(weights, &weight_grads);
  check_weight_slots(slots, q_rope.d);
  Call<QkNormRopeBackwardProblem> call{fused_record(Direction::Backward, options, dq.dtype), {}};
  if (weight_grads.text_q || weight_grads.text_k || weight_grads.image_q || weight_grads.image_k) {
    record_dw_blocks(call.record);
  }
  check_call(call.record, {q, k, dq_out, dk_out, weights.text_q, weights.text_k, weights.image_q,
                           weights.image_k, cos, sin, dq, dk, weight_grads.text_q,
                           weight_grads.text_k, weight_grads.image_q, weight_grads.image_k});

  // A stream's views are slices of the call's tensors, so the call's aliasing rule
  // holds for each stream's x, dy, dx, weight and dw.
  const RmsNormOptions norm{options.eps, options.mode};
  for (const int i : kStreamOrder) {
    const WeightSlot& slot = slots[static_cast<std::size_t>(i)];
    const RopeProblem& rp = slot.q ? q_rope : k_rope;
    const ConstTensorView& x_full = slot.q ? q : k;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) {
      // A stream without positions sums no rows: its weight gradient is +0.
      if (*slot.grad) call.problem.empty_stream_grads.push_back(**slot.grad);
      continue;
    }
    call.problem.streams.push_back({sequence_slice(x_full, options.layout, begin, end),
                                    sequence_slice(rp.in, options.layout, begin, end),
                                    sequence_slice(rp.out, options.layout, begin, end),
                                    *slot.weight, *slot.grad,
                                    sequence_strides(x_full, options.layout), rp.in_strides,
                                    rp.out_strides, cos, sin, begin, norm, rope, rp.d});
  }
  return call;
}

}  // namespace detail

void qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                          const QkNormWeights& weights, const ConstTensorView& cos,
                          const ConstTensorView& sin, const TensorView& q_out,
                          const TensorView& k_out, const QkNormRopeOptions& options,
                          const ExecutionContext& context) {
  detail::run<OpType::QkNormRope, Direction::Forward>(context, [&] {
    return detail::qk_norm_rope_forward_call(q, k, weights, cos, sin, q_out, k_out, options);
  });
}

void qk_norm_rope_backward(const ConstTensorView& q, const ConstTensorView& k,
                           const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                           const QkNormWeights& weights, const ConstTensorView& cos,
                           const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
                           const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options,
                           const ExecutionContext& context) {
  detail::run<OpType::QkNormRope, Direction::Backward>(context, [&] {
    return detail::qk_norm_rope_backward_call(q, k, dq_out, dk_out, weights, cos, sin, dq, dk,
                                              weight_grads, options);
  });
}

}  // namespace kernel_align
