// The CUDA kernel bodies of adaln_modulation and adaln_gate_residual (docs/contract.md
// sections 12 and 13), written as kernels.cuh's (a struct with Params, Shared and
// `run(params, shared)`, a template on the Grid) over the contract headers' arithmetic.
//
// - Elementwise steps (the gate's out and dy): one element a thread.
// - Rows (adaln's LayerNorm): 16 threads a row, thread j owning lane j of the row tree
//   (elements j, j + 16, ...), the halvings as shuffles xor 8, 4, 2, 1, as the norm's
//   generic path. Both of a row's sums (the mean, then the variance about it; in the
//   backward the sums of g and g n) take that tree.
// - Sums over a sample's tokens (dgate, dscale, dshift): one thread per (sample, token
//   block of the dw partition, column) adds its block's tokens in order from +0 into a
//   partial; then one thread per (sample, output, column) adds the partials in block order
//   from +0 (reference/token_sums.hpp's order, which the CPU backend runs too).
//
// The backwards compute every sum before they write dx or dy, which may be an input (in
// place), as the reference does.
#pragma once

#include <cstdint>

#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/adaln.hpp"
#include "kernel_align/contract/gate_residual.hpp"
#include "kernel_align/contract/rmsnorm.hpp"  // the dw partition

namespace kernel_align::cuda {

// A [B, S, D] tensor by element strides; a per-sample vector [B, D] has a sequence stride
// of 0.
struct TokenTensor {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t stride_b = 0, stride_s = 0, stride_d = 1;
  KA_HD float load(std::int64_t b, std::int64_t s, std::int64_t i) const {
    return contract::load_f32(dtype, data, b * stride_b + s * stride_s + i * stride_d);
  }
};

struct OutTokenTensor {
  void* data = nullptr;  // null: an output nobody asked for
  DType dtype = DType::F32;
  std::int64_t stride_b = 0, stride_s = 0, stride_d = 1;
  KA_HD void store(std::int64_t b, std::int64_t s, std::int64_t i, float v) const {
    contract::store_output(dtype, data, b * stride_b + s * stride_s + i * stride_d, v);
  }
};

// The extents every modulation kernel shares.
struct Tokens {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  int dim = 0;
  KA_HD std::int64_t rows() const { return batch * seq; }
  KA_HD std::int64_t elements() const { return rows() * dim; }
  KA_HD std::int64_t token_blocks() const { return contract::dw_block_count(seq); }
};

// Element e of a [B, S, D] call, in (b, s, i) row-major order.
struct TokenElement {
  std::int64_t b, s, i;
};

KA_HD inline TokenElement token_element(const Tokens& t, std::int64_t e) {
  const std::int64_t r = e / t.dim;
  return {r / t.seq, r % t.seq, e % t.dim};
}

// ---- the sums over a sample's tokens ------------------------------------------------

// The partials of a call: [batch x token blocks][outputs][dim] fp32.
struct TokenPartials {
  float* data = nullptr;
  int outputs = 0;
  KA_HD float& at(const Tokens& t, std::int64_t task, int output, std::int64_t i) const {
    return data[(task * outputs + output) * t.dim + i];
  }
};

// Each output's sum per (sample, column): the partials added in block order from +0.
struct FinishTokenSumsParams {
  Tokens tokens;
  const float* partials = nullptr;
  int outputs = 0;
  OutTokenTensor out[2];  // [B, D] each (sequence stride 0)
};

template <class Grid>
struct FinishTokenSums {
  using Params = FinishTokenSumsParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    const std::int64_t dim = p.tokens.dim;
    if (e >= p.tokens.batch * p.outputs * dim) return;
    const std::int64_t i = e % dim;
    const int o = static_cast<int>((e / dim) % p.outputs);
    const std::int64_t b = e / (dim * p.outputs);
    const std::int64_t blocks = p.tokens.token_blocks();
    float total = 0.0f;
    for (std::int64_t k = 0; k < blocks; ++k) {
      total = contract::add(total, p.partials[((b * blocks + k) * p.outputs + o) * dim + i]);
    }
    p.out[o].store(b, 0, i, total);
  }
};

// Thread (task, column) of a token-block kernel: its sample and tokens [begin, end), or
// false past the last.
struct TokenBlockColumn {
  std::int64_t task, b, begin, end, i;
};

template <class Grid>
KA_DEVICE bool token_block_column(const Tokens& t, TokenBlockColumn& c) {
  const std::int64_t e = global_thread<Grid>();
  const std::int64_t blocks = t.token_blocks();
  if (e >= t.batch * blocks * t.dim) return false;
  c.i = e % t.dim;
  c.task = e / t.dim;
  c.b = c.task / blocks;
  c.begin = contract::dw_block_begin(t.seq, c.task % blocks);
  c.end = contract::dw_block_end(t.seq, c.task % blocks);
  return true;
}

