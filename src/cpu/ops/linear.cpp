// linear on the CPU: the GEMM engine (cpu/gemm/) of the selected path; the backward's
// dx, dw and db are GEMMs of the same engine (reference::linear_backward maps them).
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/gemm.hpp"

namespace kernel_align::cpu {
namespace {

// One GEMM on the engine of the selected path (gemm_isa: Avx2 needs FMA), noted in exec
// as one pass over the rows of C.
void run_gemm(const detail::GemmProblem& p, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  const int threads = num_threads();
  exec.threads = std::max(exec.threads, threads);
  if (exec.traced) exec.partition.push_back({{0, p.m}});
  gemm(p, threads, path);
}

void linear_forward(const detail::GemmProblem& p, registry::Execution& exec) {
  run_gemm(p, exec);
}

void linear_backward(const detail::LinearBackwardProblem& p, registry::Execution& exec) {
  reference::linear_backward(p, [&](const detail::GemmProblem& g) { run_gemm(g, exec); });
}

}  // namespace

void add_linear_kernels(registry::Kernels& k) {
  k.set<OpType::Linear, Direction::Forward>(linear_forward);
  k.set<OpType::Linear, Direction::Backward>(linear_backward);
}

}  // namespace kernel_align::cpu
