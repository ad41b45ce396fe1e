// The CUDA kernel bodies of joint attention (docs/contract.md section 11), written as
// kernels.cuh's (a struct with Params, Shared and `run(params, shared)`, a template on the
// Grid), over the contract headers' arithmetic: every sum is contract::linear_sum (leaves of
// 32 explicit fma, the linear tree over them) in the reference's index order, so a thread
// computes its value exactly as reference/attention.cpp does.
//
// A generic path, one head of one sample at a time (plan: cuda/attention_plan.hpp):
// - valid tokens: a thread per sample lists its valid positions t_0 < t_1 < ... in order;
// - padding: a thread per element stores +0 at the masked positions of an output;
// - softmax rows: a thread per query row computes its scores into the head's n x n scratch,
//   their maximum, the unnormalised probabilities in place and l = P 1;
// - the forward's output: a thread per (query, column) sums P V and divides by l;
// - the backward's rows: a thread per query row turns its probabilities into P / l and
//   writes dS = P (dP - delta), delta = dout . out;
// - the backward's columns: a thread per (token, column) sums dv and dk over the queries
//   and dq over the keys.
// The scratch holds n^2 floats per matrix (the head's), which bounds the sequence length
// this path serves by the device's memory.
#pragma once

#include <cstdint>

#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/attention.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cuda {

// A [B, S, H, D] tensor by element strides (either layout: the plan maps bhsd's).
struct HeadTensor {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t stride[4] = {0, 0, 0, 1};
  KA_HD std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }
  KA_HD float load(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return contract::load_f32(dtype, data, offset(b, s, h, d));
  }
};

struct OutHeadTensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t stride[4] = {0, 0, 0, 1};
  KA_HD void store(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, float v) const {
    contract::store_output(dtype, data,
                           b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3], v);
  }
};

// Token (b, s) takes part when data[b * batch_stride + s * seq_stride] != 0; every token
// does when data is null.
struct KeyMask {
  const std::uint8_t* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t seq_stride = 0;
  KA_HD bool valid(std::int64_t b, std::int64_t s) const {
    return data == nullptr || data[b * batch_stride + s * seq_stride] != 0;
  }
};

struct AttentionExtents {
  std::int64_t batch = 0, seq = 0, heads = 0, dim = 0;
};

// ---- the valid tokens and the padding --------------------------------------------------

struct ValidTokensParams {
  AttentionExtents extents;
  KeyMask mask;
  std::int64_t* tokens = nullptr;  // [B][S]: sample b's valid positions first, in order
  std::int64_t* counts = nullptr;  // [B]
};

template <class Grid>
struct AttentionValidTokens {
  using Params = ValidTokensParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t b = global_thread<Grid>();
    if (b >= p.extents.batch) return;
    std::int64_t n = 0;
    for (std::int64_t s = 0; s < p.extents.seq; ++s) {
      if (p.mask.valid(b, s)) p.tokens[b * p.extents.seq + n++] = s;
    }
    p.counts[b] = n;
  }
};

struct ZeroPaddingParams {
  AttentionExtents extents;
  KeyMask mask;
  OutHeadTensor out[3];
  int outputs = 1;
};

// +0 at every element of a masked position, in each output.
template <class Grid>
struct AttentionZeroPadding {
  using Params = ZeroPaddingParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const AttentionExtents& e = p.extents;
    const std::int64_t i = global_thread<Grid>();
    if (i >= e.batch * e.seq * e.heads * e.dim) return;
    const std::int64_t d = i % e.dim;
    const std::int64_t h = (i / e.dim) % e.heads;
    const std::int64_t s = (i / (e.dim * e.heads)) % e.seq;
    const std::int64_t b = i / (e.dim * e.heads * e.seq);
    if (p.mask.valid(b, s)) return;
    for (int o = 0; o < p.outputs; ++o) p.out[o].store(b, s, h, d, 0.0f);
  }
};

// ---- one head of one sample -------------------------------------------------------------

// The head (b, h) of a launch, its n valid tokens and the n x n scratch matrices.
struct HeadParams {
  AttentionExtents extents;
  std::int64_t b = 0, h = 0, n = 0;
  const std::int64_t* tokens = nullptr;  // the sample's valid positions (tokens + b S)
  float scale = 0.0f;
  HeadTensor q, k, v, out, dout;     // out and dout: the backward's
  OutHeadTensor result, dq, dk, dv;  // result: the forward's out
  float* probabilities = nullptr;    // [n][n]
  float* row_sums = nullptr;         // [n]: l
  float* score_grads = nullptr;      // [n][n]: the backward's dS

