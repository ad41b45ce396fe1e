// The reference of the GEMM engine: docs/contract.md "Linear (GEMM)" applied literally,
// one output element at a time. Every other engine must produce its bytes.
#pragma once

#include <cstddef>
#include <vector>

#include "api/gemm_problem.hpp"

namespace kernel_align::reference {

void gemm(const detail::GemmProblem& p);

// linear_backward's GEMMs (detail::linear_backward_gemms) in host memory, each handed to
// `run_gemm` (an engine over host memory), with its dz scratch.
template <class RunGemm>
void linear_backward(const detail::LinearBackwardProblem& p, const RunGemm& run_gemm) {
  static constexpr float kOne = 1.0f;
  std::vector<float> dz;
  if (p.activation != contract::Activation::None) {
    dz.resize(static_cast<std::size_t>(p.m) * static_cast<std::size_t>(p.n));
  }
  detail::linear_backward_gemms(p, dz.data(), &kOne, run_gemm);
}

}  // namespace kernel_align::reference
