// Joint attention's launches (device/attention_kernels.cuh) from its validated problems,
// for plan.hpp's Executors: the valid tokens of every sample (their counts read back, as
// they size the launches), the padding's zeros, then per (sample, head) the softmax rows
// and the output's (or the gradients') columns over one n x n scratch that the heads reuse
// in stream order. Every choice is a function of the problem and the mask; none changes a
// result bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "api/attention_problem.hpp"
#include "cuda/device/attention_kernels.cuh"
#include "cuda/modulation_plan.hpp"  // item_launch
#include "kernel_align/contract/attention.hpp"

namespace kernel_align::cuda::plan {

inline HeadTensor head_tensor(const detail::AttentionInput& t) {
  return {t.data, t.dtype, {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}};
}

inline OutHeadTensor head_tensor(const detail::AttentionOutput& t) {
  return {t.data, t.dtype, {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}};
}

// The valid tokens of every sample on the device, and their counts on the host.
struct ValidTokens {
  const std::int64_t* tokens = nullptr;
  std::vector<std::int64_t> counts;
};

template <class Executor>
ValidTokens valid_tokens(const AttentionExtents& e, const KeyMask& mask, Executor& exec) {
  ValidTokensParams v;
  v.extents = e;
  v.mask = mask;
  v.tokens = exec.scratch_indices(static_cast<std::size_t>(e.batch * e.seq));
  v.counts = exec.scratch_indices(static_cast<std::size_t>(e.batch));
  exec.template launch<AttentionValidTokens>(item_launch("attention_valid_tokens", e.batch), v);
  ValidTokens out{v.tokens, std::vector<std::int64_t>(static_cast<std::size_t>(e.batch))};
  exec.copy_to_host(out.counts.data(), v.counts, out.counts.size() * sizeof(std::int64_t));
  return out;
}

template <class Executor>
void zero_padding(const AttentionExtents& e, const KeyMask& mask,
                  std::initializer_list<detail::AttentionOutput> outputs, Executor& exec) {
  if (mask.data == nullptr) return;  // no padding
  ZeroPaddingParams z;
  z.extents = e;
  z.mask = mask;
  int count = 0;
  for (const detail::AttentionOutput& o : outputs) z.out[count++] = head_tensor(o);
  z.outputs = count;
  exec.template launch<AttentionZeroPadding>(
      item_launch("attention_zero_padding", e.batch * e.seq * e.heads * e.dim), z);
}

// The fields every head's launches share, and the scratch for the largest head.
template <class Executor>
HeadParams head_params(const AttentionExtents& e, const ValidTokens& valid, bool backward,
                       Executor& exec) {
  HeadParams h;
  h.extents = e;
  h.scale = contract::attention_scale(e.dim);
  const std::int64_t n = *std::max_element(valid.counts.begin(), valid.counts.end());
  const auto square = static_cast<std::size_t>(std::max<std::int64_t>(n * n, 1));
  h.probabilities = exec.scratch_floats(square);
  h.row_sums = exec.scratch_floats(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
  if (backward) h.score_grads = exec.scratch_floats(square);
  return h;
}

// Calls head(params) for every (sample, head) with a valid token, params naming it.
template <class Head>
void for_each_head(HeadParams h, const ValidTokens& valid, const Head& head) {
  for (std::int64_t b = 0; b < h.extents.batch; ++b) {
    h.b = b;
    h.n = valid.counts[static_cast<std::size_t>(b)];
    h.tokens = valid.tokens + b * h.extents.seq;
    if (h.n == 0) continue;
    for (std::int64_t head_index = 0; head_index < h.extents.heads; ++head_index) {
      h.h = head_index;
      head(h);
    }
  }
}

inline KeyMask key_mask(const detail::AttentionMask& m) {
  return {m.data, m.batch_stride, m.seq_stride};
}

template <class Executor>
void attention_forward(const detail::AttentionProblem& p, Executor& exec) {
  const AttentionExtents e{p.batch, p.seq, p.heads, p.dim};
  const KeyMask mask = key_mask(p.mask);
  zero_padding(e, mask, {p.out}, exec);
  const ValidTokens valid = valid_tokens(e, mask, exec);
  HeadParams h = head_params(e, valid, false, exec);
  h.q = head_tensor(p.q);
  h.k = head_tensor(p.k);
  h.v = head_tensor(p.v);
  h.result = head_tensor(p.out);
  for_each_head(h, valid, [&](const HeadParams& head) {
    exec.template launch<AttentionSoftmaxRows>(item_launch("attention_softmax_rows", head.n), head);
    exec.template launch<AttentionOutputColumns>(
        item_launch("attention_output_columns", head.n * e.dim), head);
  });
}

template <class Executor>
void attention_backward(const detail::AttentionBackwardProblem& p, Executor& exec) {
  const AttentionExtents e{p.batch, p.seq, p.heads, p.dim};
  const KeyMask mask = key_mask(p.mask);
  zero_padding(e, mask, {p.dq, p.dk, p.dv}, exec);
  const ValidTokens valid = valid_tokens(e, mask, exec);
  HeadParams h = head_params(e, valid, true, exec);
  h.q = head_tensor(p.q);
  h.k = head_tensor(p.k);
  h.v = head_tensor(p.v);
  h.out = head_tensor(p.out);
  h.dout = head_tensor(p.dout);
  h.dq = head_tensor(p.dq);
  h.dk = head_tensor(p.dk);
  h.dv = head_tensor(p.dv);
  for_each_head(h, valid, [&](const HeadParams& head) {
    exec.template launch<AttentionSoftmaxRows>(item_launch("attention_softmax_rows", head.n), head);
    exec.template launch<AttentionBackwardRows>(item_launch("attention_backward_rows", head.n),
                                                head);
    exec.template launch<AttentionBackwardColumns>(
        item_launch("attention_backward_columns", head.n * e.dim), head);
  });
}

}  // namespace kernel_align::cuda::plan
