// adaln_modulation on the CPU: the forward's vector rows, the backward's contract rows
// (reference/adaln.hpp) over the pool, a sample's dscale and dshift by its token blocks.
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/adaln.hpp"

namespace kernel_align::cpu {
namespace {

// The forward: the path's vector rows (cpu/isa/row_kernels.hpp) over the pool.
void adaln_forward(const detail::AdaLnProblem& p, registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).adaln_forward;
  const RowPlan plan = row_plan(p);
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
}

// The backward runs the contract's row bodies (reference/adaln.hpp) on the pool on every
// path: no vector kernel of its own yet (docs/performance.md), so the path is noted as
// selected and changes no instruction of it.
void adaln_backward(const detail::AdaLnBackwardProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  thread_local std::vector<float> scratch;  // the block sums, kept per calling thread
  reference::adaln_token_sums(p, scratch, token_sum_tasks(exec, reference::adaln_token_sums_of(p)));
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { reference::adaln_backward_rows(p, r.begin, r.end); });
}

}  // namespace

void add_adaln_modulation_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnModulation, Direction::Forward>(adaln_forward);
  k.set<OpType::AdaLnModulation, Direction::Backward>(adaln_backward);
}

}  // namespace kernel_align::cpu
