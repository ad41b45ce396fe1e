// A problem whose every tensor view is moved to other memory by a Mirror: the cuda-host
// fallback runs the reference on host copies of device tensors, the on-device tests run
// the CUDA backend on device copies of host tensors. A Mirror provides
//   template <class View> View map(View v, bool output);  // the same view, elsewhere
// (the same memory for views of the same data and extent, so in place stays in place).
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "api/problems.hpp"

namespace kernel_align::cuda {

template <class Mirror, class View>
std::optional<View> map(Mirror& m, const std::optional<View>& v, bool output) {
  if (!v) return std::nullopt;
  return m.map(*v, output);
}

template <class Mirror>
detail::RmsNormForwardProblem rebased(const detail::RmsNormForwardProblem& p, Mirror& m) {
  detail::RmsNormForwardProblem r = p;
  r.x = m.map(p.x, false);
  r.weight = map(m, p.weight, false);
  r.y = m.map(p.y, true);
  return r;
}

template <class Mirror>
detail::RmsNormBackwardProblem rebased(const detail::RmsNormBackwardProblem& p, Mirror& m) {
  detail::RmsNormBackwardProblem r = p;
  r.x = m.map(p.x, false);
  r.dy = m.map(p.dy, false);
  r.weight = map(m, p.weight, false);
  r.dx = m.map(p.dx, true);
  r.dw = map(m, p.dw, true);
  return r;
}

template <class Mirror>
detail::RopeProblem rebased(const detail::RopeProblem& p, Mirror& m) {
  detail::RopeProblem r = p;
  r.in = m.map(p.in, false);
  r.cos = m.map(p.cos, false);
  r.sin = m.map(p.sin, false);
  r.out = m.map(p.out, true);
  return r;
}

template <class Mirror>
detail::QkNormRopeForwardProblem rebased(const detail::QkNormRopeForwardProblem& p, Mirror& m) {
  detail::QkNormRopeForwardProblem r = p;
  for (detail::NormRopeForwardProblem& s : r.streams) {
    s.x = m.map(s.x, false);
    s.weight = map(m, s.weight, false);
    s.cos = m.map(s.cos, false);
    s.sin = m.map(s.sin, false);
    s.y = m.map(s.y, true);
  }
  return r;
}

template <class Mirror>
detail::QkNormRopeBackwardProblem rebased(const detail::QkNormRopeBackwardProblem& p, Mirror& m) {
  detail::QkNormRopeBackwardProblem r = p;
  for (TensorView& dw : r.empty_stream_grads) dw = m.map(dw, true);
  for (detail::NormRopeBackwardProblem& s : r.streams) {
    s.x = m.map(s.x, false);
    s.dy = m.map(s.dy, false);
    s.weight = map(m, s.weight, false);
    s.cos = m.map(s.cos, false);
    s.sin = m.map(s.sin, false);
    s.dx = m.map(s.dx, true);
    s.dw = map(m, s.dw, true);
  }
  return r;
}

// A GEMM operand of `rows` x `cols` moved by the Mirror, as the 2-D view it is.
template <class Mirror, class Matrix>
Matrix rebased_matrix(Mirror& m, Matrix g, std::int64_t rows, std::int64_t cols, bool output) {
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(g.data));
  v.dtype = g.dtype;
  v.rank = 2;
  v.shape[0] = rows;
  v.shape[1] = cols;
  v.strides[0] = g.row_stride;
  v.strides[1] = g.col_stride;
  g.data = m.map(v, output).data;
  return g;
}

template <class Mirror>
detail::GemmProblem rebased(const detail::GemmProblem& p, Mirror& m) {
  detail::GemmProblem r = p;
  r.a = rebased_matrix(m, p.a, p.m, p.r, false);
  r.b = rebased_matrix(m, p.b, p.r, p.n, false);
  if (p.bias) r.bias = rebased_matrix(m, *p.bias, 1, p.n, false);
  if (p.grad_out) r.grad_out = rebased_matrix(m, *p.grad_out, p.m, p.n, false);
  const detail::GemmOutput c = rebased_matrix(
      m, detail::GemmOutput{p.c, p.c_dtype, p.c_row_stride, p.c_col_stride}, p.m, p.n, true);
  r.c = c.data;
  return r;
}

template <class Mirror>
detail::LinearBackwardProblem rebased(const detail::LinearBackwardProblem& p, Mirror& m) {
  detail::LinearBackwardProblem r = p;
  r.x = rebased_matrix(m, p.x, p.m, p.k, false);
  r.w = rebased_matrix(m, p.w, p.n, p.k, false);
  if (p.bias) r.bias = rebased_matrix(m, *p.bias, 1, p.n, false);
  r.dy = rebased_matrix(m, p.dy, p.m, p.n, false);
  if (p.dx) r.dx = rebased_matrix(m, *p.dx, p.m, p.k, true);
  if (p.dw) r.dw = rebased_matrix(m, *p.dw, p.n, p.k, true);
  if (p.db) r.db = rebased_matrix(m, *p.db, p.n, 1, true);
  return r;
}

