// Flow-GRPO's SDE step and its log-probability under the contract (docs/contract.md
// section 15), applied literally: every element through the contract's scalar functions,
// each sample's squared distances through contract::FlowSdeSquares in row-major order.
// (The CPU backend runs its own vector rows, cpu/gemm/flow_sde_simd.hpp.)
#include <cstdint>

#include "api/problems.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/flow_sde.hpp"
#include "reference/kernels.hpp"
#include "reference/view_rows.hpp"

namespace kernel_align::reference {
namespace {

// The rows of one sample of a view whose dim 0 is the sample.
std::int64_t rows_per_sample(const ConstTensorView& v) {
  return detail::row_count(v) / v.shape[0];
}

std::int64_t elements_per_sample(const ConstTensorView& v) {
  return rows_per_sample(v) * v.shape[v.rank - 1];
}

void flow_sde_step_rows(const detail::FlowSdeStepProblem& p, std::int64_t begin, std::int64_t end) {
  const Rows x(p.x), v(p.v), noise(p.noise), prev{ConstTensorView(p.prev)};
  const FlowSdeCoefficients& c = p.constants;
  for (std::int64_t r = begin; r < end; ++r) {
    for (std::int64_t i = 0; i < x.d(); ++i) {
      const float mean = contract::flow_sde_mean(x.load(r, i), v.load(r, i), c.x_scale, c.v_scale);
      store(p.prev, prev, r, i, contract::flow_sde_prev(mean, noise.load(r, i), c.noise_scale));
    }
  }
}

void flow_sde_step_backward_rows(const detail::FlowSdeStepBackwardProblem& p, std::int64_t begin,
                                 std::int64_t end) {
  const Rows dprev(p.dprev);
  const FlowSdeCoefficients& c = p.constants;
  const bool has_dx = p.dx.data != nullptr, has_dv = p.dv.data != nullptr;
  const Rows dx_rows{has_dx ? ConstTensorView(p.dx) : p.dprev};
  const Rows dv_rows{has_dv ? ConstTensorView(p.dv) : p.dprev};
  for (std::int64_t r = begin; r < end; ++r) {
    for (std::int64_t i = 0; i < dprev.d(); ++i) {
      const float g = dprev.load(r, i);
      if (has_dx) store(p.dx, dx_rows, r, i, contract::mul(g, c.x_scale));
      if (has_dv) store(p.dv, dv_rows, r, i, contract::mul(g, c.v_scale));
    }
  }
}

void flow_sde_logp_samples(const detail::FlowSdeLogpProblem& p, std::int64_t begin,
                           std::int64_t end) {
  const Rows x(p.x), v(p.v), prev(p.prev);
  const FlowSdeCoefficients& c = p.constants;
  const std::int64_t rows = rows_per_sample(p.x);
  const std::int64_t n = elements_per_sample(p.x);
  for (std::int64_t b = begin; b < end; ++b) {
    contract::FlowSdeSquares squares(n);
    for (std::int64_t r = b * rows; r < (b + 1) * rows; ++r) {
      for (std::int64_t i = 0; i < x.d(); ++i) {
        const float mean =
            contract::flow_sde_mean(x.load(r, i), v.load(r, i), c.x_scale, c.v_scale);
        squares.push(contract::sub(prev.load(r, i), mean));
      }
    }
    contract::store_output(DType::F32, p.logp.data, b * p.logp.strides[0],
                           contract::flow_sde_logp(squares.result(), static_cast<float>(n),
                                                   c.inverse_two_variance, c.log_normalizer));
  }
}

void flow_sde_logp_backward_samples(const detail::FlowSdeLogpBackwardProblem& p, std::int64_t begin,
                                    std::int64_t end) {
  const Rows x(p.x), v(p.v), prev(p.prev);
  const bool has_dx = p.dx.data != nullptr, has_dv = p.dv.data != nullptr;
  const Rows dx_rows{has_dx ? ConstTensorView(p.dx) : p.x};
  const Rows dv_rows{has_dv ? ConstTensorView(p.dv) : p.x};
  const FlowSdeCoefficients& c = p.constants;
  const std::int64_t rows = rows_per_sample(p.x);
  const auto count = static_cast<float>(elements_per_sample(p.x));
  const auto* dlogp = static_cast<const float*>(p.dlogp.data);
  for (std::int64_t b = begin; b < end; ++b) {
    const float g = contract::flow_sde_logp_grad_scale(dlogp[b * p.dlogp.strides[0]], count,
                                                       c.inverse_two_variance);
    for (std::int64_t r = b * rows; r < (b + 1) * rows; ++r) {
      for (std::int64_t i = 0; i < x.d(); ++i) {
        const float mean =
            contract::flow_sde_mean(x.load(r, i), v.load(r, i), c.x_scale, c.v_scale);
        const float dmean = contract::mul(g, contract::sub(prev.load(r, i), mean));
        if (has_dx) store(p.dx, dx_rows, r, i, contract::mul(dmean, c.x_scale));
        if (has_dv) store(p.dv, dv_rows, r, i, contract::mul(dmean, c.v_scale));
      }
    }
  }
}

}  // namespace

void add_flow_sde_step_kernels(registry::Kernels& k) {
  k.set<OpType::FlowSdeStep, Direction::Forward>(
      [](const detail::FlowSdeStepProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.x);
        record_scalar(exec, {rows});
        flow_sde_step_rows(p, 0, rows);
      });
  k.set<OpType::FlowSdeStep, Direction::Backward>(
      [](const detail::FlowSdeStepBackwardProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.dprev);
        record_scalar(exec, {rows});
        flow_sde_step_backward_rows(p, 0, rows);
      });
}

void add_flow_sde_logp_kernels(registry::Kernels& k) {
  k.set<OpType::FlowSdeLogp, Direction::Forward>(
      [](const detail::FlowSdeLogpProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.x.shape[0]});
        flow_sde_logp_samples(p, 0, p.x.shape[0]);
      });
  k.set<OpType::FlowSdeLogp, Direction::Backward>(
      [](const detail::FlowSdeLogpBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.x.shape[0]});
        flow_sde_logp_backward_samples(p, 0, p.x.shape[0]);
      });
}

}  // namespace kernel_align::reference
