// Self-contained calls of every op for backend comparisons: inputs held in
// PlacedBuffers (any strides, any misalignment), a description of each output's
// storage, and run(), which allocates the outputs (every byte 0xA5), calls the op
// under whatever backend is set and returns every byte the outputs cover. Two
// backends agree on a case when their run() results are equal byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cases/configs.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "support/buffers.hpp"
#include "support/fused_composition.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align::test {

// Where an output lives.
struct BufferSpec {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::size_t misalign = 0;

  static BufferSpec contiguous(DType dtype, std::vector<std::int64_t> shape,
                               std::size_t misalign = 0) {
    std::vector<std::int64_t> strides = padded_strides(shape);
    return {dtype, std::move(shape), std::move(strides), misalign};
  }
  PlacedBuffer make() const { return PlacedBuffer(dtype, shape, strides, misalign); }
};

// A copy of `b` with the same strides and misalignment (for in-place calls).
inline PlacedBuffer clone(const PlacedBuffer& b, const std::vector<std::int64_t>& strides,
                          std::size_t misalign) {
  return placed_copy(b.cview(), strides, misalign);
}

inline std::optional<ConstTensorView> cview_of(const std::optional<PlacedBuffer>& b) {
  if (!b) return std::nullopt;
  return b->cview();
}

// ---------------------------------------------------------------------------
// Inputs.

// 2^k for |k| < 1000, exactly (faster than std::ldexp, which the generators below
// would call for every element).
inline double pow2(int k) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(1023 + k) << 52);
}

// Uniform in (-1, 1) times 2^k, k uniform in [-spread, spread] (as Rng::spread).
inline double fast_spread(Rng& rng, int spread) {
  const auto k = static_cast<int>(rng.below(2 * spread + 1)) - spread;
  return rng.uniform(-1.0, 1.0) * pow2(k);
}

// A tensor of `shape` with fast_spread(3) values rounded to dtype.
inline HostTensor spread_tensor(DType dtype, std::vector<std::int64_t> shape, Rng& rng) {
  HostTensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.elements(); ++i) t.set(i, fast_spread(rng, 3));
  return t;
}

// [..., D] values with rows of several kinds (row r of the flattened leading
// dims): zero; tiny (1e-5: fp16 subnormals); fp32/bf16 subnormal (2^-130); one
// outlier; and plain rows at scales 2^-2 .. 2^2 with a spread within the row.
inline HostTensor varied_rows(DType dtype, std::vector<std::int64_t> shape, Rng& rng) {
  HostTensor x(dtype, std::move(shape));
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = x.elements() / d;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double scale = r % 16 == 15 ? pow2(-130) * 0.25
                         : r % 8 == 3 ? 0.0
                         : r % 8 == 5 ? 1e-5 * pow2(static_cast<int>(r % 5) - 2)
                                      : pow2(static_cast<int>(r % 5) - 2);
    for (std::int64_t i = 0; i < d; ++i) {
      double v = fast_spread(rng, 3) * scale;
      if (r % 8 == 6 && i == d / 2) v = 200.0;
      x.set(r * d + i, v);
    }
  }
  return x;
}

inline HostTensor random_weight(DType dtype, std::int64_t d, Rng& rng) {
  HostTensor w(dtype, {d});
  for (std::int64_t i = 0; i < d; ++i) w.set(i, rng.uniform(-2.0, 2.0));
  return w;
}

struct TablePair {
  HostTensor cos;
  HostTensor sin;
};

// cos and sin of random angles, [S, D/2] fp32.
inline TablePair random_tables(std::int64_t seq, std::int64_t d, Rng& rng) {
  TablePair t{HostTensor(DType::F32, {seq, d / 2}), HostTensor(DType::F32, {seq, d / 2})};
  for (std::int64_t i = 0; i < seq * d / 2; ++i) {
    const double angle = rng.uniform(-100.0, 100.0);
    t.cos.set(i, std::cos(angle));
    t.sin.set(i, std::sin(angle));
  }
  return t;
}

