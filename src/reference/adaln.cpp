#include "reference/adaln.hpp"
#include "reference/kernels.hpp"
#include "reference/strided_rows.hpp"

#include "kernel_align/contract/adaln.hpp"
#include "kernel_align/contract/convert.hpp"

namespace kernel_align::reference {
namespace {

// A row's working arrays of D floats each, kept per thread.
struct RowScratch {
  std::vector<float> x, a, b, m, shift;
  explicit RowScratch(int d) {
    for (std::vector<float>* v : {&x, &a, &b, &m, &shift}) v->resize(static_cast<std::size_t>(d));
  }
};

RowScratch& scratch(int d) {
  thread_local RowScratch rows(0);
  if (rows.x.size() != static_cast<std::size_t>(d)) rows = RowScratch(d);
  return rows;
}

// Sample b's factors 1 + scale (m) into m[0..D).
template <class Problem>
void load_factors(const Problem& p, std::int64_t b, float* m) {
  load_row(p.scale, b, 0, p.dim, m);
  for (int i = 0; i < p.dim; ++i) m[i] = contract::adaln_factor(m[i], p.mode, p.scale.dtype);
}

void adaln_forward_rows(const detail::AdaLnProblem& p, std::int64_t begin, std::int64_t end) {
  RowScratch& w = scratch(p.dim);
  std::int64_t sample = -1;  // whose modulation m and shift hold
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    if (b != sample) {
      load_factors(p, b, w.m.data());
      load_row(p.shift, b, 0, p.dim, w.shift.data());
      sample = b;
    }
    load_row(p.x, b, s, p.dim, w.x.data());
    const contract::LayerNormRow row =
        contract::layernorm_row(w.x.data(), p.dim, p.eps, w.a.data());
    for (int i = 0; i < p.dim; ++i) {
      const float n = contract::adaln_modulated_norm(contract::layernorm_normalized(w.x[i], row),
                                                     p.mode, p.x.dtype);
      w.a[i] = contract::adaln_forward(n, w.m[i], w.shift[i], p.mode, p.y.dtype);
    }
    store_row(p.y, b, s, p.dim, w.a.data());
  }
}

void adaln_token_block_sum(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                           std::int64_t begin, std::int64_t end, float* const* parts) {
  RowScratch& w = scratch(p.dim);
  const bool scale = p.dscale.data != nullptr;
  float* const dscale_part = scale ? parts[0] : nullptr;
  float* const dshift_part = p.dshift.data != nullptr ? parts[scale ? 1 : 0] : nullptr;
  for (std::int64_t s = begin; s < end; ++s) {
    load_row(p.dy, b, s, p.dim, w.b.data());
    if (dscale_part != nullptr) {
      load_row(p.x, b, s, p.dim, w.x.data());
      const contract::LayerNormRow row =
          contract::layernorm_row(w.x.data(), p.dim, p.eps, w.a.data());
      for (int i = 0; i < p.dim; ++i) {
        const float n = contract::adaln_modulated_norm(contract::layernorm_normalized(w.x[i], row),
                                                       p.mode, p.x.dtype);
        dscale_part[i] = contract::add(dscale_part[i], contract::mul(w.b[i], n));
      }
    }
    if (dshift_part != nullptr) {
      for (int i = 0; i < p.dim; ++i) dshift_part[i] = contract::add(dshift_part[i], w.b[i]);
    }
  }
}

void adaln_backward_rows(const detail::AdaLnBackwardProblem& p, std::int64_t begin,
                         std::int64_t end) {
  RowScratch& w = scratch(p.dim);
  std::int64_t sample = -1;  // whose factors m holds
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    if (b != sample) {
      load_factors(p, b, w.m.data());
      sample = b;
    }
    load_row(p.x, b, s, p.dim, w.x.data());
    const contract::LayerNormRow row =
        contract::layernorm_row(w.x.data(), p.dim, p.eps, w.a.data());
    // b: g = dy * m; a: g * n.
    load_row(p.dy, b, s, p.dim, w.b.data());
    for (int i = 0; i < p.dim; ++i) {
      w.b[i] = contract::mul(w.b[i], w.m[i]);
      w.x[i] = contract::layernorm_normalized(w.x[i], row);  // n, in place of x
      w.a[i] = contract::mul(w.b[i], w.x[i]);
    }
    const contract::AdaLnBackwardRow constants =
        contract::adaln_backward_constants(row, contract::tree_sum_array(w.b.data(), p.dim),
                                           contract::tree_sum_array(w.a.data(), p.dim), p.dim);
    for (int i = 0; i < p.dim; ++i) w.a[i] = contract::adaln_backward_dx(w.b[i], w.x[i], constants);
    store_row(p.dx, b, s, p.dim, w.a.data());
  }
}

}  // namespace

TokenSums adaln_token_sums_of(const detail::AdaLnBackwardProblem& p) {
  const int outputs = (p.dscale.data != nullptr ? 1 : 0) + (p.dshift.data != nullptr ? 1 : 0);
  return {p.batch, p.seq, p.dim, outputs};
}

void adaln_store_token_sum(const detail::AdaLnBackwardProblem& p, std::int64_t b, int output, int i,
                           float total) {
  const detail::AdaLnOutput& out = output == 0 && p.dscale.data != nullptr ? p.dscale : p.dshift;
  contract::store_output(out.dtype, out.data, out.offset(b, 0, i), total);
}

void adaln_forward(const detail::AdaLnProblem& p) {
  adaln_forward_rows(p, 0, p.batch * p.seq);
}

void adaln_backward(const detail::AdaLnBackwardProblem& p) {
  const TokenSums sums = adaln_token_sums_of(p);
  if (sums.outputs > 0) {
    std::vector<float> scratch;
    sum_over_tokens(
        sums, scratch, run_in_order,
        [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
          adaln_token_block_sum(p, b, begin, end, parts);
        },
        [&](std::int64_t b, int output, int i, float total) {
          adaln_store_token_sum(p, b, output, i, total);
        });
  }
  // dx after every sum: dx may be x or dy.
  adaln_backward_rows(p, 0, p.batch * p.seq);
}

void add_adaln_modulation_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnModulation, Direction::Forward>(
      [](const detail::AdaLnProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        adaln_forward(p);
      });
  k.set<OpType::AdaLnModulation, Direction::Backward>(
      [](const detail::AdaLnBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        adaln_backward(p);
      });
}

}  // namespace kernel_align::reference