// An attention tensor ([B, S, H, D] strides) moved by the Mirror, as the 4-D view it is.
template <class Mirror, class Tensor>
Tensor rebased_attention_tensor(Mirror& m, Tensor t, std::int64_t batch, std::int64_t seq,
                                std::int64_t heads, std::int64_t dim, bool output) {
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(t.data));
  v.dtype = t.dtype;
  v.rank = 4;
  v.shape = {batch, seq, heads, dim};
  v.strides = t.strides;
  t.data = static_cast<decltype(t.data)>(m.map(v, output).data);
  return t;
}

template <class Mirror>
detail::AttentionMask rebased_mask(Mirror& m, detail::AttentionMask mask, std::int64_t batch,
                                   std::int64_t seq) {
  if (mask.data == nullptr) return mask;
  TensorView v;
  v.data = const_cast<std::uint8_t*>(mask.data);
  v.dtype = DType::Bool;
  v.rank = 2;
  v.shape[0] = batch;
  v.shape[1] = seq;
  v.strides[0] = mask.batch_stride;
  v.strides[1] = mask.seq_stride;
  mask.data = static_cast<const std::uint8_t*>(m.map(v, false).data);
  return mask;
}

template <class Mirror, class Problem>
Problem rebased_attention(const Problem& p, Mirror& m) {
  Problem r = p;
  const auto move = [&](auto t, bool output) {
    return rebased_attention_tensor(m, t, p.batch, p.seq, p.heads, p.dim, output);
  };
  r.q = move(p.q, false);
  r.k = move(p.k, false);
  r.v = move(p.v, false);
  r.mask = rebased_mask(m, p.mask, p.batch, p.seq);
  if constexpr (std::is_same_v<Problem, detail::AttentionProblem>) {
    r.out = move(p.out, true);
  } else {
    r.out = move(p.out, false);
    r.dout = move(p.dout, false);
    r.dq = move(p.dq, true);
    r.dk = move(p.dk, true);
    r.dv = move(p.dv, true);
  }
  return r;
}

template <class Mirror>
detail::AttentionProblem rebased(const detail::AttentionProblem& p, Mirror& m) {
  return rebased_attention(p, m);
}

template <class Mirror>
detail::AttentionBackwardProblem rebased(const detail::AttentionBackwardProblem& p, Mirror& m) {
  return rebased_attention(p, m);
}

// An adaln_modulation tensor moved by the Mirror: x-like ones as [B, S, D], a sample's
// modulation (sequence stride 0) as the [B, D] view it is; an absent output stays absent.
template <class Mirror, class Tensor>
Tensor rebased_adaln_tensor(Mirror& m, Tensor t, std::int64_t batch, std::int64_t seq,
                            std::int64_t dim, bool output) {
  if (t.data == nullptr) return t;
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(t.data));
  v.dtype = t.dtype;
  if (t.strides[1] == 0) {
    v.rank = 2;
    v.shape[0] = batch;
    v.shape[1] = dim;
    v.strides[0] = t.strides[0];
    v.strides[1] = t.strides[2];
  } else {
    v.rank = 3;
    v.shape[0] = batch;
    v.shape[1] = seq;
    v.shape[2] = dim;
    v.strides[0] = t.strides[0];
    v.strides[1] = t.strides[1];
    v.strides[2] = t.strides[2];
  }
  t.data = static_cast<decltype(t.data)>(m.map(v, output).data);
  return t;
}

template <class Mirror>
detail::AdaLnProblem rebased(const detail::AdaLnProblem& p, Mirror& m) {
  detail::AdaLnProblem r = p;
  const auto move = [&](auto t, bool output) {
    return rebased_adaln_tensor(m, t, p.batch, p.seq, p.dim, output);
  };
  r.x = move(p.x, false);
  r.scale = move(p.scale, false);
  r.shift = move(p.shift, false);
  r.y = move(p.y, true);
  return r;
}

template <class Mirror>
detail::AdaLnBackwardProblem rebased(const detail::AdaLnBackwardProblem& p, Mirror& m) {
  detail::AdaLnBackwardProblem r = p;
  const auto move = [&](auto t, bool output) {
    return rebased_adaln_tensor(m, t, p.batch, p.seq, p.dim, output);
  };
  r.x = move(p.x, false);
  r.scale = move(p.scale, false);
  r.dy = move(p.dy, false);
  r.dx = move(p.dx, true);
  r.dscale = move(p.dscale, true);
  r.dshift = move(p.dshift, true);
  return r;
}

