// qk_rmsnorm (contract section 3): x [..., D] normalised row by row. Its validator (each argument
// checked and named, the call's tensors listed once for the aliasing rule) and its public functions
// (kernel_align/ops.hpp).
#include "api/ops/qk_rmsnorm.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

namespace {

CallRecord rmsnorm_record(Direction direction, const RmsNormOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::QkRmsNorm, direction, output_dtype);
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  return record;
}

void check_weight(const std::optional<ConstTensorView>& weight, int d) {
  if (!weight) return;
  check_view("weight", *weight, 1, 1, {kVectorRank});
  if (weight->shape[0] != d) {
    throw Error("weight", "length " + std::to_string(d) + " (D of x)",
                "length " + std::to_string(weight->shape[0]));
  }
}

}  // namespace

Call<RmsNormForwardProblem> rmsnorm_forward_call(const ConstTensorView& x,
                                                 const std::optional<ConstTensorView>& weight,
                                                 const TensorView& y,
                                                 const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_weight(weight, d);
  check_view("y", y, 1, kMaxRank, {kRowsRank});
  check_same_shape("y", y, "x", x);
  Call<RmsNormForwardProblem> call{rmsnorm_record(Direction::Forward, options, y.dtype),
                                   {x, weight, y, options, d}};
  check_call(call.record, {x, weight, y});
  return call;
}

Call<RmsNormBackwardProblem> rmsnorm_backward_call(const ConstTensorView& x,
                                                   const ConstTensorView& dy,
                                                   const std::optional<ConstTensorView>& weight,
                                                   const TensorView& dx,
                                                   const std::optional<TensorView>& dw,
                                                   const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_view("dy", dy, 1, kMaxRank, {kRowsRank});
  check_same_shape("dy", dy, "x", x);
  check_weight(weight, d);
  check_view("dx", dx, 1, kMaxRank, {kRowsRank});
  check_same_shape("dx", dx, "x", x);
  if (dw) {
    if (!weight) throw Error("dw", "no dw without a weight", "a dw output");
    check_view("dw", *dw, 1, 1, {kVectorRank});
    check_same_shape("dw", *dw, "weight", *weight);
  }
  Call<RmsNormBackwardProblem> call{rmsnorm_record(Direction::Backward, options, dx.dtype),
                                    {x, dy, weight, dx, dw, options, d}};
  if (dw) record_dw_blocks(call.record);
  check_call(call.record, {x, dy, weight, dx, dw});
  return call;
}

}  // namespace detail

void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options,
                        const ExecutionContext& context) {
  detail::run<OpType::QkRmsNorm, Direction::Forward>(
      context, [&] { return detail::rmsnorm_forward_call(x, weight, y, options); });
}

void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options,
                         const ExecutionContext& context) {
  detail::run<OpType::QkRmsNorm, Direction::Backward>(
      context, [&] { return detail::rmsnorm_backward_call(x, dy, weight, dx, dw, options); });
}

}  // namespace kernel_align
