#include "reference/adaln.hpp"

#include "kernel_align/contract/adaln.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"  // the dw partition, shared by the token sums

namespace kernel_align::reference {
namespace {

using contract::load_f32;

template <class Tensor>
float element(const Tensor& t, std::int64_t b, std::int64_t s, int d) {
  return load_f32(t.dtype, t.data, t.offset(b, s, d));
}

// Row (b, s) of x widened to fp32 into `x` (read once: the statistics take two passes),
// and its statistics.
template <class Problem>
contract::LayerNormRow row_of(const Problem& p, std::int64_t b, std::int64_t s,
                              std::vector<float>& x) {
  x.resize(static_cast<std::size_t>(p.dim));
  for (int i = 0; i < p.dim; ++i) x[i] = element(p.x, b, s, i);
  return contract::layernorm_row(p.dim, p.eps, [&](int i) { return x[i]; });
}

}  // namespace

void adaln_forward_rows(const detail::AdaLnProblem& p, std::int64_t begin, std::int64_t end) {
  thread_local std::vector<float> x;
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    const contract::LayerNormRow row = row_of(p, b, s, x);
    for (int i = 0; i < p.dim; ++i) {
      const float n = contract::layernorm_normalized(x[i], row);
      const float m = contract::adaln_factor(element(p.scale, b, s, i), p.mode, p.scale.dtype);
      const float y = contract::adaln_forward(contract::adaln_modulated_norm(n, p.mode, p.x.dtype),
                                              m, element(p.shift, b, s, i), p.mode, p.y.dtype);
      contract::store_output(p.y.dtype, p.y.data, p.y.offset(b, s, i), y);
    }
  }
}

std::int64_t adaln_token_blocks(const detail::AdaLnBackwardProblem& p) {
  return contract::dw_block_count(p.seq);
}

void adaln_token_block_sums(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                            std::int64_t block, float* dscale_part, float* dshift_part) {
  for (int i = 0; i < p.dim; ++i) {
    if (dscale_part != nullptr) dscale_part[i] = 0.0f;
    if (dshift_part != nullptr) dshift_part[i] = 0.0f;
  }
  thread_local std::vector<float> x;
  const std::int64_t end = contract::dw_block_end(p.seq, block);
  for (std::int64_t s = contract::dw_block_begin(p.seq, block); s < end; ++s) {
    const contract::LayerNormRow row =
        dscale_part != nullptr ? row_of(p, b, s, x) : contract::LayerNormRow{0.0f, 0.0f};
    for (int i = 0; i < p.dim; ++i) {
      const float dy = element(p.dy, b, s, i);
      if (dscale_part != nullptr) {
        const float n = contract::adaln_modulated_norm(contract::layernorm_normalized(x[i], row),
                                                       p.mode, p.x.dtype);
        dscale_part[i] = contract::add(dscale_part[i], contract::mul(dy, n));
      }
      if (dshift_part != nullptr) dshift_part[i] = contract::add(dshift_part[i], dy);
    }
  }
}

void adaln_combine_blocks(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                          const float* dscale_parts, const float* dshift_parts) {
  const std::int64_t blocks = adaln_token_blocks(p);
  const auto combine = [&](const detail::AdaLnOutput& out, const float* parts) {
    if (parts == nullptr) return;
    for (int i = 0; i < p.dim; ++i) {
      float total = 0.0f;
      for (std::int64_t k = 0; k < blocks; ++k) total = contract::add(total, parts[k * p.dim + i]);
      contract::store_output(out.dtype, out.data, out.offset(b, 0, i), total);
    }
  };
  combine(p.dscale, dscale_parts);
  combine(p.dshift, dshift_parts);
}

void adaln_backward_rows(const detail::AdaLnBackwardProblem& p, std::int64_t begin,
                         std::int64_t end) {
  thread_local std::vector<float> x, g;
  g.resize(static_cast<std::size_t>(p.dim));
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    const contract::LayerNormRow row = row_of(p, b, s, x);
    for (int i = 0; i < p.dim; ++i) {
      g[i] = contract::mul(element(p.dy, b, s, i), contract::adaln_factor(element(p.scale, b, s, i),
                                                                          p.mode, p.scale.dtype));
    }
    const auto n = [&](int i) { return contract::layernorm_normalized(x[i], row); };
    const contract::AdaLnBackwardRow constants = contract::adaln_backward_constants(
        row, contract::tree_sum(p.dim, [&](int i) { return g[i]; }),
        contract::tree_sum(p.dim, [&](int i) { return contract::mul(g[i], n(i)); }), p.dim);
    for (int i = 0; i < p.dim; ++i) {
      contract::store_output(p.dx.dtype, p.dx.data, p.dx.offset(b, s, i),
                             contract::adaln_backward_dx(g[i], n(i), constants));
    }
  }
}

void adaln_forward(const detail::AdaLnProblem& p) {
  adaln_forward_rows(p, 0, p.batch * p.seq);
}

void adaln_backward(const detail::AdaLnBackwardProblem& p) {
  const bool scale = p.dscale.data != nullptr;
  const bool shift = p.dshift.data != nullptr;
  if (scale || shift) {
    const std::int64_t blocks = adaln_token_blocks(p);
    const auto size = static_cast<std::size_t>(blocks * p.dim);
    std::vector<float> dscale_parts(scale ? size : 0);
    std::vector<float> dshift_parts(shift ? size : 0);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t k = 0; k < blocks; ++k) {
        adaln_token_block_sums(p, b, k, scale ? &dscale_parts[k * p.dim] : nullptr,
                               shift ? &dshift_parts[k * p.dim] : nullptr);
      }
      adaln_combine_blocks(p, b, scale ? dscale_parts.data() : nullptr,
                           shift ? dshift_parts.data() : nullptr);
    }
  }
  adaln_backward_rows(p, 0, p.batch * p.seq);
}

}  // namespace kernel_align::reference
