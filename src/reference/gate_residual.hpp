// adaln_gate_residual under the contract (docs/contract.md section 13), as row bodies:
// the reference runs each over the whole problem in order, the CPU backend gives rows and
// token blocks to its threads (which changes no result: every body writes its own
// outputs, and dgate combines its blocks in block order).
#pragma once

#include <cstdint>
#include <vector>

#include "api/problems.hpp"
#include "reference/token_sums.hpp"

namespace kernel_align::reference {

// Rows [begin, end) of the B * S tokens (b = r / S, s = r % S) of out.
void gate_residual_forward_rows(const detail::GateResidualProblem& p, std::int64_t begin,
                                std::int64_t end);

// dgate's sums over each sample's tokens (none when the call does not ask for dgate): a
// block's sums of dout * y (token_sums.hpp's block_sum), and the store of a sample's sum.
TokenSums gate_token_sums_of(const detail::GateResidualBackwardProblem& p);
void gate_token_block_sum(const detail::GateResidualBackwardProblem& p, std::int64_t b,
                          std::int64_t begin, std::int64_t end, float* const* parts);
void gate_store_token_sum(const detail::GateResidualBackwardProblem& p, std::int64_t b, int i,
                          float total);

// dgate where the call asks for it, the tasks run by run_tasks (token_sums.hpp).
template <class RunTasks>
void gate_token_sums(const detail::GateResidualBackwardProblem& p, std::vector<float>& scratch,
                     const RunTasks& run_tasks) {
  const TokenSums sums = gate_token_sums_of(p);
  if (sums.outputs == 0) return;
  sum_over_tokens(
      sums, scratch, run_tasks,
      [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
        gate_token_block_sum(p, b, begin, end, parts);
      },
      [&](std::int64_t b, int, int i, float total) { gate_store_token_sum(p, b, i, total); });
}

// Rows [begin, end) of dy. Runs after every token block (dy may be dout or y).
void gate_residual_backward_rows(const detail::GateResidualBackwardProblem& p, std::int64_t begin,
                                 std::int64_t end);

void gate_residual_forward(const detail::GateResidualProblem& p);
void gate_residual_backward(const detail::GateResidualBackwardProblem& p);

}  // namespace kernel_align::reference
