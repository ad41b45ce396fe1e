// adaln_modulation's, adaln_gate_residual's and the activation's launches
// (device/modulation_kernels.cuh, device/activation_kernels.cuh),
// from their validated problems, for plan.hpp's Executors. Every choice here is a pure
// function of the problem's extents; none changes a result bit.
#pragma once

#include <cstdint>

#include "api/activation_problem.hpp"
#include "api/adaln_problem.hpp"
#include "api/gate_residual_problem.hpp"
#include "cuda/device/activation_kernels.cuh"
#include "cuda/device/modulation_kernels.cuh"
#include "cuda/plan.hpp"

namespace kernel_align::cuda::plan {

inline constexpr unsigned kElementThreads = 256;

inline TokenTensor token_tensor(const detail::AdaLnInput& t) {
  return {t.data, t.dtype, t.strides[0], t.strides[1], t.strides[2]};
}

inline OutTokenTensor token_tensor(const detail::AdaLnOutput& t) {
  return {t.data, t.dtype, t.strides[0], t.strides[1], t.strides[2]};
}

// One thread per item: `items` elements, or (task, column) pairs, or sums.
inline registry::LaunchRecord item_launch(const char* kernel, std::int64_t items) {
  registry::LaunchRecord l;
  l.kernel = kernel;
  l.path = "generic";
  l.block = {kElementThreads, 1, 1};
  l.grid = {to_grid((items + kElementThreads - 1) / kElementThreads), 1, 1};
  return l;
}

// A call's sums over each sample's tokens (reference/token_sums.hpp's order): `outputs`
// partials per (sample, token block, column) in this call's scratch, filled by the op's
// BlockSums kernel (`p.partials` names them), then each output's total per (sample, column)
// added in block order and stored into `first` (and `second`, the second output's).
template <template <class> class BlockSums, class Params, class Executor>
void sum_over_tokens(const char* kernel, Params& p, int outputs, const detail::AdaLnOutput& first,
                     const detail::AdaLnOutput& second, Executor& exec) {
  const Tokens& t = p.tokens;
  p.partials = {exec.scratch_floats(static_cast<std::size_t>(t.batch * t.token_blocks() * outputs) *
                                    static_cast<std::size_t>(t.dim)),
                outputs};
  exec.template launch<BlockSums>(item_launch(kernel, t.batch * t.token_blocks() * t.dim), p);
  FinishTokenSumsParams f;
  f.tokens = t;
  f.partials = p.partials.data;
  f.outputs = outputs;
  f.out[0] = token_tensor(first);
  f.out[1] = token_tensor(second);
  exec.template launch<FinishTokenSums>(item_launch("finish_token_sums", t.batch * outputs * t.dim),
                                        f);
}

template <class Executor>
void gate_residual_forward(const detail::GateResidualProblem& p, Executor& exec) {
  GateForwardParams g;
  g.tokens = {p.batch, p.seq, p.dim};
  g.mode = p.mode;
  g.x = token_tensor(p.x);
  g.gate = token_tensor(p.gate);
  g.y = token_tensor(p.y);
  g.out = token_tensor(p.out);
  exec.template launch<GateForward>(item_launch("gate_residual_forward", g.tokens.elements()), g);
}

// dgate's sums (when asked for), then dy: dy may be dout or y.
template <class Executor>
void gate_residual_backward(const detail::GateResidualBackwardProblem& p, Executor& exec) {
  GateBackwardParams g;
  g.tokens = {p.batch, p.seq, p.dim};
  g.gate = token_tensor(p.gate);
  g.y = token_tensor(p.y);
  g.dout = token_tensor(p.dout);
  g.dy = token_tensor(p.dy);
  if (p.dgate.data != nullptr) {
    sum_over_tokens<GateTokenBlockSums>("gate_token_block_sums", g, 1, p.dgate, p.dgate, exec);
  }
  exec.template launch<GateBackwardDy>(item_launch("gate_residual_dy", g.tokens.elements()), g);
}

// 16 threads a row, 16 rows a block.
inline registry::LaunchRecord modulation_row_launch(const char* kernel, std::int64_t rows) {
  return row_launch(kernel, rows, false);
}

template <class Executor>
void adaln_forward(const detail::AdaLnProblem& p, Executor& exec) {
  AdaLnForwardParams a;
  a.tokens = {p.batch, p.seq, p.dim};
  a.eps = p.eps;
  a.mode = p.mode;
  a.x = token_tensor(p.x);
  a.scale = token_tensor(p.scale);
  a.shift = token_tensor(p.shift);
  a.y = token_tensor(p.y);
  exec.template launch<AdaLnForward>(modulation_row_launch("adaln_forward", a.tokens.rows()), a);
}

// Each row's statistics, dscale's and dshift's sums (those asked for), then dx: dx may be x
// or dy.
template <class Executor>
void adaln_backward(const detail::AdaLnBackwardProblem& p, Executor& exec) {
  AdaLnBackwardParams a;
  a.tokens = {p.batch, p.seq, p.dim};
  a.eps = p.eps;
  a.mode = p.mode;
  a.x = token_tensor(p.x);
  a.scale = token_tensor(p.scale);
  a.dy = token_tensor(p.dy);
  a.dx = token_tensor(p.dx);
  a.dscale = p.dscale.data != nullptr;
  a.dshift = p.dshift.data != nullptr;
  a.rows = exec.scratch_floats(static_cast<std::size_t>(2 * a.tokens.rows()));
  exec.template launch<AdaLnRowStatistics>(
      modulation_row_launch("adaln_row_statistics", a.tokens.rows()), a);
  const int outputs = (a.dscale ? 1 : 0) + (a.dshift ? 1 : 0);
  if (outputs > 0) {
    sum_over_tokens<AdaLnTokenBlockSums>("adaln_token_block_sums", a, outputs,
                                         a.dscale ? p.dscale : p.dshift, p.dshift, exec);
  }
  exec.template launch<AdaLnBackwardDx>(modulation_row_launch("adaln_backward_dx", a.tokens.rows()),
                                        a);
}

// The elementwise activation: one launch, a thread an element.
inline ActivationParams activation_params(const ConstTensorView& x, const TensorView& out,
                                          contract::Activation activation) {
  ActivationParams a;
  a.x = row_tensor(x);
  a.out = out_row_tensor(out);
  a.rows = detail::row_count(x);
  a.d = x.shape[x.rank - 1];
  a.activation = activation;
  return a;
}

template <class Executor>
void activation_forward(const detail::ActivationProblem& p, Executor& exec) {
  const ActivationParams a = activation_params(p.x, p.y, p.activation);
  exec.template launch<ActivationForward>(item_launch("activation_forward", a.rows * a.d), a);
}

template <class Executor>
void activation_backward(const detail::ActivationBackwardProblem& p, Executor& exec) {
  ActivationParams a = activation_params(p.x, p.dx, p.activation);
  a.dy = row_tensor(p.dy);
  exec.template launch<ActivationBackward>(item_launch("activation_backward", a.rows * a.d), a);
}

}  // namespace kernel_align::cuda::plan
