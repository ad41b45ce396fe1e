// An fp64 oracle for every op: the simplest formulas, written apart from the
// contract code, so that the fp32 contract can be judged against exact math.
//
// Each function takes the exact values of the stored inputs (widened to double)
// in row-major order and returns, per output element, the exact value and the
// bound the contract's result must stay within (docs/accuracy.md derives each).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernel_align/dtype.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align::oracle {

struct Expected {
  double value;  // exact result (fp64 stands in for the reals)
  double bound;  // |contract result - value| <= bound
};

// A stored result (widened exactly) satisfies `e`. NaN/Inf equal only themselves.
// An infinite bound makes no claim (an fp32 intermediate may overflow).
bool within(const Expected& e, double stored);

// `v` rounded to nearest-even in `t`: subnormals kept, overflow to Inf, NaN kept.
// Written apart from the contract's conversions, so tests can judge them.
double round_to(DType t, double v);

// x: [rows, d]; weight: [d] or empty.
std::vector<Expected> rmsnorm_forward(std::span<const double> x, int d,
                                      std::span<const double> weight, double eps, NormMode mode,
                                      DType weight_dtype, DType out_dtype);

struct RmsNormGradients {
  std::vector<Expected> dx;  // [rows, d]
  std::vector<Expected> dw;  // [d], empty without weight
};
RmsNormGradients rmsnorm_backward(std::span<const double> x, std::span<const double> dy, int d,
                                  std::span<const double> weight, double eps, NormMode mode,
                                  DType weight_dtype, DType dx_dtype, DType dw_dtype);

// x: [batch, seq, heads, d] (BSHD, row-major); cos, sin: [seq, d/2] (the fp32
// table values). transpose = backward.
std::vector<Expected> rope(std::span<const double> x, std::int64_t batch, std::int64_t seq,
                           std::int64_t heads, int d, std::span<const double> cos,
                           std::span<const double> sin, Pairing pairing, bool transpose,
                           DType out_dtype);

}  // namespace kernel_align::oracle