// The stored shape of a logical [B, S, H, D] tensor in `layout`.
inline std::vector<std::int64_t> layout_shape(Layout layout, std::int64_t b, std::int64_t s,
                                              std::int64_t h, std::int64_t d) {
  return layout == Layout::BSHD ? std::vector<std::int64_t>{b, s, h, d}
                                : std::vector<std::int64_t>{b, h, s, d};
}

inline PlacedBuffer placed(const HostTensor& t, std::size_t misalign = 0) {
  return placed_copy(t.cview(), padded_strides(t.shape()), misalign);
}

// ---------------------------------------------------------------------------
// The ops.

struct NormForwardCase {
  PlacedBuffer x;
  std::optional<PlacedBuffer> weight;
  BufferSpec y;
  RmsNormOptions options;
  bool in_place = false;  // y is (a copy of) x itself

  Outputs run() const {
    if (in_place) {
      PlacedBuffer y_buf = clone(x, y.strides, y.misalign);
      qk_rmsnorm_forward(y_buf.cview(), cview_of(weight), y_buf.view(), options);
      return {named_bytes("y", y_buf)};
    }
    PlacedBuffer y_buf = y.make();
    qk_rmsnorm_forward(x.cview(), cview_of(weight), y_buf.view(), options);
    return {named_bytes("y", y_buf)};
  }
};

struct NormBackwardCase {
  PlacedBuffer x;
  PlacedBuffer dy;
  std::optional<PlacedBuffer> weight;
  BufferSpec dx;
  std::optional<BufferSpec> dw;
  RmsNormOptions options;
  bool in_place = false;  // dx is (a copy of) dy itself

  Outputs run() const {
    PlacedBuffer dx_buf = in_place ? clone(dy, dx.strides, dx.misalign) : dx.make();
    std::optional<PlacedBuffer> dw_buf;
    if (dw) dw_buf = dw->make();
    const ConstTensorView dy_view = in_place ? dx_buf.cview() : dy.cview();
    qk_rmsnorm_backward(x.cview(), dy_view, cview_of(weight), dx_buf.view(),
                        dw_buf ? std::optional<TensorView>(dw_buf->view()) : std::nullopt, options);
    Outputs out{named_bytes("dx", dx_buf)};
    if (dw_buf) out.push_back(named_bytes("dw", *dw_buf));
    return out;
  }
};

struct RopeCase {
  PlacedBuffer x;  // dy for the backward
  PlacedBuffer cos;
  PlacedBuffer sin;
  BufferSpec y;  // dx for the backward
  RopeOptions options;
  bool backward = false;
  bool in_place = false;

  Outputs run() const {
    PlacedBuffer y_buf = in_place ? clone(x, y.strides, y.misalign) : y.make();
    const ConstTensorView in = in_place ? y_buf.cview() : x.cview();
    if (backward) {
      multi_axis_rope_backward(in, cos.cview(), sin.cview(), y_buf.view(), options);
    } else {
      multi_axis_rope_forward(in, cos.cview(), sin.cview(), y_buf.view(), options);
    }
    return {named_bytes(backward ? "dx" : "y", y_buf)};
  }
};

// Weights in the order text_q, text_k, image_q, image_k.
using FourWeights = std::array<std::optional<PlacedBuffer>, 4>;
inline constexpr const char* kWeightNames[] = {"text_q", "text_k", "image_q", "image_k"};

inline QkNormWeights weights_of(const FourWeights& w) {
  return {cview_of(w[0]), cview_of(w[1]), cview_of(w[2]), cview_of(w[3])};
}

struct FusedForwardCase {
  PlacedBuffer q;
  PlacedBuffer k;
  FourWeights weights;
  PlacedBuffer cos;
  PlacedBuffer sin;
  BufferSpec q_out;
  BufferSpec k_out;
  QkNormRopeOptions options;
  bool in_place = false;  // q_out is q, k_out is k

