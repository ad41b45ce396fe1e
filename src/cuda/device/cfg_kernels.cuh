// The CUDA kernel bodies of true_cfg (docs/contract.md section 17), written as kernels.cuh's:
// a thread a row (a token's channels, 64 in Qwen-Image), contract/cfg.hpp's functions over
// the row's elements in the order the reference takes them. Any rank, dtypes and strides
// (rows through RowIndexer). An output may be an input only where the descriptor allows
// (v of the forward): each row is summed whole before its thread writes it.
#pragma once

#include <cstdint>

#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/cfg.hpp"
#include "kernel_align/contract/convert.hpp"

namespace kernel_align::cuda {

struct TrueCfgParams {
  RowTensor cond;
  RowTensor uncond;
  RowTensor dv;       // the backward's
  OutRowTensor out0;  // v, or the backward's dcond (data null: not asked for)
  OutRowTensor out1;  // the backward's duncond
  std::int64_t rows = 0;
  int d = 0;
  float scale = 0.0f;
};

KA_DEVICE float cfg_load(const RowTensor& t, std::int64_t row, int i) {
  return contract::load_f32(t.dtype, t.data, t.rows.offset(row) + i * t.step);
}

KA_DEVICE void cfg_store(const OutRowTensor& t, std::int64_t row, int i, float value) {
  contract::store_output(t.dtype, t.data, t.rows.offset(row) + i * t.step, value);
}

template <class Grid>
struct TrueCfgForward {
  using Params = TrueCfgParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t row = global_thread<Grid>();
    if (row >= p.rows) return;
    const auto c = [&](int i) { return cfg_load(p.cond, row, i); };
    const auto u = [&](int i) { return cfg_load(p.uncond, row, i); };
    const float ratio = contract::cfg_row(p.d, p.scale, c, u).ratio();
    for (int i = 0; i < p.d; ++i) {
      cfg_store(p.out0, row, i,
                contract::cfg_output(contract::cfg_combined(c(i), u(i), p.scale), ratio));
    }
  }
};

template <class Grid>
struct TrueCfgBackward {
  using Params = TrueCfgParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t row = global_thread<Grid>();
    if (row >= p.rows) return;
    const auto c = [&](int i) { return cfg_load(p.cond, row, i); };
    const auto u = [&](int i) { return cfg_load(p.uncond, row, i); };
    const contract::CfgRow sums = contract::cfg_row(p.d, p.scale, c, u);
    const float a = contract::tree_sum(p.d, [&](int i) {
      return contract::mul(cfg_load(p.dv, row, i), contract::cfg_combined(c(i), u(i), p.scale));
    });
    const contract::CfgGradient g = contract::cfg_gradient(sums, a, p.scale);
    for (int i = 0; i < p.d; ++i) {
      const contract::CfgElementGradient e =
          contract::cfg_element_gradient(g, cfg_load(p.dv, row, i), c(i), u(i));
      if (p.out0.data != nullptr) cfg_store(p.out0, row, i, e.dcond);
      if (p.out1.data != nullptr) cfg_store(p.out1, row, i, e.duncond);
    }
  }
};

}  // namespace kernel_align::cuda
