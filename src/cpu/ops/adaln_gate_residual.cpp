// adaln_gate_residual on the CPU: the path's vector rows over the pool, a sample's dgate
// by its token blocks.
#include <cstdint>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/gate_residual.hpp"

namespace kernel_align::cpu {
namespace {

// The path's gate kernels (cpu/isa/row_kernels.hpp) over the pool; with dgate, by its
// sums' tasks, whose rows write dy as they add their dgate terms (run_token_rows).
void gate_residual_forward(const detail::GateResidualProblem& p, registry::Execution& exec) {
  run_token_rows(path_kernels(exec).gate_residual_forward, row_plan(p), exec);
}

void gate_residual_backward(const detail::GateResidualBackwardProblem& p,
                            registry::Execution& exec) {
  run_token_rows(path_kernels(exec).gate_residual_backward, row_plan(p),
                 reference::gate_token_sums_of(p), exec,
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
