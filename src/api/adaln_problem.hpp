// LayerNorm with AdaLN modulation as its backends compute it (docs/contract.md, "LayerNorm
// with AdaLN modulation"): x and y as [B, S, D] element strides, scale and shift as
// [B, D] (a sequence stride of 0: the sample's row is shared by its tokens).
#pragma once

#include <array>
#include <cstdint>

#include "kernel_align/dtype.hpp"
#include "kernel_align/options.hpp"

namespace kernel_align::detail {

// Element (b, s, d) at data[b * strides[0] + s * strides[1] + d * strides[2]].
template <class Pointer>
struct Strided3 {
  Pointer data;
  DType dtype;
  std::array<std::int64_t, 3> strides;
  std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t d) const {
    return b * strides[0] + s * strides[1] + d * strides[2];
  }
};
using AdaLnInput = Strided3<const void*>;
using AdaLnOutput = Strided3<void*>;

struct AdaLnProblem {
  std::int64_t batch, seq;
  int dim;
  float eps;
  NormMode mode;
  AdaLnInput x, scale, shift;
  AdaLnOutput y;
};

struct AdaLnBackwardProblem {
  std::int64_t batch, seq;
  int dim;
  float eps;
  NormMode mode;
  AdaLnInput x, scale, dy;
  AdaLnOutput dx, dscale, dshift;  // dscale, dshift: [B, D] (sequence stride 0)
};

}  // namespace kernel_align::detail
