// The reference of the GEMM engine: docs/contract.md "Linear (GEMM)" applied literally,
// one output element at a time. Every other engine must produce its bytes.
#pragma once

#include "api/gemm_problem.hpp"

namespace kernel_align::reference {

void gemm(const detail::GemmProblem& p);

}  // namespace kernel_align::reference
