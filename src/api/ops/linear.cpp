// linear (the GEMM of contract section 10): x [..., K], weight [N, K], bias [N]. Its validator
// (each argument checked and named, the call's tensors listed once for the aliasing rule) and its
// public functions (kernel_align/ops.hpp).
#include "api/ops/linear.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

namespace {

constexpr std::string_view kLinearRowsRank = "rank 1 to 4 ([..., K])";

// The public enum and the contract's name the same activations in the same order.
static_assert(static_cast<int>(Activation::GeluTanh) ==
                  static_cast<int>(contract::Activation::GeluTanh) &&
              static_cast<int>(Activation::Silu) == static_cast<int>(contract::Activation::Silu));

// A view of rank 1-4 as a matrix of rows (its leading dims, flattened) by its last dim:
// the leading dims must step by one row stride (a contiguous or row-sliced tensor).
GemmMatrix rows_matrix(const char* name, const ConstTensorView& v) {
  const int last = v.rank - 1;
  std::int64_t row_stride = 0;
  bool first = true;
  for (int i = last - 1; i >= 0; --i) {
    if (v.shape[i] == 1) continue;
    if (first) {
      row_stride = v.strides[i];
      first = false;
      continue;
    }
    // Dim i must step over everything the dims after it (down to the row) span. The
    // shapes' product is below 2^56 (check_view); the step may not be: overflow is a
    // mismatch.
    std::int64_t inner = 1;
    for (int j = i + 1; j < last; ++j) inner *= v.shape[j];
    std::int64_t step = 0;
    if (__builtin_mul_overflow(row_stride, inner, &step) || v.strides[i] != step) {
      throw Error(name,
                  "leading dims that flatten to one row stride (a contiguous or row-sliced "
                  "tensor)",
                  describe(v));
    }
  }
  return {v.data, v.dtype, row_stride, v.strides[last]};
}

// y (or dy): x's leading dims and N as its last dim.
void check_rows_of(const char* name, const ConstTensorView& v, const ConstTensorView& x,
                   std::int64_t n) {
  check_view(name, v, 1, kMaxRank, {kLinearRowsRank});
  bool same = v.rank == x.rank && v.shape[v.rank - 1] == n;
  for (int i = 0; same && i < v.rank - 1; ++i) same = v.shape[i] == x.shape[i];
  if (!same) {
    ConstTensorView expected = x;
    expected.shape[x.rank - 1] = n;
    throw Error(name, "shape " + shape_string(expected) + " (the leading dims of x, N)",
                "shape " + shape_string(v));
  }
}

// x, weight and bias of a linear call; returns N.
std::int64_t check_linear_inputs(const ConstTensorView& x, const ConstTensorView& weight,
                                 const std::optional<ConstTensorView>& bias) {
  check_view("x", x, 1, kMaxRank, {kLinearRowsRank});
  check_view("weight", weight, 2, 2, {"rank 2 ([N, K])"});
  const std::int64_t k = x.shape[x.rank - 1];
  if (weight.shape[1] != k) {
    throw Error("weight", "shape [N, " + std::to_string(k) + "] (K, the last dim of x)",
                "shape " + shape_string(weight));
  }
  const std::int64_t n = weight.shape[0];
  if (bias) {
    check_view("bias", *bias, 1, 1, {"rank 1 ([N])"});
    if (bias->shape[0] != n) {
      throw Error("bias", "length " + std::to_string(n) + " (N, the rows of weight)",
                  "length " + std::to_string(bias->shape[0]));
    }
  }
  return n;
}

GemmMatrix vector_matrix(const ConstTensorView& v) {
  return {v.data, v.dtype, 0, v.strides[0]};
}

CallRecord linear_record(Direction direction, const LinearOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::Linear, direction, output_dtype);
  add_option(record, choice("activation", activation_name(options.activation)));
  return record;
}

}  // namespace

