// adaln_modulation under the contract (docs/contract.md section 12), as row bodies: the
// reference runs each over the whole problem in order, the CPU backend gives rows and
// token blocks to its threads (which changes no result: every body writes its own
// outputs, and the sums over tokens combine their blocks in block order).
#pragma once

#include <cstdint>
#include <vector>

#include "api/problems.hpp"
#include "reference/token_sums.hpp"

namespace kernel_align::reference {

// Rows [begin, end) of the B * S tokens (b = r / S, s = r % S) of y.
void adaln_forward_rows(const detail::AdaLnProblem& p, std::int64_t begin, std::int64_t end);

// The sums over each sample's tokens that the call asks for (dscale, then dshift: the
// outputs of TokenSums in that order). A block's sums of dy * n' and of dy over its tokens
// (token_sums.hpp's block_sum), and the store of a sample's sum.
TokenSums adaln_token_sums_of(const detail::AdaLnBackwardProblem& p);
void adaln_token_block_sum(const detail::AdaLnBackwardProblem& p, std::int64_t b,
                           std::int64_t begin, std::int64_t end, float* const* parts);
void adaln_store_token_sum(const detail::AdaLnBackwardProblem& p, std::int64_t b, int output, int i,
                           float total);

// dscale and dshift (those the call asks for; nothing without either), the tasks run by
// run_tasks (token_sums.hpp).
template <class RunTasks>
void adaln_token_sums(const detail::AdaLnBackwardProblem& p, std::vector<float>& scratch,
                      const RunTasks& run_tasks) {
  const TokenSums sums = adaln_token_sums_of(p);
  if (sums.outputs == 0) return;
  sum_over_tokens(
      sums, scratch, run_tasks,
      [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
        adaln_token_block_sum(p, b, begin, end, parts);
      },
      [&](std::int64_t b, int output, int i, float total) {
        adaln_store_token_sum(p, b, output, i, total);
      });
}

// Rows [begin, end) of dx. Runs after every token block (dx may be x or dy).
void adaln_backward_rows(const detail::AdaLnBackwardProblem& p, std::int64_t begin,
                         std::int64_t end);

void adaln_forward(const detail::AdaLnProblem& p);
void adaln_backward(const detail::AdaLnBackwardProblem& p);

}  // namespace kernel_align::reference
