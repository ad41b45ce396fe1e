// qk_norm_rope on the CPU: each stream (q text, q image, k text, k image) a pass of the
// path's fused row kernel over the pool.
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

void qk_norm_rope_forward(const detail::QkNormRopeForwardProblem& p, registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).norm_rope_forward;
  for (const detail::NormRopeForwardProblem& s : p.streams) {
    run_rows(kernel, row_plan(s), detail::row_count(s.x), std::nullopt, exec);
  }
}

void qk_norm_rope_backward(const detail::QkNormRopeBackwardProblem& p, registry::Execution& exec) {
  const RowKernel kernel = path_kernels(exec).norm_rope_backward;
  for (const detail::NormRopeBackwardProblem& s : p.streams) {
    run_rows(kernel, row_plan(s), detail::row_count(s.x), s.dw, exec);
  }
  detail::zero_empty_stream_grads_on_host(p);
}

}  // namespace

void add_qk_norm_rope_kernels(registry::Kernels& k) {
  k.set<OpType::QkNormRope, Direction::Forward>(qk_norm_rope_forward);
  k.set<OpType::QkNormRope, Direction::Backward>(qk_norm_rope_backward);
}

}  // namespace kernel_align::cpu