Call<GemmProblem> linear_forward_call(const ConstTensorView& x, const ConstTensorView& weight,
                                      const std::optional<ConstTensorView>& bias,
                                      const TensorView& y, const LinearOptions& options) {
  const std::int64_t n = check_linear_inputs(x, weight, bias);
  check_rows_of("y", y, x, n);
  const GemmMatrix rows = rows_matrix("x", x);
  const GemmMatrix y_rows = rows_matrix("y", y);
  Call<GemmProblem> call{linear_record(Direction::Forward, options, y.dtype), {}};
  check_call(call.record, {x, weight, bias, y});
  GemmProblem& p = call.problem;
  p.m = row_count(x);
  p.n = n;
  p.r = x.shape[x.rank - 1];
  p.a = rows;
  // B[r][n] = w[n][r].
  p.b = {weight.data, weight.dtype, weight.strides[1], weight.strides[0]};
  if (bias) p.bias = vector_matrix(*bias);
  p.activation = static_cast<contract::Activation>(options.activation);
  p.c = y.data;
  p.c_dtype = y.dtype;
  p.c_row_stride = y_rows.row_stride;
  p.c_col_stride = y_rows.col_stride;
  return call;
}

Call<LinearBackwardProblem> linear_backward_call(
    const ConstTensorView& x, const ConstTensorView& weight,
    const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
    const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
    const std::optional<TensorView>& db, const LinearOptions& options) {
  const std::int64_t n = check_linear_inputs(x, weight, bias);
  check_rows_of("dy", dy, x, n);
  // A call that computes nothing would still have its reference sum every row (the fuzzer's
  // stride-0 x of any M): refused, as the other backwards refuse one.
  if (!dx && !dw && !db) throw Error("dx", "dx, dw or db (at least one output)", "none");
  if (dx) {
    check_view("dx", *dx, 1, kMaxRank, {kLinearRowsRank});
    check_same_shape("dx", *dx, "x", x);
  }
  if (dw) {
    check_view("dw", *dw, 2, 2, {"rank 2 ([N, K])"});
    check_same_shape("dw", *dw, "weight", weight);
  }
  if (db) {
    if (!bias) throw Error("db", "no db without a bias", "a db output");
    check_view("db", *db, 1, 1, {"rank 1 ([N])"});
    check_same_shape("db", *db, "bias", *bias);
  }
  const GemmMatrix x_rows = rows_matrix("x", x);
  const GemmMatrix dy_rows = rows_matrix("dy", dy);
  const DType output_dtype = dx ? dx->dtype : dw ? dw->dtype : db ? db->dtype : dy.dtype;
  Call<LinearBackwardProblem> call{linear_record(Direction::Backward, options, output_dtype), {}};
  check_call(call.record, {x, weight, bias, dy, dx, dw, db});
  LinearBackwardProblem& p = call.problem;
  p.m = row_count(x);
  p.n = n;
  p.k = x.shape[x.rank - 1];
  p.x = x_rows;
  p.w = {weight.data, weight.dtype, weight.strides[0], weight.strides[1]};
  if (bias) p.bias = vector_matrix(*bias);
  p.dy = dy_rows;
  p.activation = static_cast<contract::Activation>(options.activation);
  if (dx) {
    const GemmMatrix dx_rows = rows_matrix("dx", *dx);
    p.dx = GemmOutput{dx->data, dx->dtype, dx_rows.row_stride, dx_rows.col_stride};
  }
  if (dw) p.dw = GemmOutput{dw->data, dw->dtype, dw->strides[0], dw->strides[1]};
  if (db) p.db = GemmOutput{db->data, db->dtype, db->strides[0], 0};
  return call;
}

}  // namespace detail

void linear_forward(const ConstTensorView& x, const ConstTensorView& weight,
                    const std::optional<ConstTensorView>& bias, const TensorView& y,
                    const LinearOptions& options, const ExecutionContext& context) {
  detail::run<OpType::Linear, Direction::Forward>(
      context, [&] { return detail::linear_forward_call(x, weight, bias, y, options); });
}

void linear_backward(const ConstTensorView& x, const ConstTensorView& weight,
                     const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
                     const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
                     const std::optional<TensorView>& db, const LinearOptions& options,
                     const ExecutionContext& context) {
  detail::run<OpType::Linear, Direction::Backward>(context, [&] {
    return detail::linear_backward_call(x, weight, bias, dy, dx, dw, db, options);
  });
}

}  // namespace kernel_align
