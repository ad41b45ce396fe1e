// The elementwise activation under the contract (docs/contract.md section 14): rows
// [begin, end) of a call (the last dim a row), element by element. The reference runs
// every row in order, the CPU backend ranges of rows on its pool: one code path.
#pragma once

#include <cstdint>

#include "api/problems.hpp"

namespace kernel_align::reference {

void activation_forward_rows(const detail::ActivationProblem& p, std::int64_t begin,
                             std::int64_t end);
void activation_backward_rows(const detail::ActivationBackwardProblem& p, std::int64_t begin,
                              std::int64_t end);

}  // namespace kernel_align::reference
