// adaln_modulation under the contract (docs/contract.md section 12). The reference runs
// its rows and its sums over each sample's tokens in order (adaln.cpp); the CPU backend's
// vector rows share the sums' partition and stores from here (reference/token_sums.hpp).
#pragma once

#include <cstdint>

#include "api/problems.hpp"
#include "reference/token_sums.hpp"

namespace kernel_align::reference {

// The sums over each sample's tokens that the call asks for (dscale, then dshift: the
// outputs of TokenSums in that order), and the store of a sample's sum i of output
// `output`.
TokenSums adaln_token_sums_of(const detail::AdaLnBackwardProblem& p);
void adaln_store_token_sum(const detail::AdaLnBackwardProblem& p, std::int64_t b, int output, int i,
                           float total);

void adaln_forward(const detail::AdaLnProblem& p);
void adaln_backward(const detail::AdaLnBackwardProblem& p);

}  // namespace kernel_align::reference
