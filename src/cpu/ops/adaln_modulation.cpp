// adaln_modulation on the CPU: the path's vector rows over the pool, a sample's dscale and
// dshift by its token blocks.
#include <cstdint>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/adaln.hpp"

namespace kernel_align::cpu {
namespace {

// The path's adaln kernels (cpu/isa/row_kernels.hpp) over the pool; with dscale or
// dshift, by their sums' tasks, whose rows write dx as they add their terms
// (run_token_rows; the task's parts are adjacent: the kernel's dscale, then dshift).
void adaln_forward(const detail::AdaLnProblem& p, registry::Execution& exec) {
  run_token_rows(path_kernels(exec).adaln_forward, row_plan(p), exec);
}

void adaln_backward(const detail::AdaLnBackwardProblem& p, registry::Execution& exec) {
  run_token_rows(path_kernels(exec).adaln_backward, row_plan(p), reference::adaln_token_sums_of(p),
                 exec, [&](std::int64_t b, int output, int i, float total) {
                   reference::adaln_store_token_sum(p, b, output, i, total);
                 });
}

}  // namespace

void add_adaln_modulation_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnModulation, Direction::Forward>(adaln_forward);
  k.set<OpType::AdaLnModulation, Direction::Backward>(adaln_backward);
}

}  // namespace kernel_align::cpu
