#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "api/float_env.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cpu {
namespace {

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

// The kernels of the selected path, noted in exec.
const Kernels& active(registry::Execution& exec) {
  const Isa path = isa();
  exec.isa = isa_name(path);
  return kernels(path);
}

}  // namespace

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p, registry::Execution& exec) {
  const Kernels& k = active(exec);
  for_rows(detail::row_count(p.x), p.d, exec, [&](RowRange r) { k.rmsnorm_forward(p, r); });
}

void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p, registry::Execution& exec) {
  const Kernels& k = active(exec);
  if (p.dw) {
    for_dw_blocks(detail::row_count(p.x), p.d, *p.dw, exec,
                  [&](RowRange r, float* partial) { k.rmsnorm_backward(p, r, partial); });
  } else {
    for_rows(detail::row_count(p.x), p.d, exec,
             [&](RowRange r) { k.rmsnorm_backward(p, r, nullptr); });
  }
}

void multi_axis_rope(const detail::RopeProblem& p, registry::Execution& exec) {
  const Kernels& k = active(exec);
  for_rows(detail::row_count(p.in), p.d, exec, [&](RowRange r) { k.rope(p, r); });
}

void qk_norm_rope_forward(const detail::QkNormRopeForwardProblem& p, registry::Execution& exec) {
  const Kernels& k = active(exec);
  for (const detail::NormRopeForwardProblem& s : p.streams) {
    for_rows(detail::row_count(s.x), s.d, exec, [&](RowRange r) { k.norm_rope_forward(s, r); });
  }
}

void qk_norm_rope_backward(const detail::QkNormRopeBackwardProblem& p, registry::Execution& exec) {
  const Kernels& k = active(exec);
  for (const detail::NormRopeBackwardProblem& s : p.streams) {
    if (s.dw) {
      for_dw_blocks(detail::row_count(s.x), s.d, *s.dw, exec,
                    [&](RowRange r, float* partial) { k.norm_rope_backward(s, r, partial); });
    } else {
      for_rows(detail::row_count(s.x), s.d, exec,
               [&](RowRange r) { k.norm_rope_backward(s, r, nullptr); });
    }
  }
  detail::zero_empty_stream_grads_on_host(p);
}

}  // namespace kernel_align::cpu