// ---- adaln_gate_residual --------------------------------------------------------------

struct GateForwardParams {
  Tokens tokens;
  NormMode mode = NormMode::Diffusers;
  TokenTensor x, gate, y;
  OutTokenTensor out;
};

// out = x + gate * y, an element a thread (out may be x or y: each element is read before
// it is written, by its own thread).
template <class Grid>
struct GateForward {
  using Params = GateForwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.tokens.elements()) return;
    const auto [b, s, i] = token_element(p.tokens, e);
    p.out.store(b, s, i,
                contract::gate_residual_forward(p.x.load(b, s, i), p.gate.load(b, 0, i),
                                                p.y.load(b, s, i), p.mode, p.out.dtype));
  }
};

struct GateBackwardParams {
  Tokens tokens;
  TokenTensor gate, y, dout;
  OutTokenTensor dy;
  TokenPartials partials;  // dgate's (outputs 1)
};

// dgate's partials: a task's tokens' dout * y, added in token order from +0.
template <class Grid>
struct GateTokenBlockSums {
  using Params = GateBackwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    TokenBlockColumn c{};
    if (!token_block_column<Grid>(p.tokens, c)) return;
    float part = 0.0f;
    for (std::int64_t s = c.begin; s < c.end; ++s) {
      part = contract::add(part, contract::mul(p.dout.load(c.b, s, c.i), p.y.load(c.b, s, c.i)));
    }
    p.partials.at(p.tokens, c.task, 0, c.i) = part;
  }
};

// dy = gate * dout, an element a thread.
template <class Grid>
struct GateBackwardDy {
  using Params = GateBackwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.tokens.elements()) return;
    const auto [b, s, i] = token_element(p.tokens, e);
    p.dy.store(b, s, i, contract::gate_residual_dy(p.gate.load(b, 0, i), p.dout.load(b, s, i)));
  }
};

// ---- adaln_modulation ----------------------------------------------------------------

inline constexpr int kRowThreads = contract::kTreeLanes;  // one lane of the row tree each

// Row `row` of a row kernel's thread, and its lane j; rows past the end take part in the
// shuffles on zeros.
struct RowThread {
  std::int64_t row, b, s;
  int j;
  bool active;
};

template <class Grid>
KA_DEVICE RowThread row_thread(const Tokens& t) {
  const unsigned thread = Grid::thread();
  RowThread r{};
  r.j = static_cast<int>(thread % kRowThreads);
  r.row = static_cast<std::int64_t>(Grid::block()) * (Grid::threads() / kRowThreads) +
          thread / kRowThreads;
  r.active = r.row < t.rows();
  r.b = r.active ? r.row / t.seq : 0;
  r.s = r.active ? r.row % t.seq : 0;
  return r;
}

// The row tree's sum of term(i) over the row, every thread of the row's group getting it.
template <class Grid, class Term>
KA_DEVICE float row_tree_sum(const RowThread& r, int dim, const Term& term) {
  float lane[1] = {0.0f};
  for (int i = r.j; r.active && i < dim; i += kRowThreads)
    lane[0] = contract::add(lane[0], term(i));
  return group_tree_sum<Grid, 1>(lane);
}

// contract::layernorm_row of the row, by the row's 16 threads.
template <class Grid>
KA_DEVICE contract::LayerNormRow layernorm_row(const RowThread& r, const TokenTensor& x, int dim,
                                               float eps) {
  const auto value = [&](int i) { return x.load(r.b, r.s, i); };
  const float mean = contract::div(row_tree_sum<Grid>(r, dim, value), static_cast<float>(dim));
  const float var = contract::div(row_tree_sum<Grid>(r, dim,
                                                     [&](int i) {
                                                       const float c =
                                                           contract::sub(value(i), mean);
                                                       return contract::mul(c, c);
                                                     }),
                                  static_cast<float>(dim));
  return {mean, contract::div(1.0f, contract::sqrt_rn(contract::add(var, eps)))};
}

struct AdaLnForwardParams {
  Tokens tokens;
  float eps = 0.0f;
  NormMode mode = NormMode::Diffusers;
  TokenTensor x, scale, shift;
  OutTokenTensor y;
};