template <class Mirror>
detail::GateResidualProblem rebased(const detail::GateResidualProblem& p, Mirror& m) {
  detail::GateResidualProblem r = p;
  const auto move = [&](auto t, bool output) {
    return rebased_adaln_tensor(m, t, p.batch, p.seq, p.dim, output);
  };
  r.x = move(p.x, false);
  r.gate = move(p.gate, false);
  r.y = move(p.y, false);
  r.out = move(p.out, true);
  return r;
}

template <class Mirror>
detail::GateResidualBackwardProblem rebased(const detail::GateResidualBackwardProblem& p,
                                            Mirror& m) {
  detail::GateResidualBackwardProblem r = p;
  const auto move = [&](auto t, bool output) {
    return rebased_adaln_tensor(m, t, p.batch, p.seq, p.dim, output);
  };
  r.gate = move(p.gate, false);
  r.y = move(p.y, false);
  r.dout = move(p.dout, false);
  r.dy = move(p.dy, true);
  r.dgate = move(p.dgate, true);
  return r;
}

template <class Mirror>
detail::ActivationProblem rebased(const detail::ActivationProblem& p, Mirror& m) {
  detail::ActivationProblem r = p;
  r.x = m.map(p.x, false);
  r.y = m.map(p.y, true);
  return r;
}

template <class Mirror>
detail::ActivationBackwardProblem rebased(const detail::ActivationBackwardProblem& p, Mirror& m) {
  detail::ActivationBackwardProblem r = p;
  r.x = m.map(p.x, false);
  r.dy = m.map(p.dy, false);
  r.dx = m.map(p.dx, true);
  return r;
}

template <class Mirror>
detail::LatentNormalizeProblem rebased(const detail::LatentNormalizeProblem& p, Mirror& m) {
  detail::LatentNormalizeProblem r = p;
  r.in = m.map(p.in, false);
  if (p.mean.data != nullptr) r.mean = m.map(p.mean, false);
  r.std = m.map(p.std, false);
  r.out = m.map(p.out, true);
  return r;
}

template <class Mirror>
detail::LatentPackProblem rebased(const detail::LatentPackProblem& p, Mirror& m) {
  return {m.map(p.latents, false), m.map(p.tokens, true)};
}

template <class Mirror>
detail::LatentUnpackProblem rebased(const detail::LatentUnpackProblem& p, Mirror& m) {
  return {m.map(p.tokens, false), m.map(p.latents, true)};
}

template <class Mirror>
TensorView rebased_output(const TensorView& t, Mirror& m) {
  return t.data != nullptr ? m.map(t, true) : t;
}

template <class Mirror>
detail::FlowSdeStepProblem rebased(const detail::FlowSdeStepProblem& p, Mirror& m) {
  detail::FlowSdeStepProblem r = p;
  r.x = m.map(p.x, false);
  r.v = m.map(p.v, false);
  r.noise = m.map(p.noise, false);
  r.prev = m.map(p.prev, true);
  return r;
}

template <class Mirror>
detail::FlowSdeStepBackwardProblem rebased(const detail::FlowSdeStepBackwardProblem& p, Mirror& m) {
  detail::FlowSdeStepBackwardProblem r = p;
  r.dprev = m.map(p.dprev, false);
  r.dx = rebased_output(p.dx, m);
  r.dv = rebased_output(p.dv, m);
  return r;
}

template <class Mirror>
detail::FlowSdeLogpProblem rebased(const detail::FlowSdeLogpProblem& p, Mirror& m) {
  detail::FlowSdeLogpProblem r = p;
  r.x = m.map(p.x, false);
  r.v = m.map(p.v, false);
  r.prev = m.map(p.prev, false);
  r.logp = m.map(p.logp, true);
  return r;
}

template <class Mirror>
detail::FlowSdeLogpBackwardProblem rebased(const detail::FlowSdeLogpBackwardProblem& p, Mirror& m) {
  detail::FlowSdeLogpBackwardProblem r = p;
  r.x = m.map(p.x, false);
  r.v = m.map(p.v, false);
  r.prev = m.map(p.prev, false);
  r.dlogp = m.map(p.dlogp, false);
  r.dx = rebased_output(p.dx, m);
  r.dv = rebased_output(p.dv, m);
  return r;
}

template <class Mirror>
detail::TrueCfgProblem rebased(const detail::TrueCfgProblem& p, Mirror& m) {
  detail::TrueCfgProblem r = p;
  r.cond = m.map(p.cond, false);
  r.uncond = m.map(p.uncond, false);
  r.v = m.map(p.v, true);
  return r;
}

template <class Mirror>
detail::TrueCfgBackwardProblem rebased(const detail::TrueCfgBackwardProblem& p, Mirror& m) {
  detail::TrueCfgBackwardProblem r = p;
  r.cond = m.map(p.cond, false);
  r.uncond = m.map(p.uncond, false);
  r.dv = m.map(p.dv, false);
  r.dcond = rebased_output(p.dcond, m);
  r.duncond = rebased_output(p.duncond, m);
  return r;
}

}  // namespace kernel_align::cuda
