// The CPU backend's parallel passes, shared by its ops' files (cpu/ops/<op>.cpp): rows
// split across the thread pool, one contiguous range per thread, or the contract's dw
// blocks (a task each, their sums added in block order). Every row is computed whole by
// one thread, so no result depends on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "api/float_env.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/runtime.hpp"
#include "reference/token_sums.hpp"
#include "registry/registry.hpp"

namespace kernel_align::cpu {

// Rows [begin, end) of a call.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// Below this many elements a call runs on the calling thread: waking workers would
// cost more than the work.
inline constexpr std::int64_t kMinElementsPerThread = 16384;

inline int threads_for(std::int64_t rows, int d) {
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

// run_tasks of reference::sum_over_tokens on the pool: the tasks of `sums` (a sample's
// block of tokens each), noted in exec as one pass whose ranges are the tasks' rows.
inline auto token_sum_tasks(registry::Execution& exec, const reference::TokenSums& sums) {
  return [&exec, sums](std::int64_t tasks, const auto& task) {
    const int threads = static_cast<int>(
        std::min<std::int64_t>(threads_for(sums.batch * sums.seq, sums.dim), tasks));
    record_pass(exec, threads, tasks, [&](std::int64_t t) {
      const std::int64_t first_row = sums.sample(t) * sums.seq;
      return RowRange{first_row + sums.begin(t), first_row + sums.end(t)};
    });
    ThreadPool::instance().run(threads, tasks, [&](std::int64_t t) {
      const detail::ContractFloatEnvironment env;
      task(t);
    });
  };
}

// Runs `kernel` over a modulation call's [B, S, D] token rows (rows b * S + s, the plan's
// leading extents) in ranges, one per thread.
inline void run_token_rows(RowKernel kernel, const RowPlan& plan, registry::Execution& exec) {
  for_rows(plan.extents[1] * plan.extents[2], plan.d, exec,
           [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
}

// The same where the call may sum over each sample's tokens: as above when it sums
// nothing (sums.outputs == 0), otherwise by the sums' tasks (a sample's block of tokens each),
// whose rows the kernel computes while it adds their terms into the task's adjacent parts (its
// dw_partial), and then store(b, output, i, total) writes each sample's sums
// (reference::sum_over_tokens).
template <class Store>
void run_token_rows(RowKernel kernel, const RowPlan& plan, const reference::TokenSums& sums,
                    registry::Execution& exec, const Store& store) {
  if (sums.outputs == 0) {
    run_token_rows(kernel, plan, exec);
    return;
  }
  thread_local std::vector<float> scratch;  // the block sums, kept per calling thread
  reference::sum_over_tokens(
      sums, scratch, token_sum_tasks(exec, sums),
      [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
        kernel(plan, b * sums.seq + begin, b * sums.seq + end, parts[0]);
      },
      store);
}

// The selected path's row kernels, noted in exec.
inline const RowKernels& path_kernels(registry::Execution& exec) {
  const Isa path = isa();
  exec.isa = isa_name(path);
  return row_kernels(path);
}

// Runs `kernel` over the rows of `plan`: in ranges, one per thread, or by the contract's
// dw blocks when the call computes a dw. The plan is built once per call (per stream
// of a fused call) and read by every thread.
inline void run_rows(RowKernel kernel, const RowPlan& plan, std::int64_t rows,
                     const std::optional<TensorView>& dw, registry::Execution& exec) {
  if (dw) {
    for_dw_blocks(rows, plan.d, *dw, exec,
                  [&](RowRange r, float* partial) { kernel(plan, r.begin, r.end, partial); });
  } else {
    for_rows(rows, plan.d, exec, [&](RowRange r) { kernel(plan, r.begin, r.end, nullptr); });
  }
}

}  // namespace kernel_align::cpu
