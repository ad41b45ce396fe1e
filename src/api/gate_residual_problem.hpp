// The gated residual as its backends compute it (docs/contract.md, "Gated residual"):
// x, y, out and the gradients as [B, S, D] element strides, the gate and dgate as [B, D]
// (a sequence stride of 0: the sample's row is shared by its tokens).
#pragma once

#include <cstdint>

#include "api/adaln_problem.hpp"  // Strided3
#include "kernel_align/options.hpp"

namespace kernel_align::detail {

struct GateResidualProblem {
  std::int64_t batch, seq;
  int dim;
  NormMode mode;
  AdaLnInput x, gate, y;
  AdaLnOutput out;
};

struct GateResidualBackwardProblem {
  std::int64_t batch, seq;
  int dim;
  NormMode mode;
  AdaLnInput gate, y, dout;
  AdaLnOutput dy, dgate;  // dgate: [B, D] (sequence stride 0); absent: data null
};

}  // namespace kernel_align::detail
