// adaln_gate_residual on the CPU: the contract's rows (reference/gate_residual.hpp) over
// the pool, a sample's dgate by its token blocks.
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/gate_residual.hpp"

namespace kernel_align::cpu {
namespace {

// It runs the contract's row bodies on the pool on every path: elementwise, no vector
// kernel of its own yet (docs/performance.md), so the path is noted as selected and
// changes no instruction of it.
void gate_residual_forward(const detail::GateResidualProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { reference::gate_residual_forward_rows(p, r.begin, r.end); });
}

void gate_residual_backward(const detail::GateResidualBackwardProblem& p,
                            registry::Execution& exec) {
  exec.isa = isa_name(isa());
  thread_local std::vector<float> scratch;  // the block sums, kept per calling thread
  reference::gate_token_sums(p, scratch, token_sum_tasks(exec, reference::gate_token_sums_of(p)));
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { reference::gate_residual_backward_rows(p, r.begin, r.end); });
}

}  // namespace

void add_adaln_gate_residual_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnGateResidual, Direction::Forward>(gate_residual_forward);
  k.set<OpType::AdaLnGateResidual, Direction::Backward>(gate_residual_backward);
}

}  // namespace kernel_align::cpu
