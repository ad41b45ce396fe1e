// The reference backend: the contract applied literally, one element at a time,
// single-threaded. Every other backend must produce its bytes.
#pragma once

#include "api/problems.hpp"

namespace kernel_align::reference {

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p);
void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p);
void multi_axis_rope(const detail::RopeProblem& p);
// One stream of the fused op (problems.hpp), as the unfused ops in sequence.
void norm_rope_forward(const detail::NormRopeForwardProblem& p);
void norm_rope_backward(const detail::NormRopeBackwardProblem& p);

}  // namespace kernel_align::reference
