// adaln_modulation under the contract (docs/contract.md section 12), as row bodies: the
// reference runs each over the whole problem in order, the CPU backend gives rows and
// token blocks to its threads (which changes no result: every body writes its own
// outputs, and the sums over tokens combine their blocks in block order).
#pragma once

#include <cstdint>
#include <vector>

#include "api/problems.hpp"

namespace kernel_align::reference {

// Rows [begin, end) of the B * S tokens (b = r / S, s = r % S) of y.
void adaln_forward_rows(const detail::AdaLnProblem& p, std::int64_t begin, std::int64_t end);

// The token blocks of the sums over a sample's tokens (dscale, dshift): contract::
// dw_block_count(S) blocks of kDwBlockRows consecutive tokens.
std::int64_t adaln_token_blocks(const detail::AdaLnBackwardProblem& p);

// Block `block` of sample b: sums of dy * n' and of dy over its tokens in token order from
// +0, into parts [D] each (the ones the call asks for).
void adaln_token_block_sums(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                            std::int64_t block, float* dscale_part, float* dshift_part);

// Sample b's dscale and dshift from its blocks' sums ([blocks][D] each), added in block
// order from +0.
void adaln_combine_blocks(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                          const float* dscale_parts, const float* dshift_parts);

// Rows [begin, end) of dx. Runs after every token block (dx may be x or dy).
void adaln_backward_rows(const detail::AdaLnBackwardProblem& p, std::int64_t begin,
                         std::int64_t end);

void adaln_forward(const detail::AdaLnProblem& p);
void adaln_backward(const detail::AdaLnBackwardProblem& p);

}  // namespace kernel_align::reference
