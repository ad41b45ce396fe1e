// true_cfg's launches (device/cfg_kernels.cuh) from its validated problems, for plan.hpp's
// Executors: one launch, a thread a row.
#pragma once

#include "api/cfg_problem.hpp"
#include "cuda/device/cfg_kernels.cuh"
#include "cuda/flow_sde_plan.hpp"    // optional_out_rows
#include "cuda/modulation_plan.hpp"  // item_launch
#include "cuda/plan.hpp"

namespace kernel_align::cuda::plan {

inline TrueCfgParams true_cfg_params(const ConstTensorView& cond, const ConstTensorView& uncond,
                                     float scale) {
  TrueCfgParams a;
  a.cond = row_tensor(cond);
  a.uncond = row_tensor(uncond);
  a.rows = detail::row_count(cond);
  a.d = static_cast<int>(cond.shape[cond.rank - 1]);
  a.scale = scale;
  return a;
}

template <class Executor>
void true_cfg_forward(const detail::TrueCfgProblem& p, Executor& exec) {
  TrueCfgParams a = true_cfg_params(p.cond, p.uncond, p.scale);
  a.out0 = out_row_tensor(p.v);
  exec.template launch<TrueCfgForward>(item_launch("true_cfg_forward", a.rows), a);
}

template <class Executor>
void true_cfg_backward(const detail::TrueCfgBackwardProblem& p, Executor& exec) {
  TrueCfgParams a = true_cfg_params(p.cond, p.uncond, p.scale);
  a.dv = row_tensor(p.dv);
  a.out0 = optional_out_rows(p.dcond);
  a.out1 = optional_out_rows(p.duncond);
  exec.template launch<TrueCfgBackward>(item_launch("true_cfg_backward", a.rows), a);
}

}  // namespace kernel_align::cuda::plan
