// The matrix product the GEMM engines compute (docs/contract.md, "Linear (GEMM)"):
// C[m, n] = round_out(act(S[m, n] + bias[n])), S = linear tree over r of A[m, r] B[r, n]
// (or the activation's backward there, below).
// Any element strides (>= 0), so that forward (x w^T), dx (dy w) and dw (dy^T x) are the
// same engine: forward maps as a = x (row_stride = x's row stride, col_stride 1) and
// b[r][n] = w[n][r] (row_stride 1, col_stride = w's row stride).
#pragma once

#include <cstdint>
#include <optional>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::detail {

// Element (i, j) at static_cast<const T*>(data)[i * row_stride + j * col_stride].
struct GemmMatrix {
  const void* data;
  DType dtype;
  std::int64_t row_stride;
  std::int64_t col_stride;
};

struct GemmProblem {
  std::int64_t m, n, r;
  GemmMatrix a;                    // m x r
  GemmMatrix b;                    // r x n
  std::optional<GemmMatrix> bias;  // 1 x n: element n at data + n * col_stride
  contract::Activation activation;
  // m x n. Absent: C = act(S + bias), the forward. Present: C = the activation's backward
  // of grad_out[m, n] at S + bias (contract::linear_activation_grad), the dz that
  // linear_backward feeds to its dx, dw and db products.
  std::optional<GemmMatrix> grad_out;
  void* c;  // m x n, never read
  DType c_dtype;
  std::int64_t c_row_stride, c_col_stride;
};

}  // namespace kernel_align::detail
