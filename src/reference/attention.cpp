#include "reference/attention.hpp"
#include "reference/kernels.hpp"

#include <cstddef>
#include <utility>
#include <vector>

#include "kernel_align/contract/attention.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::reference {
namespace {

using detail::AttentionInput;
using detail::AttentionOutput;

// The head's rows of sample b's valid tokens widened to fp32 (exact, so the sums below see
// the tensor's values): element (i, r) at rows[i * dim + r], or at rows[r * n + i] when
// `transposed` (a column of the head then lies contiguous, as the sums over tokens read it).
std::vector<float> head_rows(const AttentionInput& t, std::int64_t b, std::int64_t h,
                             std::int64_t dim, const std::vector<std::int64_t>& valid,
                             bool transposed = false) {
  const auto n = static_cast<std::int64_t>(valid.size());
  std::vector<float> rows(static_cast<std::size_t>(n * dim));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t r = 0; r < dim; ++r) {
      rows[static_cast<std::size_t>(transposed ? r * n + i : i * dim + r)] = contract::load_f32(
          t.dtype, t.data, t.offset(b, valid[static_cast<std::size_t>(i)], h, r));
    }
  }
  return rows;
}

void store(const AttentionOutput& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d,
           float v) {
  contract::store_output(t.dtype, t.data, t.offset(b, s, h, d), v);
}

// The linear tree of x[j * x_step] * y[j * y_step] over j < r.
float dot(std::int64_t r, const float* x, std::int64_t x_step, const float* y,
          std::int64_t y_step) {
  return contract::linear_sum(r, [&](std::int64_t j) {
    return std::pair{x[j * x_step], y[j * y_step]};
  });
}

// Row i's probabilities p[j] (unnormalised) and l, from the head's gathered q and k rows.
struct SoftmaxRow {
  std::vector<float> p;
  float l;
};

SoftmaxRow softmax_row(const std::vector<float>& q, const std::vector<float>& k, std::int64_t n,
                       std::int64_t dim, float scale, std::int64_t i) {
  std::vector<float> s(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    s[static_cast<std::size_t>(j)] =
        contract::mul(dot(dim, q.data() + i * dim, 1, k.data() + j * dim, 1), scale);
  }
  float m = s[0];
  for (std::int64_t j = 1; j < n; ++j)
    m = contract::attention_max(m, s[static_cast<std::size_t>(j)]);
  SoftmaxRow row{std::vector<float>(static_cast<std::size_t>(n)), 0.0f};
  for (std::int64_t j = 0; j < n; ++j) {
    row.p[static_cast<std::size_t>(j)] =
        contract::attention_probability(s[static_cast<std::size_t>(j)], m);
  }
  const float one = 1.0f;
  row.l = dot(n, row.p.data(), 1, &one, 0);
  return row;
}

}  // namespace

void attention_forward(const detail::AttentionProblem& p) {
  const float scale = contract::attention_scale(p.dim);
  const std::int64_t dim = p.dim;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = detail::attention_valid_tokens(p.mask, p.seq, b);
    const auto n = static_cast<std::int64_t>(valid.size());
    detail::attention_zero_padding(p.out, b, p.seq, p.heads, dim, valid);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::vector<float> q = head_rows(p.q, b, h, dim, valid);
      const std::vector<float> k = head_rows(p.k, b, h, dim, valid);
      const std::vector<float> v_columns = head_rows(p.v, b, h, dim, valid, true);
      for (std::int64_t i = 0; i < n; ++i) {
        const SoftmaxRow row = softmax_row(q, k, n, dim, scale, i);
        for (std::int64_t d = 0; d < dim; ++d) {
          const float u = dot(n, row.p.data(), 1, v_columns.data() + d * n, 1);
          store(p.out, b, valid[static_cast<std::size_t>(i)], h, d, contract::div(u, row.l));
        }
      }
    }
  }
}

void attention_backward(const detail::AttentionBackwardProblem& p) {
  const float scale = contract::attention_scale(p.dim);
  const std::int64_t dim = p.dim;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = detail::attention_valid_tokens(p.mask, p.seq, b);
    const auto n = static_cast<std::int64_t>(valid.size());
    const auto t = [&](std::int64_t i) { return valid[static_cast<std::size_t>(i)]; };
    for (const AttentionOutput* g : {&p.dq, &p.dk, &p.dv}) {
      detail::attention_zero_padding(*g, b, p.seq, p.heads, dim, valid);
    }
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::vector<float> q = head_rows(p.q, b, h, dim, valid);
      const std::vector<float> k = head_rows(p.k, b, h, dim, valid);
      const std::vector<float> v = head_rows(p.v, b, h, dim, valid);
      const std::vector<float> out = head_rows(p.out, b, h, dim, valid);
      const std::vector<float> dout = head_rows(p.dout, b, h, dim, valid);
      // P[i][j] and dS[i][j] of the head, row-major n x n.
      std::vector<float> probs(static_cast<std::size_t>(n * n)),
          ds(static_cast<std::size_t>(n * n));
      for (std::int64_t i = 0; i < n; ++i) {
        const SoftmaxRow row = softmax_row(q, k, n, dim, scale, i);
        const float delta = dot(dim, dout.data() + i * dim, 1, out.data() + i * dim, 1);
        for (std::int64_t j = 0; j < n; ++j) {
          const float prob = contract::div(row.p[static_cast<std::size_t>(j)], row.l);
          const float dp = dot(dim, dout.data() + i * dim, 1, v.data() + j * dim, 1);
          probs[static_cast<std::size_t>(i * n + j)] = prob;
          ds[static_cast<std::size_t>(i * n + j)] = contract::mul(prob, contract::sub(dp, delta));
        }
      }
      for (std::int64_t x = 0; x < n; ++x) {
        for (std::int64_t d = 0; d < dim; ++d) {
          // dv[t_x] and dk[t_x]: sums over the queries i; dq[t_x]: over the keys j.
          const float dv = dot(n, probs.data() + x, n, dout.data() + d, dim);
          const float dk = dot(n, ds.data() + x, n, q.data() + d, dim);
          const float dq = dot(n, ds.data() + x * n, 1, k.data() + d, dim);
          store(p.dv, b, t(x), h, d, dv);
          store(p.dk, b, t(x), h, d, contract::mul(dk, scale));
          store(p.dq, b, t(x), h, d, contract::mul(dq, scale));
        }
      }
    }
  }
}

void add_attention_kernels(registry::Kernels& k) {
  k.set<OpType::Attention, Direction::Forward>(
      [](const detail::AttentionProblem& p, registry::Execution& exec) {
        record_scalar(exec, {});
        attention_forward(p);
      });
  k.set<OpType::Attention, Direction::Backward>(
      [](const detail::AttentionBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {});
        attention_backward(p);
      });
}

}  // namespace kernel_align::reference
