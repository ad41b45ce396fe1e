#include "reference/adaln.hpp"
#include "reference/kernels.hpp"

#include "kernel_align/contract/adaln.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"  // the dw partition, shared by the token sums

namespace kernel_align::reference {
namespace {

// Row (b, s) of `t` (D elements) widened to fp32 into out[0..D): one switch on the dtype
// a row, not one an element.
template <class Tensor>
void load_row(const Tensor& t, std::int64_t b, std::int64_t s, int d, float* out) {
  const std::int64_t base = t.offset(b, s, 0);
  const std::int64_t step = t.strides[2];
  switch (t.dtype) {
    case DType::BF16: {
      const auto* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (int i = 0; i < d; ++i) out[i] = contract::bf16_to_f32(p[i * step]);
      return;
    }
    case DType::F16: {
      const auto* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (int i = 0; i < d; ++i) out[i] = contract::f16_to_f32(p[i * step]);
      return;
    }
    default:
      for (int i = 0; i < d; ++i) out[i] = contract::load_f32(t.dtype, t.data, base + i * step);
      return;
  }
}

// values[0..D) stored (store_output) into row (b, s) of `t`.
void store_row(const detail::AdaLnOutput& t, std::int64_t b, std::int64_t s, int d,
               const float* values) {
  const std::int64_t base = t.offset(b, s, 0);
  const std::int64_t step = t.strides[2];
  if (t.dtype == DType::F32) {
    float* p = static_cast<float*>(t.data) + base;
    for (int i = 0; i < d; ++i) p[i * step] = contract::stored_f32(values[i]);
  } else {
    std::uint16_t* p = static_cast<std::uint16_t*>(t.data) + base;
    for (int i = 0; i < d; ++i) p[i * step] = contract::stored_bits16(t.dtype, values[i]);
  }
}

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

}  // namespace

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

std::int64_t adaln_token_blocks(const detail::AdaLnBackwardProblem& p) {
  return contract::dw_block_count(p.seq);
}

void adaln_token_block_sums(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                            std::int64_t block, float* dscale_part, float* dshift_part) {
  RowScratch& w = scratch(p.dim);
  for (int i = 0; i < p.dim; ++i) {
    if (dscale_part != nullptr) dscale_part[i] = 0.0f;
    if (dshift_part != nullptr) dshift_part[i] = 0.0f;
  }
  const std::int64_t end = contract::dw_block_end(p.seq, block);
  for (std::int64_t s = contract::dw_block_begin(p.seq, block); s < end; ++s) {
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
