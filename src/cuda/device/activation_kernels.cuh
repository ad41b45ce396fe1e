// The CUDA kernel bodies of the elementwise activation (docs/contract.md section 14),
// written as kernels.cuh's: a thread an element, the contract's activate and
// activate_backward (contract/activation.hpp), any rank, dtypes and strides (rows through
// RowIndexer, as the norm's kernels read them). An output may be its input: each element
// is read and written by its own thread.
#pragma once

#include <cstdint>

#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/activation.hpp"

namespace kernel_align::cuda {

struct ActivationParams {
  RowTensor x;
  RowTensor dy;      // the backward's
  OutRowTensor out;  // y, or the backward's dx
  std::int64_t rows = 0;
  std::int64_t d = 0;
  contract::Activation activation = contract::Activation::Silu;
};

KA_DEVICE float load_row_element(const RowTensor& t, std::int64_t row, std::int64_t i) {
  return contract::load_f32(t.dtype, t.data, t.rows.offset(row) + i * t.step);
}

// The calling thread's element of the call: out = value(row, i); nothing past the last.
template <class Grid, class Value>
KA_DEVICE void for_own_element(const ActivationParams& p, const Value& value) {
  const std::int64_t e = global_thread<Grid>();
  if (e >= p.rows * p.d) return;
  const std::int64_t row = e / p.d, i = e % p.d;
  contract::store_output(p.out.dtype, p.out.data, p.out.rows.offset(row) + i * p.out.step,
                         value(row, i));
}

template <class Grid>
struct ActivationForward {
  using Params = ActivationParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    for_own_element<Grid>(p, [&](std::int64_t row, std::int64_t i) {
      return contract::activate(p.activation, load_row_element(p.x, row, i));
    });
  }
};

template <class Grid>
struct ActivationBackward {
  using Params = ActivationParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    for_own_element<Grid>(p, [&](std::int64_t row, std::int64_t i) {
      return contract::activate_backward(p.activation, load_row_element(p.dy, row, i),
                                         load_row_element(p.x, row, i));
    });
  }
};

}  // namespace kernel_align::cuda
