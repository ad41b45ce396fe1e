#include "cpu/attention.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "api/gemm_problem.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/gemm/workspace.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/attention.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cpu {
namespace {

using detail::AttentionInput;
using detail::AttentionOutput;
using detail::GemmMatrix;
using detail::GemmProblem;

constexpr float kOne = 1.0f;

// C (fp32, row-major m x n, row stride ldc) = A B by the engine; no bias, no activation.
void product(std::int64_t m, std::int64_t n, std::int64_t r, GemmMatrix a, GemmMatrix b, float* c,
             std::int64_t ldc, int threads, Isa isa) {
  gemm(GemmProblem{m, n, r, a, b, std::nullopt, contract::Activation::None, std::nullopt, c,
                   DType::F32, ldc, 1},
       threads, isa);
}

// A row-major fp32 n x D matrix.
GemmMatrix rows(const float* data, std::int64_t dim) {
  return {data, DType::F32, dim, 1};
}
// Its transpose: element (d, i) of the D x n matrix.
GemmMatrix transposed(const float* data, std::int64_t dim) {
  return {data, DType::F32, 1, dim};
}

// dst[i * dim + d] = t at (b, valid[i], h, d), widened.
void gather(const AttentionInput& t, std::int64_t b, std::int64_t h, std::int64_t dim,
            const std::vector<std::int64_t>& valid, float* dst, int threads) {
  ThreadPool::instance().run(threads, static_cast<std::int64_t>(valid.size()), [&](std::int64_t i) {
    const std::int64_t s = valid[static_cast<std::size_t>(i)];
    const std::int64_t first = t.offset(b, s, h, 0);
    if (t.dtype == DType::F32 && t.strides[3] == 1) {
      const float* src = static_cast<const float*>(t.data) + first;
      std::copy(src, src + dim, dst + i * dim);
      return;
    }
    for (std::int64_t d = 0; d < dim; ++d) {
      dst[i * dim + d] = contract::load_f32(t.dtype, t.data, first + d * t.strides[3]);
    }
  });
}

// t at (b, valid[i], h, d) = store_output(value(i, d)).
template <class Value>
void scatter(const AttentionOutput& t, std::int64_t b, std::int64_t h, std::int64_t dim,
             const std::vector<std::int64_t>& valid, int threads, const Value& value) {
  ThreadPool::instance().run(threads, static_cast<std::int64_t>(valid.size()), [&](std::int64_t i) {
    const std::int64_t s = valid[static_cast<std::size_t>(i)];
    for (std::int64_t d = 0; d < dim; ++d) {
      contract::store_output(t.dtype, t.data, t.offset(b, s, h, d), value(i, d));
    }
  });
}

// The head's probabilities: scores = Q K^T (n x n, in `scores`) turned row by row into
// p = exp_f32(sub(mul(S, c), m)), and l = the tree of p over each row (in `sums`).
void probabilities(const float* q, const float* k, std::int64_t n, std::int64_t dim, float scale,
                   float* scores, float* sums, int threads, Isa isa) {
  product(n, n, dim, rows(q, dim), transposed(k, dim), scores, n, threads, isa);
  ThreadPool::instance().run(threads, n, [&](std::int64_t i) {
    gemm_attention_probabilities(isa, scores + i * n, n, scale);
  });
  // l as the 1 x n product 1 P^T: each fma with 1 is the add of the contract's sum.
  product(1, n, n, GemmMatrix{&kOne, DType::F32, 0, 0}, transposed(scores, n), sums, n, threads,
          isa);
}

// The valid tokens of sample b, after +0 is written at every other position of `outputs`.
template <class Problem>
std::vector<std::int64_t> valid_tokens(const Problem& p, std::int64_t b,
                                       std::initializer_list<const AttentionOutput*> outputs) {
  std::vector<std::int64_t> valid = detail::attention_valid_tokens(p.mask, p.seq, b);
  for (const AttentionOutput* out : outputs) {
    detail::attention_zero_padding(*out, b, p.seq, p.heads, p.dim, valid);
  }
  return valid;
}

}  // namespace

