// adaln_gate_residual on the CPU: the path's vector rows over the pool, a sample's dgate
// by its token blocks.
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/gate_residual.hpp"

namespace kernel_align::cpu {
namespace {

// The path's gate kernels (cpu/isa/row_kernels.hpp) over the pool: rows in ranges, or,
// with dgate, by the sums' tasks (a sample's block of tokens each), whose rows write dy
// as they add their dgate terms.
void gate_residual_forward(const detail::GateResidualProblem& p, registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).gate_residual_forward;
  const RowPlan plan = row_plan(p);
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
}

void gate_residual_backward(const detail::GateResidualBackwardProblem& p,
                            registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).gate_residual_backward;
  const RowPlan plan = row_plan(p);
  const reference::TokenSums sums = reference::gate_token_sums_of(p);
  if (sums.outputs == 0) {
    for_rows(p.batch * p.seq, p.dim, exec,
             [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
    return;
  }
  thread_local std::vector<float> scratch;  // the block sums, kept per calling thread
  reference::sum_over_tokens(
      sums, scratch, token_sum_tasks(exec, sums),
      [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
        kernel(plan, b * p.seq + begin, b * p.seq + end, parts[0]);
      },
      [&](std::int64_t b, int, int i, float total) {
        reference::gate_store_token_sum(p, b, i, total);
      });
}

}  // namespace

void add_adaln_gate_residual_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnGateResidual, Direction::Forward>(gate_residual_forward);
  k.set<OpType::AdaLnGateResidual, Direction::Backward>(gate_residual_backward);
}

}  // namespace kernel_align::cpu
