// qk_rmsnorm on the CPU: the path's row kernels over the pool, dw by the contract's blocks.
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rmsnorm_forward, row_plan(p), detail::row_count(p.x), std::nullopt,
           exec);
}

void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rmsnorm_backward, row_plan(p), detail::row_count(p.x), p.dw, exec);
}

}  // namespace

void add_qk_rmsnorm_kernels(registry::Kernels& k) {
  k.set<OpType::QkRmsNorm, Direction::Forward>(qk_rmsnorm_forward);
  k.set<OpType::QkRmsNorm, Direction::Backward>(qk_rmsnorm_backward);
}

}  // namespace kernel_align::cpu
