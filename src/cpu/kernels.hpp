// The CPU backend's row kernels: the table of each instruction-set path, and the
// validated problems as the RowPlans those kernels read. An op's driver (cpu/ops/<op>.cpp)
// builds a call's plan once and splits its rows across threads. Every kernel produces
// the reference's bytes.
//
// Rows of a view are its leading indices in row-major order (for a 4-D rope or fused
// view: (b, s, h) in BSHD, (b, h, s) in BHSD).
#pragma once

#include "api/problems.hpp"
#include "cpu/isa/row_plan.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cpu {

// The row kernels of path `isa`, which must be supported by this CPU and build.
const RowKernels& row_kernels(Isa isa);

// A validated problem as plain data for the row kernels (row_plan.hpp says why plain
// data): one per problem kind, each naming which of its tensors and parameters fill
// the plan.
RowPlan row_plan(const detail::RmsNormForwardProblem& p);
RowPlan row_plan(const detail::RmsNormBackwardProblem& p);
RowPlan row_plan(const detail::RopeProblem& p);
RowPlan row_plan(const detail::NormRopeForwardProblem& p);
RowPlan row_plan(const detail::NormRopeBackwardProblem& p);
// The gated residual's rows: x, y (in dy's place) into out; the backward's dout (in x's
// place), y into dy (out).
RowPlan row_plan(const detail::GateResidualProblem& p);
RowPlan row_plan(const detail::AdaLnProblem& p);
RowPlan row_plan(const detail::AdaLnBackwardProblem& p);
RowPlan row_plan(const detail::GateResidualBackwardProblem& p);

}  // namespace kernel_align::cpu
