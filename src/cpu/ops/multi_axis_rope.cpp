// multi_axis_rope on the CPU: the path's row kernel over the pool (the backward is the
// transposed rotation, the same kernel).
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

void multi_axis_rope(const detail::RopeProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rope, row_plan(p), detail::row_count(p.in), std::nullopt, exec);
}

}  // namespace

void add_multi_axis_rope_kernels(registry::Kernels& k) {
  k.set<OpType::MultiAxisRope, Direction::Forward>(multi_axis_rope);
  k.set<OpType::MultiAxisRope, Direction::Backward>(multi_axis_rope);
}

}  // namespace kernel_align::cpu
