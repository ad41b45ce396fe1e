// Public entry points: validate, then run the chosen backend (runtime.hpp) under
// the contract's floating-point environment.
#include "kernel_align/ops.hpp"

#include "api/float_env.hpp"
#include "api/problems.hpp"
#include "cpu/cpu_backend.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/runtime.hpp"
#include "reference/reference.hpp"

namespace kernel_align {
namespace {

// Runs `cpu` or `reference` on the problem, whichever backend is selected.
template <class Problem, class Cpu, class Reference>
void run_backend(const Problem& problem, const Cpu& cpu, const Reference& reference) {
  const bool use_cpu = backend() == Backend::Cpu;
  const detail::ContractFloatEnvironment env;
  if (use_cpu) {
    cpu(problem);
  } else {
    reference(problem);
  }
}

}  // namespace

void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options) {
  run_backend(detail::make_rmsnorm_forward(x, weight, y, options), cpu::qk_rmsnorm_forward,
              reference::qk_rmsnorm_forward);
}

void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options) {
  run_backend(detail::make_rmsnorm_backward(x, dy, weight, dx, dw, options),
              cpu::qk_rmsnorm_backward, reference::qk_rmsnorm_backward);
}

void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options) {
  run_backend(detail::make_rope(x, cos, sin, y, options, false, "x", "y"), cpu::multi_axis_rope,
              reference::multi_axis_rope);
}

void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options) {
  run_backend(detail::make_rope(dy, cos, sin, dx, options, true, "dy", "dx"), cpu::multi_axis_rope,
              reference::multi_axis_rope);
}

void qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                          const QkNormWeights& weights, const ConstTensorView& cos,
                          const ConstTensorView& sin, const TensorView& q_out,
                          const TensorView& k_out, const QkNormRopeOptions& options) {
  run_backend(detail::make_qk_norm_rope_forward(q, k, weights, cos, sin, q_out, k_out, options),
              cpu::qk_norm_rope_forward, [](const detail::QkNormRopeForwardProblem& p) {
                for (const auto& stream : p.streams) reference::norm_rope_forward(stream);
              });
}

void qk_norm_rope_backward(const ConstTensorView& q, const ConstTensorView& k,
                           const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                           const QkNormWeights& weights, const ConstTensorView& cos,
                           const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
                           const QkNormWeightGrads& weight_grads,
                           const QkNormRopeOptions& options) {
  const auto problem = detail::make_qk_norm_rope_backward(q, k, dq_out, dk_out, weights, cos, sin,
                                                          dq, dk, weight_grads, options);
  run_backend(problem, cpu::qk_norm_rope_backward, [](const detail::QkNormRopeBackwardProblem& p) {
    for (const auto& stream : p.streams) reference::norm_rope_backward(stream);
  });
  for (const TensorView& dw : problem.empty_stream_grads) {
    for (std::int64_t i = 0; i < dw.shape[0]; ++i) {
      contract::store_output(dw.dtype, dw.data, i * dw.strides[0], 0.0f);
    }
  }
}

const char* pairing_name(Pairing p) {
  return p == Pairing::Half ? "half" : "interleaved";
}
const char* layout_name(Layout l) {
  return l == Layout::BSHD ? "bshd" : "bhsd";
}
const char* norm_mode_name(NormMode m) {
  return m == NormMode::Single ? "single" : "diffusers";
}

}  // namespace kernel_align