  KA_HD std::int64_t token(std::int64_t i) const { return tokens[i]; }
  // The dot over d of a row of x at token i and a row of y at token j: the linear tree.
  KA_HD float dot(const HeadTensor& x, std::int64_t i, const HeadTensor& y, std::int64_t j) const {
    return contract::linear_sum(extents.dim, [&](std::int64_t d) {
      return Pair{x.load(b, token(i), h, d), y.load(b, token(j), h, d)};
    });
  }
  struct Pair {
    float first, second;
  };
};

// Row i's scores s_j = dot(q_i, k_j) * scale, their maximum m, p_j = exp(s_j - m) in place
// and l = the linear tree of p_j * 1 (reference::softmax_row).
template <class Grid>
struct AttentionSoftmaxRows {
  using Params = HeadParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t i = global_thread<Grid>();
    if (i >= p.n) return;
    float* row = p.probabilities + i * p.n;
    for (std::int64_t j = 0; j < p.n; ++j) row[j] = contract::mul(p.dot(p.q, i, p.k, j), p.scale);
    float m = row[0];
    for (std::int64_t j = 1; j < p.n; ++j) m = contract::attention_max(m, row[j]);
    for (std::int64_t j = 0; j < p.n; ++j) row[j] = contract::attention_probability(row[j], m);
    p.row_sums[i] = contract::linear_sum(p.n, [&](std::int64_t j) {
      return HeadParams::Pair{row[j], 1.0f};
    });
  }
};

// out[t_i][d] = (the linear tree of p_ij v[t_j][d] over j) / l_i.
template <class Grid>
struct AttentionOutputColumns {
  using Params = HeadParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.n * p.extents.dim) return;
    const std::int64_t i = e / p.extents.dim;
    const std::int64_t d = e % p.extents.dim;
    const float* row = p.probabilities + i * p.n;
    const float u = contract::linear_sum(p.n, [&](std::int64_t j) {
      return HeadParams::Pair{row[j], p.v.load(p.b, p.token(j), p.h, d)};
    });
    p.result.store(p.b, p.token(i), p.h, d, contract::div(u, p.row_sums[i]));
  }
};

// Row i: P_ij = p_ij / l_i in place, and dS_ij = P_ij (dP_ij - delta_i), dP_ij =
// dot(dout_i, v_j), delta_i = dot(dout_i, out_i).
template <class Grid>
struct AttentionBackwardRows {
  using Params = HeadParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t i = global_thread<Grid>();
    if (i >= p.n) return;
    float* row = p.probabilities + i * p.n;
    float* grads = p.score_grads + i * p.n;
    const float delta = p.dot(p.dout, i, p.out, i);
    const float l = p.row_sums[i];
    for (std::int64_t j = 0; j < p.n; ++j) {
      const float probability = contract::div(row[j], l);
      row[j] = probability;
      grads[j] = contract::mul(probability, contract::sub(p.dot(p.dout, i, p.v, j), delta));
    }
  }
};

// Token x, column d: dv = sum_i P_ix dout[t_i][d], dk = scale * sum_i dS_ix q[t_i][d], dq =
// scale * sum_j dS_xj k[t_j][d], each the linear tree in index order.
template <class Grid>
struct AttentionBackwardColumns {
  using Params = HeadParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.n * p.extents.dim) return;
    const std::int64_t x = e / p.extents.dim;
    const std::int64_t d = e % p.extents.dim;
    const std::int64_t n = p.n;
    const float dv = contract::linear_sum(n, [&](std::int64_t i) {
      return HeadParams::Pair{p.probabilities[i * n + x], p.dout.load(p.b, p.token(i), p.h, d)};
    });
    const float dk = contract::linear_sum(n, [&](std::int64_t i) {
      return HeadParams::Pair{p.score_grads[i * n + x], p.q.load(p.b, p.token(i), p.h, d)};
    });
    const float dq = contract::linear_sum(n, [&](std::int64_t j) {
      return HeadParams::Pair{p.score_grads[x * n + j], p.k.load(p.b, p.token(j), p.h, d)};
    });
    const std::int64_t t = p.token(x);
    p.dv.store(p.b, t, p.h, d, dv);
    p.dk.store(p.b, t, p.h, d, contract::mul(dk, p.scale));
    p.dq.store(p.b, t, p.h, d, contract::mul(dq, p.scale));
  }
};

}  // namespace kernel_align::cuda