  // The fused op, or (composed) its definition out of the unfused ops.
  Outputs run(bool composed = false) const {
    PlacedBuffer q_buf = in_place ? clone(q, q_out.strides, q_out.misalign) : q_out.make();
    PlacedBuffer k_buf = in_place ? clone(k, k_out.strides, k_out.misalign) : k_out.make();
    const ConstTensorView q_in = in_place ? q_buf.cview() : q.cview();
    const ConstTensorView k_in = in_place ? k_buf.cview() : k.cview();
    if (composed) {
      composed_qk_norm_rope_forward(q_in, k_in, weights_of(weights), cos.cview(), sin.cview(),
                                    q_buf.view(), k_buf.view(), options);
    } else {
      qk_norm_rope_forward(q_in, k_in, weights_of(weights), cos.cview(), sin.cview(), q_buf.view(),
                           k_buf.view(), options);
    }
    return {named_bytes("q_out", q_buf), named_bytes("k_out", k_buf)};
  }
};

struct FusedBackwardCase {
  PlacedBuffer q;
  PlacedBuffer k;
  PlacedBuffer dq_out;
  PlacedBuffer dk_out;
  FourWeights weights;
  PlacedBuffer cos;
  PlacedBuffer sin;
  BufferSpec dq;
  BufferSpec dk;
  std::array<std::optional<BufferSpec>, 4> dw;  // order of kWeightNames
  QkNormRopeOptions options;
  bool in_place = false;  // dq is dq_out, dk is dk_out

  Outputs run(bool composed = false) const {
    PlacedBuffer dq_buf = in_place ? clone(dq_out, dq.strides, dq.misalign) : dq.make();
    PlacedBuffer dk_buf = in_place ? clone(dk_out, dk.strides, dk.misalign) : dk.make();
    const ConstTensorView dq_in = in_place ? dq_buf.cview() : dq_out.cview();
    const ConstTensorView dk_in = in_place ? dk_buf.cview() : dk_out.cview();
    std::array<std::optional<PlacedBuffer>, 4> dw_buf;
    std::array<std::optional<TensorView>, 4> dw_view;
    for (std::size_t i = 0; i < 4; ++i) {
      if (!dw[i]) continue;
      dw_buf[i] = dw[i]->make();
      dw_view[i] = dw_buf[i]->view();
    }
    const QkNormWeightGrads grads{dw_view[0], dw_view[1], dw_view[2], dw_view[3]};
    if (composed) {
      composed_qk_norm_rope_backward(q.cview(), k.cview(), dq_in, dk_in, weights_of(weights),
                                     cos.cview(), sin.cview(), dq_buf.view(), dk_buf.view(), grads,
                                     options);
    } else {
      qk_norm_rope_backward(q.cview(), k.cview(), dq_in, dk_in, weights_of(weights), cos.cview(),
                            sin.cview(), dq_buf.view(), dk_buf.view(), grads, options);
    }
    Outputs out{named_bytes("dq", dq_buf), named_bytes("dk", dk_buf)};
    for (std::size_t i = 0; i < 4; ++i) {
      if (dw_buf[i]) out.push_back(named_bytes(std::string("dw ") + kWeightNames[i], *dw_buf[i]));
    }
    return out;
  }
};

// ---------------------------------------------------------------------------
// Building cases.

// How a buffer is laid out in memory.
enum class Strides : unsigned char {
  Contiguous,
  PaddedRows,  // 3 unused elements after every row
  EveryOther,  // the last dim has stride 2 (a slice of a wider buffer)
  Permuted,    // 4-D: dims 1 and 2 swapped in memory (a BHSD view of a BSHD buffer)
};

struct Placement {
  Strides strides = Strides::Contiguous;
  bool unaligned = false;  // first element 2 (16-bit) or 4 (fp32) bytes past 64

  std::vector<std::int64_t> strides_for(const std::vector<std::int64_t>& shape) const {
    const std::size_t rank = shape.size();
    switch (strides) {
      case Strides::Contiguous:
        break;
      case Strides::PaddedRows:
        return padded_strides(shape, 3);
      case Strides::EveryOther: {
        std::vector<std::int64_t> wide = shape;
        wide.back() *= 2;
        std::vector<std::int64_t> s = padded_strides(wide);
        s.back() = 2;
        return s;
      }
      case Strides::Permuted: {
        if (rank != 4) break;
        std::vector<std::int64_t> swapped = shape;
        std::swap(swapped[1], swapped[2]);
        std::vector<std::int64_t> s = padded_strides(swapped);
        std::swap(s[1], s[2]);
        return s;
      }
    }
    return padded_strides(shape);
  }
  std::size_t misalign(DType dtype) const { return unaligned ? unaligned_offset(dtype) : 0; }

