// The CUDA kernel bodies of Flow-GRPO's SDE step and its log-probability (docs/contract.md
// section 15), written as kernels.cuh's: the elementwise steps a thread an element (rows
// through RowIndexer, any rank, dtypes and strides); each sample's sum of squares as its
// leaves, a thread a leaf (the fma chain over the leaf's 32 elements in order), then a
// thread a sample pushing its leaves into linear's tree in order (contract/linear.hpp), so
// the sum is the reference's whatever the grid. An output may be the input it replaces:
// each element is read and written by its own thread.
#pragma once

#include <cstdint>

#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/flow_sde.hpp"

namespace kernel_align::cuda {

struct FlowSdeParams {
  RowTensor x, v;
  RowTensor third;          // noise (the step), dprev (its backward), prev (the log-probability)
  OutRowTensor out0, out1;  // prev, or dx and dv (data null: not asked for)
  std::int64_t rows = 0;    // of the whole call
  std::int64_t d = 0;
  std::int64_t sample_rows = 0;  // rows per sample
  std::int64_t leaves = 0;       // linear_leaf_count of a sample's elements
  float x_scale = 0.0f, v_scale = 0.0f, noise_scale = 0.0f;
  float inverse_two_variance = 0.0f, log_normalizer = 0.0f;
  float* leaf_sums = nullptr;  // scratch: [samples, leaves]
  const float* dlogp = nullptr;
  std::int64_t dlogp_stride = 0;
  float* logp = nullptr;
  std::int64_t logp_stride = 0;
  std::int64_t samples = 0;
};

KA_DEVICE float sde_element(const RowTensor& t, std::int64_t row, std::int64_t i) {
  return contract::load_f32(t.dtype, t.data, t.rows.offset(row) + i * t.step);
}

KA_DEVICE void sde_store(const OutRowTensor& t, std::int64_t row, std::int64_t i, float v) {
  if (t.data != nullptr) {
    contract::store_output(t.dtype, t.data, t.rows.offset(row) + i * t.step, v);
  }
}

KA_DEVICE float sde_mean(const FlowSdeParams& p, std::int64_t row, std::int64_t i) {
  return contract::flow_sde_mean(sde_element(p.x, row, i), sde_element(p.v, row, i), p.x_scale,
                                 p.v_scale);
}

// The calling thread's element (row, i), or false past the last.
template <class Grid>
KA_DEVICE bool own_element(const FlowSdeParams& p, std::int64_t& row, std::int64_t& i) {
  const std::int64_t e = global_thread<Grid>();
  if (e >= p.rows * p.d) return false;
  row = e / p.d;
  i = e % p.d;
  return true;
}

template <class Grid>
struct FlowSdeStepForward {
  using Params = FlowSdeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    std::int64_t row = 0, i = 0;
    if (!own_element<Grid>(p, row, i)) return;
    sde_store(
        p.out0, row, i,
        contract::flow_sde_prev(sde_mean(p, row, i), sde_element(p.third, row, i), p.noise_scale));
  }
};

template <class Grid>
struct FlowSdeStepBackward {
  using Params = FlowSdeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    std::int64_t row = 0, i = 0;
    if (!own_element<Grid>(p, row, i)) return;
    const float g = sde_element(p.third, row, i);
    sde_store(p.out0, row, i, contract::mul(g, p.x_scale));
    sde_store(p.out1, row, i, contract::mul(g, p.v_scale));
  }
};

// Leaf l of sample b: the fma chain over its elements k (row b * sample_rows + k / d).
template <class Grid>
struct FlowSdeLeafSums {
  using Params = FlowSdeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t t = global_thread<Grid>();
    if (t >= p.samples * p.leaves) return;
    const std::int64_t b = t / p.leaves, leaf = t % p.leaves;
    const std::int64_t n = p.sample_rows * p.d;
    float acc = 0.0f;
    for (std::int64_t k = contract::linear_leaf_begin(leaf); k < contract::linear_leaf_end(n, leaf);
         ++k) {
      const std::int64_t row = b * p.sample_rows + k / p.d, i = k % p.d;
      const float distance = contract::sub(sde_element(p.third, row, i), sde_mean(p, row, i));
      acc = contract::fma_rn(distance, distance, acc);
    }
    p.leaf_sums[t] = acc;
  }
};

// Sample b's leaves into linear's tree in order, then its log-probability.
template <class Grid>
struct FlowSdeFinishLogp {
  using Params = FlowSdeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t b = global_thread<Grid>();
    if (b >= p.samples) return;
    const std::int64_t n = p.sample_rows * p.d;
    contract::LinearTreeAccumulator<float, contract::LinearAddFloats> tree(
        n, contract::LinearAddFloats{});
    for (std::int64_t leaf = 0; leaf < p.leaves; ++leaf) {
      tree.push_leaf(p.leaf_sums[b * p.leaves + leaf]);
    }
    contract::store_output(DType::F32, p.logp, b * p.logp_stride,
                           contract::flow_sde_logp(tree.result(0.0f), static_cast<float>(n),
                                                   p.inverse_two_variance, p.log_normalizer));
  }
};

template <class Grid>
struct FlowSdeLogpBackward {
  using Params = FlowSdeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    std::int64_t row = 0, i = 0;
    if (!own_element<Grid>(p, row, i)) return;
    const float g = contract::flow_sde_logp_grad_scale(
        p.dlogp[row / p.sample_rows * p.dlogp_stride], static_cast<float>(p.sample_rows * p.d),
        p.inverse_two_variance);
    const float dmean =
        contract::mul(g, contract::sub(sde_element(p.third, row, i), sde_mean(p, row, i)));
    sde_store(p.out0, row, i, contract::mul(dmean, p.x_scale));
    sde_store(p.out1, row, i, contract::mul(dmean, p.v_scale));
  }
};

}  // namespace kernel_align::cuda
