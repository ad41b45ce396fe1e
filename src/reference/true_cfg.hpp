// true_cfg under the contract (docs/contract.md section 17): rows [begin, end) of a call
// (the last dim a row), each through contract/cfg.hpp's scalar functions. The reference
// runs every row in order, the CPU backend ranges of rows on its pool: one code path (a
// row's work is two short tree sums; no vector path is worth a second one).
#pragma once

#include <cstdint>

#include "api/problems.hpp"

namespace kernel_align::reference {

void true_cfg_forward_rows(const detail::TrueCfgProblem& p, std::int64_t begin, std::int64_t end);
void true_cfg_backward_rows(const detail::TrueCfgBackwardProblem& p, std::int64_t begin,
                            std::int64_t end);

}  // namespace kernel_align::reference
