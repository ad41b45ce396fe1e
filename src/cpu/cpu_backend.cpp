#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "api/float_env.hpp"
#include "cpu/attention.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/runtime.hpp"
#include "reference/adaln.hpp"
#include "reference/gemm.hpp"

namespace kernel_align::cpu {
namespace {

// Rows [begin, end) of a call.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// Below this many elements a call runs on the calling thread: waking workers would
// cost more than the work.
constexpr std::int64_t kMinElementsPerThread = 16384;

int threads_for(std::int64_t rows, int d) {
  const std::int64_t by_size = std::max<std::int64_t>(1, rows * d / kMinElementsPerThread);
  return static_cast<int>(std::min<std::int64_t>(num_threads(), by_size));
}

// Notes a parallel pass in exec: the threads that ran it and, when the call is traced,
// the row range of each of its `tasks` (range_of(task)). Untraced calls allocate
// nothing here.
template <class RangeOf>
void record_pass(registry::Execution& exec, int threads, std::int64_t tasks,
                 const RangeOf& range_of) {
  exec.threads = std::max(exec.threads, threads);
  if (!exec.traced) return;
  auto& pass = exec.partition.emplace_back();
  for (std::int64_t t = 0; t < tasks; ++t) {
    const RowRange r = range_of(t);
    pass.emplace_back(r.begin, r.end);
  }
}

// Calls kernel(range) over [0, rows) in contiguous ranges, one per thread.
template <class Kernel>
void for_rows(std::int64_t rows, int d, registry::Execution& exec, const Kernel& kernel) {
  const int threads = threads_for(rows, d);
  const auto range = [rows, threads](std::int64_t t) {
    return RowRange{rows * t / threads, rows * (t + 1) / threads};
  };
  record_pass(exec, threads, threads, range);
  ThreadPool::instance().run(threads, threads, [&](std::int64_t t) {
    const detail::ContractFloatEnvironment env;  // pool threads too, whatever they inherited
    kernel(range(t));
  });
}

// The contract's dw: one block sum per contract::kDwBlockRows rows (each block a
// task of the pool), then the block sums added in block order. `kernel(range,
// partial)` adds each row's terms into partial[0..d) in row order. The
// blocks x d scratch is kept per thread.
template <class Kernel>
void for_dw_blocks(std::int64_t rows, int d, const TensorView& dw, registry::Execution& exec,
                   const Kernel& kernel) {
  const std::int64_t block_count = contract::dw_block_count(rows);
  thread_local std::vector<float> partials;
  partials.assign(static_cast<std::size_t>(block_count) * static_cast<std::size_t>(d), 0.0f);
  float* const base = partials.data();
  const int threads = static_cast<int>(std::min<std::int64_t>(threads_for(rows, d), block_count));
  const auto block = [rows](std::int64_t b) {
    return RowRange{contract::dw_block_begin(rows, b), contract::dw_block_end(rows, b)};
  };
  record_pass(exec, threads, block_count, block);
  ThreadPool::instance().run(threads, block_count, [&](std::int64_t b) {
    const detail::ContractFloatEnvironment env;
    kernel(block(b), base + b * d);
  });
  for (int i = 0; i < d; ++i) {
    float total = 0.0f;
    for (std::int64_t b = 0; b < block_count; ++b) total = contract::add(total, base[b * d + i]);
    contract::store_output(dw.dtype, dw.data, i * dw.strides[0], total);
  }
}

// The selected path's row kernels, noted in exec.
const RowKernels& path_kernels(registry::Execution& exec) {
  const Isa path = isa();
  exec.isa = isa_name(path);
  return row_kernels(path);
}

// Runs `kernel` over the rows of `plan`: in ranges, one per thread, or by the contract's
// dw blocks when the call computes a dw. The plan is built once per call (per stream
// of a fused call) and read by every thread.
void run_rows(RowKernel kernel, const RowPlan& plan, std::int64_t rows,
              const std::optional<TensorView>& dw, registry::Execution& exec) {
  if (dw) {
    for_dw_blocks(rows, plan.d, *dw, exec,
                  [&](RowRange r, float* partial) { kernel(plan, r.begin, r.end, partial); });
  } else {
    for_rows(rows, plan.d, exec, [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
  }
}

}  // namespace

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rmsnorm_forward, row_plan(p), detail::row_count(p.x), std::nullopt,
           exec);
}

void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rmsnorm_backward, row_plan(p), detail::row_count(p.x), p.dw, exec);
}

void multi_axis_rope(const detail::RopeProblem& p, registry::Execution& exec) {
  run_rows(path_kernels(exec).rope, row_plan(p), detail::row_count(p.in), std::nullopt, exec);
}

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

}  // namespace

void linear_forward(const detail::GemmProblem& p, registry::Execution& exec) {
  run_gemm(p, exec);
}

void linear_backward(const detail::LinearBackwardProblem& p, registry::Execution& exec) {
  reference::linear_backward(p, [&](const detail::GemmProblem& g) { run_gemm(g, exec); });
}

void attention_forward(const detail::AttentionProblem& p, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  exec.threads = num_threads();
  cpu::attention_forward(p, exec.threads, path);
}

void attention_backward(const detail::AttentionBackwardProblem& p, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  exec.threads = num_threads();
  cpu::attention_backward(p, exec.threads, path);
}

// adaln_modulation runs the contract's row bodies (reference/adaln.hpp) on the pool on
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

registry::Kernels simd_kernels() {
  registry::Kernels k;
  k.set<OpType::QkRmsNorm, Direction::Forward>(qk_rmsnorm_forward);
  k.set<OpType::QkRmsNorm, Direction::Backward>(qk_rmsnorm_backward);
  k.set<OpType::MultiAxisRope, Direction::Forward>(multi_axis_rope);
  k.set<OpType::MultiAxisRope, Direction::Backward>(multi_axis_rope);
  k.set<OpType::QkNormRope, Direction::Forward>(qk_norm_rope_forward);
  k.set<OpType::QkNormRope, Direction::Backward>(qk_norm_rope_backward);
  k.set<OpType::Linear, Direction::Forward>(linear_forward);
  k.set<OpType::Linear, Direction::Backward>(linear_backward);
  k.set<OpType::Attention, Direction::Forward>(attention_forward);
  k.set<OpType::Attention, Direction::Backward>(attention_backward);
  k.set<OpType::AdaLnModulation, Direction::Forward>(adaln_forward);
  k.set<OpType::AdaLnModulation, Direction::Backward>(adaln_backward);
  return k;
}

}  // namespace kernel_align::cpu
