// The CPU backend: the kernels of the selected instruction-set path, rows split
// across the thread pool. Every row is computed whole by one thread, and the dw
// sums follow the contract's fixed block partition, so no result depends on the
// thread count or the path.
#pragma once

#include "api/problems.hpp"
#include "registry/registry.hpp"

namespace kernel_align::cpu {

// Each records the path, thread count and row partition it used in `exec`.
void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p, registry::Execution& exec);
void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p, registry::Execution& exec);
void multi_axis_rope(const detail::RopeProblem& p, registry::Execution& exec);
void qk_norm_rope_forward(const detail::QkNormRopeForwardProblem& p, registry::Execution& exec);
void qk_norm_rope_backward(const detail::QkNormRopeBackwardProblem& p, registry::Execution& exec);
void linear_forward(const detail::GemmProblem& p, registry::Execution& exec);
void linear_backward(const detail::LinearBackwardProblem& p, registry::Execution& exec);
void attention_forward(const detail::AttentionProblem& p, registry::Execution& exec);
void attention_backward(const detail::AttentionBackwardProblem& p, registry::Execution& exec);
void adaln_forward(const detail::AdaLnProblem& p, registry::Execution& exec);
void adaln_backward(const detail::AdaLnBackwardProblem& p, registry::Execution& exec);

// The backend's kernels, keyed by (op, direction), as the registry holds them.
registry::Kernels simd_kernels();

}  // namespace kernel_align::cpu