  PlacedBuffer place(const HostTensor& t) const {
    return placed_copy(t.cview(), strides_for(t.shape()), misalign(t.dtype()));
  }
  BufferSpec spec(DType dtype, std::vector<std::int64_t> shape) const {
    std::vector<std::int64_t> s = strides_for(shape);
    return {dtype, std::move(shape), std::move(s), misalign(dtype)};
  }
  std::string name() const {
    static constexpr const char* kNames[] = {"contiguous", "padded_rows", "every_other",
                                             "permuted"};
    return std::string(kNames[static_cast<int>(strides)]) + (unaligned ? "_unaligned" : "");
  }
};

// Everything a case of any op needs; ops ignore what they do not use.
struct CaseSpec {
  DType in = DType::F32;        // x, q, k, dy, dq_out, dk_out
  DType out = DType::F32;       // y, dx, q_out, k_out, dq, dk
  std::optional<DType> weight;  // none: no weights
  std::optional<DType> dw;      // dtype of weight gradients; none: not asked for
  NormMode mode = NormMode::Single;
  Pairing pairing = Pairing::Interleaved;
  Layout layout = Layout::BSHD;
  std::int64_t batch = 2;
  std::int64_t seq = 7;
  std::int64_t heads = 3;
  std::int64_t k_heads = 2;  // fused ops only
  std::int64_t d = 18;
  std::int64_t text_len = 3;  // fused ops only
  Placement inputs;           // every input, weights and tables included
  Placement outputs;
  bool in_place = false;  // needs out == in and equal placements
  float eps = 1e-6f;
  int norm_rank = 4;  // unfused norm ops: rank of x ([B*S*H, D] for 2, [D] for 1)

  std::string name() const {
    std::string n =
        std::string(dtype_name(in)) + "_to_" + dtype_name(out) + "_w_" +
        (weight ? dtype_name(*weight) : "none") + "_dw_" + (dw ? dtype_name(*dw) : "none") + "_" +
        norm_mode_name(mode) + "_" + pairing_name(pairing) + "_" + layout_name(layout) + "_B" +
        std::to_string(batch) + "_S" + std::to_string(seq) + "_H" + std::to_string(heads) + "_Hk" +
        std::to_string(k_heads) + "_D" + std::to_string(d) + "_text" + std::to_string(text_len) +
        "_in_" + inputs.name() + "_out_" + outputs.name();
    if (norm_rank != 4) n += "_rank" + std::to_string(norm_rank);
    return in_place ? n + "_in_place" : n;
  }
  // In place, outputs are the inputs, so they share the inputs' placement.
  const Placement& out_placement() const { return in_place ? inputs : outputs; }
  std::vector<std::int64_t> norm_shape() const {
    switch (norm_rank) {
      case 1:
        return {d};  // needs batch * seq * heads == 1
      case 2:
        return {batch * seq * heads, d};
      case 3:
        return {batch * seq, heads, d};
      default:
        return {batch, seq, heads, d};
    }
  }
  std::vector<std::int64_t> q_shape() const { return layout_shape(layout, batch, seq, heads, d); }
  std::vector<std::int64_t> k_shape() const { return layout_shape(layout, batch, seq, k_heads, d); }
  std::optional<PlacedBuffer> make_weight(Rng& rng) const {
    if (!weight) return std::nullopt;
    return inputs.place(random_weight(*weight, d, rng));
  }
  std::optional<BufferSpec> dw_spec() const {
    if (!weight || !dw) return std::nullopt;
    return outputs.spec(*dw, {d});
  }
};

inline NormForwardCase make_norm_forward(const CaseSpec& c, Rng& rng) {
  return {c.inputs.place(varied_rows(c.in, c.norm_shape(), rng)), c.make_weight(rng),
          c.out_placement().spec(c.out, c.norm_shape()), RmsNormOptions{c.eps, c.mode}, c.in_place};
}

