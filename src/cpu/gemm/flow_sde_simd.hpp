// Flow-GRPO's SDE step and its log-probability over vectors of fp32 lanes (docs/contract.md
// section 15), one template for every GEMM path (portable: one lane). The elementwise
// steps are each the contract's operation lane by lane (the same correctly rounded mul,
// add, sub); the leaves of a sample's sum of squares run one leaf per lane, the leaf's
// fma chain in element order, so each leaf is contract::linear_leaf's value. Rows are
// contiguous (unit stride); tails go through the same operations one lane at a time.
#pragma once

#include <cstdint>

#include "cpu/gemm/flow_sde_row.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/flow_sde.hpp"

namespace kernel_align::cpu {
namespace {

// Applies body(i) to the vectors of V::kWidth elements from i, then tail(i) to each
// element past the last whole vector.
template <class V, class Body, class Tail>
void over_row(std::int64_t count, const Body& body, const Tail& tail) {
  const std::int64_t vectors = count / V::kWidth * V::kWidth;
  for (std::int64_t i = 0; i < vectors; i += V::kWidth) body(i);
  for (std::int64_t i = vectors; i < count; ++i) tail(i);
}

template <class V>
typename V::F mean_of(const FlowSdeRow& r, std::int64_t i) {
  return V::add(V::mul(V::load_widened(r.x_dtype, r.x, i), V::set1(r.x_scale)),
                V::mul(V::load_widened(r.v_dtype, r.v, i), V::set1(r.v_scale)));
}

inline float mean_at(const FlowSdeRow& r, std::int64_t i) {
  return contract::flow_sde_mean(contract::load_f32(r.x_dtype, r.x, i),
                                 contract::load_f32(r.v_dtype, r.v, i), r.x_scale, r.v_scale);
}

// out0 = prev = mean + noise_scale * noise (third: noise).
template <class V>
void run_flow_sde_step_row(const FlowSdeRow& r) {
  over_row<V>(
      r.count,
      [&](std::int64_t i) {
        const auto noise = V::load_widened(r.third_dtype, r.third, i);
        V::store_output(r.out0_dtype, r.out0, i,
                        V::add(mean_of<V>(r, i), V::mul(V::set1(r.noise_scale), noise)));
      },
      [&](std::int64_t i) {
        contract::store_output(
            r.out0_dtype, r.out0, i,
            contract::flow_sde_prev(mean_at(r, i), contract::load_f32(r.third_dtype, r.third, i),
                                    r.noise_scale));
      });
}

// out0 = dx = dprev * x_scale, out1 = dv = dprev * v_scale (third: dprev; a null output
// is not written).
template <class V>
void run_flow_sde_step_grad_row(const FlowSdeRow& r) {
  over_row<V>(
      r.count,
      [&](std::int64_t i) {
        const auto g = V::load_widened(r.third_dtype, r.third, i);
        if (r.out0 != nullptr)
          V::store_output(r.out0_dtype, r.out0, i, V::mul(g, V::set1(r.x_scale)));
        if (r.out1 != nullptr)
          V::store_output(r.out1_dtype, r.out1, i, V::mul(g, V::set1(r.v_scale)));
      },
      [&](std::int64_t i) {
        const float g = contract::load_f32(r.third_dtype, r.third, i);
        if (r.out0 != nullptr)
          contract::store_output(r.out0_dtype, r.out0, i, contract::mul(g, r.x_scale));
        if (r.out1 != nullptr)
          contract::store_output(r.out1_dtype, r.out1, i, contract::mul(g, r.v_scale));
      });
}

// distances[i] = prev - mean (third: prev), in fp32.
template <class V>
void run_flow_sde_distance_row(const FlowSdeRow& r, float* distances) {
  over_row<V>(
      r.count,
      [&](std::int64_t i) {
        V::store(distances + i,
                 V::sub(V::load_widened(r.third_dtype, r.third, i), mean_of<V>(r, i)));
      },
      [&](std::int64_t i) {
        distances[i] = contract::sub(contract::load_f32(r.third_dtype, r.third, i), mean_at(r, i));
      });
}

// With g = r.grad_scale: dmean = g * (prev - mean); out0 = dx = dmean * x_scale, out1 = dv =
// dmean * v_scale (third: prev; a null output is not written).
template <class V>
void run_flow_sde_logp_grad_row(const FlowSdeRow& r) {
  over_row<V>(
      r.count,
      [&](std::int64_t i) {
        const auto d = V::sub(V::load_widened(r.third_dtype, r.third, i), mean_of<V>(r, i));
        const auto dmean = V::mul(V::set1(r.grad_scale), d);
        if (r.out0 != nullptr)
          V::store_output(r.out0_dtype, r.out0, i, V::mul(dmean, V::set1(r.x_scale)));
        if (r.out1 != nullptr)
          V::store_output(r.out1_dtype, r.out1, i, V::mul(dmean, V::set1(r.v_scale)));
      },
      [&](std::int64_t i) {
        const float d = contract::sub(contract::load_f32(r.third_dtype, r.third, i), mean_at(r, i));
        const float dmean = contract::mul(r.grad_scale, d);
        if (r.out0 != nullptr)
          contract::store_output(r.out0_dtype, r.out0, i, contract::mul(dmean, r.x_scale));
        if (r.out1 != nullptr)
          contract::store_output(r.out1_dtype, r.out1, i, contract::mul(dmean, r.v_scale));
      });
}

// sums[l] for l in [0, leaves): the fma chain from +0 over the kLinearLeaf consecutive
// distances of leaf l, in order; V::kWidth leaves at a time, a leaf per lane.
template <class V>
void run_flow_sde_leaf_sums(const float* distances, std::int64_t leaves, float* sums) {
  constexpr int kLeaf = contract::kLinearLeaf;
  const std::int64_t vectors = leaves / V::kWidth * V::kWidth;
  for (std::int64_t l = 0; l < vectors; l += V::kWidth) {
    const float* block = distances + l * kLeaf;
    auto acc = V::zero();
    for (int j = 0; j < kLeaf; ++j) {
      const auto d = V::load_leaf_column(block + j);
      acc = V::fma(d, d, acc);
    }
    V::store(sums + l, acc);
  }
  for (std::int64_t l = vectors; l < leaves; ++l) {
    float acc = 0.0f;
    for (int j = 0; j < kLeaf; ++j) {
      const float d = distances[l * kLeaf + j];
      acc = contract::fma_rn(d, d, acc);
    }
    sums[l] = acc;
  }
}

template <class V>
constexpr FlowSdeKernels flow_sde_kernels() {
  return {&run_flow_sde_step_row<V>, &run_flow_sde_step_grad_row<V>, &run_flow_sde_distance_row<V>,
          &run_flow_sde_logp_grad_row<V>, &run_flow_sde_leaf_sums<V>};
}

}  // namespace
}  // namespace kernel_align::cpu
