// adaln_modulation on the CPU: the path's vector rows over the pool, a sample's dscale and
// dshift by its token blocks.
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

// The backward: the path's vector rows, or, with dscale or dshift, by the sums' tasks (a
// sample's block of tokens each), whose rows write dx as they add their terms.
void adaln_backward(const detail::AdaLnBackwardProblem& p, registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).adaln_backward;
  const RowPlan plan = row_plan(p);
  const reference::TokenSums sums = reference::adaln_token_sums_of(p);
  if (sums.outputs == 0) {
    for_rows(p.batch * p.seq, p.dim, exec,
             [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
    return;
  }
  thread_local std::vector<float> scratch;  // the block sums, kept per calling thread
  // The task's parts are adjacent (token_sums.hpp): the kernel's dscale then dshift.
  reference::sum_over_tokens(
      sums, scratch, token_sum_tasks(exec, sums),
      [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
        kernel(plan, b * p.seq + begin, b * p.seq + end, parts[0]);
      },
      [&](std::int64_t b, int output, int i, float total) {
        reference::adaln_store_token_sum(p, b, output, i, total);
      });
}

}  // namespace

void add_adaln_modulation_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnModulation, Direction::Forward>(adaln_forward);
  k.set<OpType::AdaLnModulation, Direction::Backward>(adaln_backward);
}

}  // namespace kernel_align::cpu