inline NormBackwardCase make_norm_backward(const CaseSpec& c, Rng& rng) {
  PlacedBuffer x = c.inputs.place(varied_rows(c.in, c.norm_shape(), rng));
  PlacedBuffer dy = c.inputs.place(spread_tensor(c.in, c.norm_shape(), rng));
  return {std::move(x),       std::move(dy),
          c.make_weight(rng), c.out_placement().spec(c.out, c.norm_shape()),
          c.dw_spec(),        RmsNormOptions{c.eps, c.mode},
          c.in_place};
}

inline RopeCase make_rope(const CaseSpec& c, bool backward, Rng& rng) {
  PlacedBuffer x = c.inputs.place(spread_tensor(c.in, c.q_shape(), rng));
  TablePair t = random_tables(c.seq, c.d, rng);
  return {std::move(x),
          c.inputs.place(t.cos),
          c.inputs.place(t.sin),
          c.out_placement().spec(c.out, c.q_shape()),
          RopeOptions{c.pairing, c.layout},
          backward,
          c.in_place};
}

inline FourWeights make_four_weights(const CaseSpec& c, Rng& rng) {
  FourWeights w;
  for (auto& one : w) one = c.make_weight(rng);
  return w;
}

inline QkNormRopeOptions fused_options(const CaseSpec& c) {
  return {c.eps, c.mode, c.pairing, c.layout, c.text_len};
}

inline FusedForwardCase make_fused_forward(const CaseSpec& c, Rng& rng) {
  PlacedBuffer q = c.inputs.place(varied_rows(c.in, c.q_shape(), rng));
  PlacedBuffer k = c.inputs.place(varied_rows(c.in, c.k_shape(), rng));
  FourWeights w = make_four_weights(c, rng);
  TablePair t = random_tables(c.seq, c.d, rng);
  return {std::move(q),
          std::move(k),
          std::move(w),
          c.inputs.place(t.cos),
          c.inputs.place(t.sin),
          c.out_placement().spec(c.out, c.q_shape()),
          c.out_placement().spec(c.out, c.k_shape()),
          fused_options(c),
          c.in_place};
}

inline FusedBackwardCase make_fused_backward(const CaseSpec& c, Rng& rng) {
  PlacedBuffer q = c.inputs.place(varied_rows(c.in, c.q_shape(), rng));
  PlacedBuffer k = c.inputs.place(varied_rows(c.in, c.k_shape(), rng));
  PlacedBuffer dq_out = c.inputs.place(spread_tensor(c.in, c.q_shape(), rng));
  PlacedBuffer dk_out = c.inputs.place(spread_tensor(c.in, c.k_shape(), rng));
  FourWeights w = make_four_weights(c, rng);
  TablePair t = random_tables(c.seq, c.d, rng);
  std::array<std::optional<BufferSpec>, 4> dw;
  for (auto& one : dw) one = c.dw_spec();
  return {std::move(q),
          std::move(k),
          std::move(dq_out),
          std::move(dk_out),
          std::move(w),
          c.inputs.place(t.cos),
          c.inputs.place(t.sin),
          c.out_placement().spec(c.out, c.q_shape()),
          c.out_placement().spec(c.out, c.k_shape()),
          std::move(dw),
          fused_options(c),
          c.in_place};
}

enum class OpKind : unsigned char {
  NormForward,
  NormBackward,
  RopeForward,
  RopeBackward,
  FusedForward,
  FusedBackward,
};
inline constexpr OpKind kAllOps[] = {OpKind::NormForward,  OpKind::NormBackward,
                                     OpKind::RopeForward,  OpKind::RopeBackward,
                                     OpKind::FusedForward, OpKind::FusedBackward};

inline const char* op_name(OpKind op) {
  static constexpr const char* kNames[] = {"qk_rmsnorm_forward",   "qk_rmsnorm_backward",
                                           "rope_forward",         "rope_backward",
                                           "qk_norm_rope_forward", "qk_norm_rope_backward"};
  return kNames[static_cast<int>(op)];
}
inline void PrintTo(OpKind op, std::ostream* os) {
  *os << op_name(op);
}
inline bool uses_norm(OpKind op) {
  return op != OpKind::RopeForward && op != OpKind::RopeBackward;
}
inline bool uses_rope(OpKind op) {
  return op != OpKind::NormForward && op != OpKind::NormBackward;
}
inline bool is_backward(OpKind op) {
  return op == OpKind::NormBackward || op == OpKind::RopeBackward || op == OpKind::FusedBackward;
}
inline OpType op_type_of(OpKind op) {
  return !uses_rope(op)   ? OpType::QkRmsNorm
         : !uses_norm(op) ? OpType::MultiAxisRope
                          : OpType::QkNormRope;
}

