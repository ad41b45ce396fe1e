#include "reference/attention.hpp"

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

float at(const AttentionInput& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return contract::load_f32(t.dtype, t.data, t.offset(b, s, h, d));
}

void store(const AttentionOutput& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d,
           float v) {
  contract::store_output(t.dtype, t.data, t.offset(b, s, h, d), v);
}

// Row i's probabilities p[j] (unnormalised) and l of sample b, head h.
struct SoftmaxRow {
  std::vector<float> p;
  float l;
};

SoftmaxRow softmax_row(const AttentionInput& q, const AttentionInput& k, std::int64_t b,
                       std::int64_t h, std::int64_t dim, float scale,
                       const std::vector<std::int64_t>& valid, std::int64_t i) {
  const auto n = static_cast<std::int64_t>(valid.size());
  const std::int64_t ti = valid[static_cast<std::size_t>(i)];
  std::vector<float> s(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t tj = valid[static_cast<std::size_t>(j)];
    s[static_cast<std::size_t>(j)] = contract::mul(
        contract::linear_sum(dim,
                             [&](std::int64_t r) {
                               return std::pair{at(q, b, ti, h, r), at(k, b, tj, h, r)};
                             }),
        scale);
  }
  float m = s[0];
  for (std::int64_t j = 1; j < n; ++j)
    m = contract::attention_max(m, s[static_cast<std::size_t>(j)]);
  SoftmaxRow row{std::vector<float>(static_cast<std::size_t>(n)), 0.0f};
  for (std::int64_t j = 0; j < n; ++j) {
    row.p[static_cast<std::size_t>(j)] =
        contract::attention_probability(s[static_cast<std::size_t>(j)], m);
  }
  row.l = contract::linear_sum(n, [&](std::int64_t j) {
    return std::pair{row.p[static_cast<std::size_t>(j)], 1.0f};
  });
  return row;
}

}  // namespace

void attention_forward(const detail::AttentionProblem& p) {
  const float scale = contract::attention_scale(p.dim);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = detail::attention_valid_tokens(p.mask, p.seq, b);
    const auto n = static_cast<std::int64_t>(valid.size());
    detail::attention_zero_padding(p.out, b, p.seq, p.heads, p.dim, valid);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        const SoftmaxRow row = softmax_row(p.q, p.k, b, h, p.dim, scale, valid, i);
        for (std::int64_t d = 0; d < p.dim; ++d) {
          const float u = contract::linear_sum(n, [&](std::int64_t j) {
            return std::pair{row.p[static_cast<std::size_t>(j)],
                             at(p.v, b, valid[static_cast<std::size_t>(j)], h, d)};
          });
          store(p.out, b, valid[static_cast<std::size_t>(i)], h, d, contract::div(u, row.l));
        }
      }
    }
  }
}

void attention_backward(const detail::AttentionBackwardProblem& p) {
  const float scale = contract::attention_scale(p.dim);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::vector<std::int64_t> valid = detail::attention_valid_tokens(p.mask, p.seq, b);
    const auto n = static_cast<std::int64_t>(valid.size());
    const auto t = [&](std::int64_t i) { return valid[static_cast<std::size_t>(i)]; };
    for (const AttentionOutput* g : {&p.dq, &p.dk, &p.dv}) {
      detail::attention_zero_padding(*g, b, p.seq, p.heads, p.dim, valid);
    }
    for (std::int64_t h = 0; h < p.heads; ++h) {
      // P[i][j] and dS[i][j] of the head, row-major n x n.
      std::vector<float> probs(static_cast<std::size_t>(n * n)),
          ds(static_cast<std::size_t>(n * n));
      for (std::int64_t i = 0; i < n; ++i) {
        const SoftmaxRow row = softmax_row(p.q, p.k, b, h, p.dim, scale, valid, i);
        const float delta = contract::linear_sum(p.dim, [&](std::int64_t r) {
          return std::pair{at(p.dout, b, t(i), h, r), at(p.out, b, t(i), h, r)};
        });
        for (std::int64_t j = 0; j < n; ++j) {
          const float prob = contract::div(row.p[static_cast<std::size_t>(j)], row.l);
          const float dp = contract::linear_sum(p.dim, [&](std::int64_t r) {
            return std::pair{at(p.dout, b, t(i), h, r), at(p.v, b, t(j), h, r)};
          });
          probs[static_cast<std::size_t>(i * n + j)] = prob;
          ds[static_cast<std::size_t>(i * n + j)] = contract::mul(prob, contract::sub(dp, delta));
        }
      }
      for (std::int64_t x = 0; x < n; ++x) {
        for (std::int64_t d = 0; d < p.dim; ++d) {
          // dv[t_x] and dk[t_x]: sums over the queries i; dq[t_x]: over the keys j.
          const float dv = contract::linear_sum(n, [&](std::int64_t i) {
            return std::pair{probs[static_cast<std::size_t>(i * n + x)], at(p.dout, b, t(i), h, d)};
          });
          const float dk = contract::linear_sum(n, [&](std::int64_t i) {
            return std::pair{ds[static_cast<std::size_t>(i * n + x)], at(p.q, b, t(i), h, d)};
          });
          const float dq = contract::linear_sum(n, [&](std::int64_t j) {
            return std::pair{ds[static_cast<std::size_t>(x * n + j)], at(p.k, b, t(j), h, d)};
          });
          store(p.dv, b, t(x), h, d, dv);
          store(p.dk, b, t(x), h, d, contract::mul(dk, scale));
          store(p.dq, b, t(x), h, d, contract::mul(dq, scale));
        }
      }
    }
  }
}

}  // namespace kernel_align::reference
