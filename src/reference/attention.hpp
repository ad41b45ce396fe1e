// The reference of joint attention: docs/contract.md "Joint attention" applied literally,
// one output element at a time (O(n^2 D) per head and element: for tests). Every other
// engine must produce its bytes.
#pragma once

#include "api/attention_problem.hpp"

namespace kernel_align::reference {

void attention_forward(const detail::AttentionProblem& p);
void attention_backward(const detail::AttentionBackwardProblem& p);

}  // namespace kernel_align::reference
