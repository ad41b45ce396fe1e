// Joint attention on the CPU: the attention engine (cpu/attention.hpp) of the selected
// path, over the pool.
#include <optional>

#include "cpu/attention.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

void attention_forward_kernel(const detail::AttentionProblem& p, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  exec.threads = num_threads();
  cpu::attention_forward(p, exec.threads, path);
}

void attention_backward_kernel(const detail::AttentionBackwardProblem& p,
                               registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  exec.threads = num_threads();
  cpu::attention_backward(p, exec.threads, path);
}

}  // namespace

void add_attention_kernels(registry::Kernels& k) {
  k.set<OpType::Attention, Direction::Forward>(attention_forward_kernel);
  k.set<OpType::Attention, Direction::Backward>(attention_backward_kernel);
}

}  // namespace kernel_align::cpu