// The values of `options` (src/cases/configs.hpp), `unused` in place of the none of an
// op that does not have the option.
template <class T>
std::vector<T> option_values(const std::vector<std::optional<T>>& options, T unused) {
  std::vector<T> values;
  for (const std::optional<T>& o : options) values.push_back(o.value_or(unused));
  return values;
}

// Builds the case of `op` described by `c` (random data from `rng`) and calls
// f(the case).
template <class F>
void with_case(OpKind op, const CaseSpec& c, Rng& rng, const F& f) {
  switch (op) {
    case OpKind::NormForward:
      f(make_norm_forward(c, rng));
      return;
    case OpKind::NormBackward:
      f(make_norm_backward(c, rng));
      return;
    case OpKind::RopeForward:
      f(make_rope(c, false, rng));
      return;
    case OpKind::RopeBackward:
      f(make_rope(c, true, rng));
      return;
    case OpKind::FusedForward:
      f(make_fused_forward(c, rng));
      return;
    case OpKind::FusedBackward:
      f(make_fused_backward(c, rng));
      return;
  }
}

// The backend matrix of one op and dtype pairing: for each head dim in `head_dims`,
// every norm mode, pairing and layout the op has and every weight-gradient dtype
// (fp32, and the weight's own when it differs) of a backward op with a weight, builds
// the case (batch 2, 3 query / 2 key heads, 3 text tokens, seq_of(d) image tokens;
// random data from `rng`) and calls f(the case). Returns how many cases it built.
template <class SeqOf, class F>
int for_each_matrix_case(OpKind op, DType in, DType out, std::optional<DType> weight,
                         std::initializer_list<std::int64_t> head_dims, const SeqOf& seq_of,
                         Rng& rng, const F& f) {
  const OpType type = op_type_of(op);
  const std::vector<NormMode> modes = option_values(cases::norm_modes_of(type), NormMode::Single);
  const std::vector<Pairing> pairings =
      option_values(cases::pairings_of(type), Pairing::Interleaved);
  const std::vector<Layout> layouts = option_values(cases::layouts_of(type), Layout::BSHD);
  std::vector<std::optional<DType>> dws{std::nullopt};
  if (is_backward(op) && weight) {
    dws = {DType::F32};
    if (*weight != DType::F32) dws.push_back(*weight);
  }
  int cases = 0;
  for (std::int64_t d : head_dims) {
    for (NormMode mode : modes) {
      for (Pairing pairing : pairings) {
        for (Layout layout : layouts) {
          for (const std::optional<DType>& dw : dws) {
            CaseSpec c;
            c.in = in;
            c.out = out;
            c.weight = weight;
            c.dw = dw;
            c.mode = mode;
            c.pairing = pairing;
            c.layout = layout;
            c.batch = 2;
            c.seq = seq_of(d);
            c.heads = 3;
            c.k_heads = 2;
            c.d = d;
            c.text_len = 3;
            SCOPED_TRACE(c.name());
            with_case(op, c, rng, f);
            ++cases;
          }
        }
      }
    }
  }
  return cases;
}

// ---------------------------------------------------------------------------
// Comparisons.

// run() of `c` with the reference backend, then with every configuration: each
// must give the reference's bytes. Restores the runtime settings.
template <class Case>
void expect_configs_match_reference(const Case& c, const std::vector<RunConfig>& configs) {
  const RuntimeGuard guard;
  RunConfig::reference().apply();
  const Outputs expected = c.run();
  for (const RunConfig& config : configs) {
    config.apply();
    EXPECT_TRUE(same_bytes(expected, c.run())) << config.name();
  }
}

}  // namespace kernel_align::test
