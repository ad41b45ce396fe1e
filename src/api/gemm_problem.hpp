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

// An output matrix of linear_backward: element (i, j) at data + i * row_stride + j *
// col_stride.
struct GemmOutput {
  void* data;
  DType dtype;
  std::int64_t row_stride;
  std::int64_t col_stride;
};

// linear_backward as validated: x [m, k], w [n, k], dy [m, n] as matrices (any strides),
// and the outputs asked for. Every backend runs it as GEMMs (linear_backward_gemms).
struct LinearBackwardProblem {
  std::int64_t m, n, k;
  GemmMatrix x;                    // m x k
  GemmMatrix w;                    // n x k
  std::optional<GemmMatrix> bias;  // 1 x n: recomputes the pre-activation value
  GemmMatrix dy;                   // m x n
  contract::Activation activation;
  std::optional<GemmOutput> dx;  // m x k
  std::optional<GemmOutput> dw;  // n x k
  std::optional<GemmOutput> db;  // n x 1
};

// The GEMMs of linear_backward, in order, for a backend to run with its engine:
// - dz (only with an activation): the forward's product x w^T with the activation's
//   backward of dy as its epilogue (GemmProblem::grad_out), into `dz_scratch`, fp32
//   [m, n] row-major, which the caller provides; without an activation dz is dy itself;
// - dx = dz w (the sum over n), dw = dz^T x (over m), db = dz^T 1 (over m: fma(dz, 1,
//   acc) is add(acc, dz) exactly), each by the linear tree of its reduction length.
// `one` points to a 1.0f the engine can read (host or device memory, as its tensors).
template <class RunGemm>
void linear_backward_gemms(const LinearBackwardProblem& p, float* dz_scratch, const float* one,
                           const RunGemm& run_gemm) {
  GemmMatrix dz = p.dy;
  if (p.activation != contract::Activation::None) {
    run_gemm(GemmProblem{p.m, p.n, p.k, p.x,
                         GemmMatrix{p.w.data, p.w.dtype, p.w.col_stride, p.w.row_stride}, p.bias,
                         p.activation, p.dy, dz_scratch, DType::F32, p.n, 1});
    dz = GemmMatrix{dz_scratch, DType::F32, p.n, 1};
  }
  const GemmMatrix dz_transposed{dz.data, dz.dtype, dz.col_stride, dz.row_stride};
  const auto none = contract::Activation::None;
  if (p.dx) {
    run_gemm(GemmProblem{p.m, p.k, p.n, dz, p.w, std::nullopt, none, std::nullopt, p.dx->data,
                         p.dx->dtype, p.dx->row_stride, p.dx->col_stride});
  }
  if (p.dw) {
    run_gemm(GemmProblem{p.n, p.k, p.m, dz_transposed, p.x, std::nullopt, none, std::nullopt,
                         p.dw->data, p.dw->dtype, p.dw->row_stride, p.dw->col_stride});
  }
  if (p.db) {
    run_gemm(GemmProblem{p.n, 1, p.m, dz_transposed, GemmMatrix{one, DType::F32, 0, 0},
                         std::nullopt, none, std::nullopt, p.db->data, p.db->dtype,
                         p.db->row_stride, 0});
  }
}

}  // namespace kernel_align::detail
