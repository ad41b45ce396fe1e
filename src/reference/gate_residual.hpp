// adaln_gate_residual under the contract (docs/contract.md section 13). The reference
// runs its rows and its sums over each sample's tokens in order (gate_residual.cpp); the
// CPU backend's vector rows share the sums' partition and store from here
// (reference/token_sums.hpp).
#pragma once

#include <cstdint>

#include "api/problems.hpp"
#include "reference/token_sums.hpp"

namespace kernel_align::reference {

// dgate's sums over each sample's tokens (none when the call does not ask for dgate), and
// the store of a sample's sum i.
TokenSums gate_token_sums_of(const detail::GateResidualBackwardProblem& p);
void gate_store_token_sum(const detail::GateResidualBackwardProblem& p, std::int64_t b, int i,
                          float total);

void gate_residual_forward(const detail::GateResidualProblem& p);
void gate_residual_backward(const detail::GateResidualBackwardProblem& p);

}  // namespace kernel_align::reference
