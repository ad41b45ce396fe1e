// adaln_modulation on the CPU: the contract's rows (reference/adaln.hpp) over the pool, a
// sample's dscale and dshift by its token blocks.
#include <optional>

#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"
#include "reference/adaln.hpp"

namespace kernel_align::cpu {
namespace {

// It runs the contract's row bodies (reference/adaln.hpp) on the pool on
// every path: no vector kernel of its own yet (docs/performance.md), so the path is noted
// as selected and changes no instruction of it.
void adaln_forward(const detail::AdaLnProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { reference::adaln_forward_rows(p, r.begin, r.end); });
}

void adaln_backward(const detail::AdaLnBackwardProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  const bool scale = p.dscale.data != nullptr;
  const bool shift = p.dshift.data != nullptr;
  if (scale || shift) {
    // Every (sample, token block) a task, then each sample's blocks in block order.
    const std::int64_t blocks = reference::adaln_token_blocks(p);
    const std::int64_t tasks = p.batch * blocks;
    const auto size = static_cast<std::size_t>(tasks) * static_cast<std::size_t>(p.dim);
    // The caller's scratch, kept per thread; the tasks see it through these pointers (a
    // thread_local named in the tasks would be each worker's own).
    thread_local std::vector<float> dscale_scratch, dshift_scratch;
    dscale_scratch.assign(scale ? size : 0, 0.0f);
    dshift_scratch.assign(shift ? size : 0, 0.0f);
    float* const dscale_parts = scale ? dscale_scratch.data() : nullptr;
    float* const dshift_parts = shift ? dshift_scratch.data() : nullptr;
    const auto part = [&](float* parts, std::int64_t task) {
      return parts == nullptr ? nullptr : parts + task * p.dim;
    };
    const int threads =
        static_cast<int>(std::min<std::int64_t>(threads_for(p.batch * p.seq, p.dim), tasks));
    record_pass(exec, threads, tasks, [&](std::int64_t t) {
      const std::int64_t b = t / blocks;
      return RowRange{b * p.seq + contract::dw_block_begin(p.seq, t % blocks),
                      b * p.seq + contract::dw_block_end(p.seq, t % blocks)};
    });
    ThreadPool::instance().run(threads, tasks, [&](std::int64_t t) {
      const detail::ContractFloatEnvironment env;
      reference::adaln_token_block_sums(p, t / blocks, t % blocks, part(dscale_parts, t),
                                        part(dshift_parts, t));
    });
    for (std::int64_t b = 0; b < p.batch; ++b) {
      reference::adaln_combine_blocks(p, b, part(dscale_parts, b * blocks),
                                      part(dshift_parts, b * blocks));
    }
  }
  for_rows(p.batch * p.seq, p.dim, exec,
           [&](RowRange r) { reference::adaln_backward_rows(p, r.begin, r.end); });
}

}  // namespace

void add_adaln_modulation_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnModulation, Direction::Forward>(adaln_forward);
  k.set<OpType::AdaLnModulation, Direction::Backward>(adaln_backward);
}

}  // namespace kernel_align::cpu