// y = n' (1 + scale) + shift, a row per 16 threads (y may be x: a row's every read comes
// before its group's shuffles, its writes after them).
template <class Grid>
struct AdaLnForward {
  using Params = AdaLnForwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const RowThread r = row_thread<Grid>(p.tokens);
    const contract::LayerNormRow row = layernorm_row<Grid>(r, p.x, p.tokens.dim, p.eps);
    if (!r.active) return;
    for (int i = r.j; i < p.tokens.dim; i += kRowThreads) {
      const float n = contract::adaln_modulated_norm(
          contract::layernorm_normalized(p.x.load(r.b, r.s, i), row), p.mode, p.x.dtype);
      const float m = contract::adaln_factor(p.scale.load(r.b, 0, i), p.mode, p.scale.dtype);
      p.y.store(r.b, r.s, i,
                contract::adaln_forward(n, m, p.shift.load(r.b, 0, i), p.mode, p.y.dtype));
    }
  }
};

struct AdaLnBackwardParams {
  Tokens tokens;
  float eps = 0.0f;
  NormMode mode = NormMode::Diffusers;
  TokenTensor x, scale, dy;
  OutTokenTensor dx;
  float* rows = nullptr;   // each row's mean and rstd, [rows][2]
  TokenPartials partials;  // dscale's (output 0, when asked for), then dshift's
  bool dscale = false;
  bool dshift = false;
};

// Each row's LayerNorm statistics, which the sums and dx read.
template <class Grid>
struct AdaLnRowStatistics {
  using Params = AdaLnBackwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const RowThread r = row_thread<Grid>(p.tokens);
    const contract::LayerNormRow row = layernorm_row<Grid>(r, p.x, p.tokens.dim, p.eps);
    if (!r.active || r.j != 0) return;
    p.rows[2 * r.row] = row.mean;
    p.rows[2 * r.row + 1] = row.rstd;
  }
};

KA_DEVICE contract::LayerNormRow row_statistics(const AdaLnBackwardParams& p, std::int64_t row) {
  return {p.rows[2 * row], p.rows[2 * row + 1]};
}

// dscale's and dshift's partials: a task's tokens' dy * n' and dy, in token order from +0.
template <class Grid>
struct AdaLnTokenBlockSums {
  using Params = AdaLnBackwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    TokenBlockColumn c{};
    if (!token_block_column<Grid>(p.tokens, c)) return;
    float dscale = 0.0f;
    float dshift = 0.0f;
    for (std::int64_t s = c.begin; s < c.end; ++s) {
      const float dy = p.dy.load(c.b, s, c.i);
      if (p.dscale) {
        const contract::LayerNormRow row = row_statistics(p, c.b * p.tokens.seq + s);
        const float n = contract::adaln_modulated_norm(
            contract::layernorm_normalized(p.x.load(c.b, s, c.i), row), p.mode, p.x.dtype);
        dscale = contract::add(dscale, contract::mul(dy, n));
      }
      if (p.dshift) dshift = contract::add(dshift, dy);
    }
    if (p.dscale) p.partials.at(p.tokens, c.task, 0, c.i) = dscale;
    if (p.dshift) p.partials.at(p.tokens, c.task, p.dscale ? 1 : 0, c.i) = dshift;
  }
};

// dx = rstd ((g - sum(g) / D) - n sum(g n) / D), g = dy (1 + scale), a row per 16 threads
// (dx may be x or dy: the reads come before the group's shuffles, the writes after).
template <class Grid>
struct AdaLnBackwardDx {
  using Params = AdaLnBackwardParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const RowThread r = row_thread<Grid>(p.tokens);
    const contract::LayerNormRow row =
        r.active ? row_statistics(p, r.row) : contract::LayerNormRow{0.0f, 0.0f};
    const int dim = p.tokens.dim;
    const auto g = [&](int i) {
      const float m = contract::adaln_factor(p.scale.load(r.b, 0, i), p.mode, p.scale.dtype);
      return contract::mul(p.dy.load(r.b, r.s, i), m);
    };
    const auto n = [&](int i) {
      return contract::layernorm_normalized(p.x.load(r.b, r.s, i), row);
    };
    const float sum_g = row_tree_sum<Grid>(r, dim, g);
    const float sum_gn =
        row_tree_sum<Grid>(r, dim, [&](int i) { return contract::mul(g(i), n(i)); });
    if (!r.active) return;
    const contract::AdaLnBackwardRow constants =
        contract::adaln_backward_constants(row, sum_g, sum_gn, dim);
    for (int i = r.j; i < dim; i += kRowThreads) {
      p.dx.store(r.b, r.s, i, contract::adaln_backward_dx(g(i), n(i), constants));
    }
  }
};

}  // namespace kernel_align::cuda
