// The CPU backend: the kernels of the selected instruction-set path, rows split
// across the thread pool. Every row is computed whole by one thread, and the dw
// sums follow the contract's fixed block partition, so no result depends on the
// thread count or the path.
#pragma once

#include "api/problems.hpp"

namespace kernel_align::cpu {

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p);
void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p);
void multi_axis_rope(const detail::RopeProblem& p);
void qk_norm_rope_forward(const detail::QkNormRopeForwardProblem& p);
void qk_norm_rope_backward(const detail::QkNormRopeBackwardProblem& p);

}  // namespace kernel_align::cpu
