// flow_sde_step's and flow_sde_logp's launches (device/flow_sde_kernels.cuh) from their
// validated problems, for plan.hpp's Executors: the elementwise passes a thread an element,
// the log-probability's leaves a thread a leaf into this call's scratch, then a thread a
// sample. Every choice is a pure function of the problem's extents; none changes a bit.
#pragma once

#include <cstdint>

#include "api/flow_sde_problem.hpp"
#include "cuda/device/flow_sde_kernels.cuh"
#include "cuda/modulation_plan.hpp"  // item_launch
#include "cuda/plan.hpp"

namespace kernel_align::cuda::plan {

inline OutRowTensor optional_out_rows(const TensorView& t) {
  return t.data != nullptr ? out_row_tensor(t) : OutRowTensor{};
}

// The extents and constants of a call over `like`'s rows.
inline FlowSdeParams flow_sde_params(const ConstTensorView& like, const FlowSdeCoefficients& c) {
  FlowSdeParams f;
  f.rows = detail::row_count(like);
  f.d = like.shape[like.rank - 1];
  f.samples = like.shape[0];
  f.sample_rows = f.rows / f.samples;
  f.leaves = contract::linear_leaf_count(f.sample_rows * f.d);
  f.x_scale = c.x_scale;
  f.v_scale = c.v_scale;
  f.noise_scale = c.noise_scale;
  f.inverse_two_variance = c.inverse_two_variance;
  f.log_normalizer = c.log_normalizer;
  return f;
}

template <class Executor>
void flow_sde_step_forward(const detail::FlowSdeStepProblem& p, Executor& exec) {
  FlowSdeParams f = flow_sde_params(p.x, p.constants);
  f.x = row_tensor(p.x);
  f.v = row_tensor(p.v);
  f.third = row_tensor(p.noise);
  f.out0 = out_row_tensor(p.prev);
  exec.template launch<FlowSdeStepForward>(item_launch("flow_sde_step", f.rows * f.d), f);
}

template <class Executor>
void flow_sde_step_backward(const detail::FlowSdeStepBackwardProblem& p, Executor& exec) {
  FlowSdeParams f = flow_sde_params(p.dprev, p.constants);
  f.third = row_tensor(p.dprev);
  f.out0 = optional_out_rows(p.dx);
  f.out1 = optional_out_rows(p.dv);
  exec.template launch<FlowSdeStepBackward>(item_launch("flow_sde_step_backward", f.rows * f.d), f);
}

template <class Executor>
void flow_sde_logp_forward(const detail::FlowSdeLogpProblem& p, Executor& exec) {
  FlowSdeParams f = flow_sde_params(p.x, p.constants);
  f.x = row_tensor(p.x);
  f.v = row_tensor(p.v);
  f.third = row_tensor(p.prev);
  f.leaf_sums = exec.scratch_floats(static_cast<std::size_t>(f.samples * f.leaves));
  f.logp = static_cast<float*>(p.logp.data);
  f.logp_stride = p.logp.strides[0];
  exec.template launch<FlowSdeLeafSums>(item_launch("flow_sde_leaf_sums", f.samples * f.leaves), f);
  exec.template launch<FlowSdeFinishLogp>(item_launch("flow_sde_finish_logp", f.samples), f);
}

template <class Executor>
void flow_sde_logp_backward(const detail::FlowSdeLogpBackwardProblem& p, Executor& exec) {
  FlowSdeParams f = flow_sde_params(p.x, p.constants);
  f.x = row_tensor(p.x);
  f.v = row_tensor(p.v);
  f.third = row_tensor(p.prev);
  f.out0 = optional_out_rows(p.dx);
  f.out1 = optional_out_rows(p.dv);
  f.dlogp = static_cast<const float*>(p.dlogp.data);
  f.dlogp_stride = p.dlogp.strides[0];
  exec.template launch<FlowSdeLogpBackward>(item_launch("flow_sde_logp_backward", f.rows * f.d), f);
}

}  // namespace kernel_align::cuda::plan
