// The CPU backend's kernels, one table per instruction-set path. A kernel computes
// a contiguous range of rows of a validated problem; the driver (cpu_backend.cpp)
// splits rows across threads. Every kernel produces the reference's bytes.
//
// Rows of a view are its leading indices in row-major order (for a 4-D rope or fused
// view: (b, s, h) in BSHD, (b, h, s) in BHSD).
#pragma once

#include <cstdint>

#include "api/problems.hpp"
#include "cpu/isa/row_plan.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cpu {

struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

struct Kernels {
  void (*rmsnorm_forward)(const detail::RmsNormForwardProblem& p, RowRange rows);
  // dx of the rows; when dw_partial is non-null, also adds mul(dy_i, n_i) of each row,
  // rows in order, into dw_partial[0..d) (the contract's block sums).
  void (*rmsnorm_backward)(const detail::RmsNormBackwardProblem& p, RowRange rows,
                           float* dw_partial);
  void (*rope)(const detail::RopeProblem& p, RowRange rows);
  void (*norm_rope_forward)(const detail::NormRopeForwardProblem& p, RowRange rows);
  void (*norm_rope_backward)(const detail::NormRopeBackwardProblem& p, RowRange rows,
                             float* dw_partial);
};

// The kernels of path `isa`, which must be supported by this CPU and build.
const Kernels& kernels(Isa isa);

// A validated problem as plain data for the row kernels (kernels.cpp).
RowPlan plan_of(const detail::RmsNormForwardProblem& p);
RowPlan plan_of(const detail::RmsNormBackwardProblem& p);
RowPlan plan_of(const detail::RopeProblem& p);
RowPlan plan_of(const detail::NormRopeForwardProblem& p);
RowPlan plan_of(const detail::NormRopeBackwardProblem& p);

// The Kernels of one path: each entry builds the plan and runs the path's row kernel.
// kernels.cpp makes one per path; a test makes one for avx512.cpp compiled on SIMDe.
template <const RowKernels& kRows>
constexpr Kernels kernels_over() {
  return {
      [](const detail::RmsNormForwardProblem& p, RowRange rows) {
        kRows.rmsnorm_forward(plan_of(p), rows.begin, rows.end, nullptr);
      },
      [](const detail::RmsNormBackwardProblem& p, RowRange rows, float* dw_partial) {
        kRows.rmsnorm_backward(plan_of(p), rows.begin, rows.end, dw_partial);
      },
      [](const detail::RopeProblem& p, RowRange rows) {
        kRows.rope(plan_of(p), rows.begin, rows.end, nullptr);
      },
      [](const detail::NormRopeForwardProblem& p, RowRange rows) {
        kRows.norm_rope_forward(plan_of(p), rows.begin, rows.end, nullptr);
      },
      [](const detail::NormRopeBackwardProblem& p, RowRange rows, float* dw_partial) {
        kRows.norm_rope_backward(plan_of(p), rows.begin, rows.end, dw_partial);
      },
  };
}

}  // namespace kernel_align::cpu