void attention_forward(const detail::AttentionProblem& p, int threads, Isa isa) {
  const float scale = contract::attention_scale(p.dim);
  const std::int64_t dim = p.dim;
  thread_local Workspace q_space, k_space, v_space, score_space, sum_space, u_space;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = valid_tokens(p, b, {&p.out});
    const auto n = static_cast<std::int64_t>(valid.size());
    if (n == 0) continue;
    float* const q = q_space.get(n * dim);
    float* const k = k_space.get(n * dim);
    float* const v = v_space.get(n * dim);
    float* const scores = score_space.get(n * n);
    float* const sums = sum_space.get(n);
    float* const u = u_space.get(n * dim);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      gather(p.q, b, h, dim, valid, q, threads);
      gather(p.k, b, h, dim, valid, k, threads);
      gather(p.v, b, h, dim, valid, v, threads);
      probabilities(q, k, n, dim, scale, scores, sums, threads, isa);
      product(n, dim, n, rows(scores, n), rows(v, dim), u, dim, threads, isa);
      scatter(p.out, b, h, dim, valid, threads, [&](std::int64_t i, std::int64_t d) {
        return contract::div(u[i * dim + d], sums[i]);
      });
    }
  }
}

void attention_backward(const detail::AttentionBackwardProblem& p, int threads, Isa isa) {
  const float scale = contract::attention_scale(p.dim);
  const std::int64_t dim = p.dim;
  thread_local Workspace q_space, k_space, v_space, o_space, do_space, score_space, sum_space,
      dp_space, grad_space;
  ThreadPool& pool = ThreadPool::instance();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = valid_tokens(p, b, {&p.dq, &p.dk, &p.dv});
    const auto n = static_cast<std::int64_t>(valid.size());
    if (n == 0) continue;
    float* const q = q_space.get(n * dim);
    float* const k = k_space.get(n * dim);
    float* const v = v_space.get(n * dim);
    float* const o = o_space.get(n * dim);
    float* const dout = do_space.get(n * dim);
    float* const probs = score_space.get(n * n);
    float* const sums = sum_space.get(n);
    float* const ds = dp_space.get(n * n);
    float* const grad = grad_space.get(n * dim);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      gather(p.q, b, h, dim, valid, q, threads);
      gather(p.k, b, h, dim, valid, k, threads);
      gather(p.v, b, h, dim, valid, v, threads);
      gather(p.out, b, h, dim, valid, o, threads);
      gather(p.dout, b, h, dim, valid, dout, threads);
      probabilities(q, k, n, dim, scale, probs, sums, threads, isa);
      // dP = dO V^T into ds, then P = p / l and dS = P (dP - delta) row by row.
      product(n, n, dim, rows(dout, dim), transposed(v, dim), ds, n, threads, isa);
      pool.run(threads, n, [&](std::int64_t i) {
        const float delta = contract::linear_sum(dim, [&](std::int64_t r) {
          return std::pair{dout[i * dim + r], o[i * dim + r]};
        });
        float* const prob_row = probs + i * n;
        float* const ds_row = ds + i * n;
        for (std::int64_t j = 0; j < n; ++j) {
          prob_row[j] = contract::div(prob_row[j], sums[i]);
          ds_row[j] = contract::mul(prob_row[j], contract::sub(ds_row[j], delta));
        }
      });
      // dV = P^T dO, dQ = dS K c, dK = dS^T Q c.
      product(n, dim, n, transposed(probs, n), rows(dout, dim), grad, dim, threads, isa);
      scatter(p.dv, b, h, dim, valid, threads,
              [&](std::int64_t i, std::int64_t d) { return grad[i * dim + d]; });
      product(n, dim, n, rows(ds, n), rows(k, dim), grad, dim, threads, isa);
      scatter(p.dq, b, h, dim, valid, threads, [&](std::int64_t i, std::int64_t d) {
        return contract::mul(grad[i * dim + d], scale);
      });
      product(n, dim, n, transposed(ds, n), rows(q, dim), grad, dim, threads, isa);
      scatter(p.dk, b, h, dim, valid, threads, [&](std::int64_t i, std::int64_t d) {
        return contract::mul(grad[i * dim + d], scale);
      });
    }
  }
}

}  // namespace kernel_align::cpu
