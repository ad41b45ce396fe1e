// adaln_gate_residual: x, y [B, S, D], gate [B, D] or [B, 1, D]. Its validator (each
// argument checked and named, the call's tensors listed once for the aliasing rule) and
// its public functions (kernel_align/ops.hpp).
#include "api/ops/adaln_gate_residual.hpp"

#include "api/ops/adaln_modulation.hpp"  // the token and modulation checks
#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {
namespace {

CallRecord gate_residual_record(Direction direction, const GateResidualOptions& options,
                                DType output_dtype) {
  CallRecord record = record_of(OpType::AdaLnGateResidual, direction, output_dtype);
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  return record;
}

// A tensor of the tokens' shape: rank 3, the shape of `reference`.
void check_like(const char* name, const ConstTensorView& t, const char* reference_name,
                const ConstTensorView& reference) {
  check_view(name, t, 3, 3, {kTokensRank});
  check_same_shape(name, t, reference_name, reference);
}

}  // namespace

Call<GateResidualProblem> gate_residual_forward_call(const ConstTensorView& x,
                                                     const ConstTensorView& gate,
                                                     const ConstTensorView& y,
                                                     const TensorView& out,
                                                     const GateResidualOptions& options) {
  const int d = check_tokens("x", x);
  check_modulation("gate", gate, "x", x);
  check_like("y", y, "x", x);
  check_like("out", out, "x", x);
  Call<GateResidualProblem> call{gate_residual_record(Direction::Forward, options, out.dtype), {}};
  check_call(call.record, {x, gate, y, out});
  call.problem = {x.shape[0],
                  x.shape[1],
                  d,
                  options.mode,
                  tokens_of<const void*>(x),
                  modulation_of<const void*>(gate),
                  tokens_of<const void*>(y),
                  tokens_of<void*>(out)};
  return call;
}

Call<GateResidualBackwardProblem> gate_residual_backward_call(
    const ConstTensorView& gate, const ConstTensorView& y, const ConstTensorView& dout,
    const TensorView& dy, const std::optional<TensorView>& dgate,
    const GateResidualOptions& options) {
  const int d = check_tokens("y", y);
  check_modulation("gate", gate, "y", y);
  check_like("dout", dout, "y", y);
  check_like("dy", dy, "y", y);
  if (dgate) {
    check_view("dgate", *dgate, 2, 3, {kModulationRank});
    check_same_shape("dgate", *dgate, "gate", gate);
  }
  Call<GateResidualBackwardProblem> call{
      gate_residual_record(Direction::Backward, options, dy.dtype), {}};
  if (dgate) record_dw_blocks(call.record);
  check_call(call.record, {gate, y, dout, dy, dgate});
  const AdaLnOutput none{nullptr, dy.dtype, {0, 0, 0}};
  call.problem = {y.shape[0],
                  y.shape[1],
                  d,
                  options.mode,
                  modulation_of<const void*>(gate),
                  tokens_of<const void*>(y),
                  tokens_of<const void*>(dout),
                  tokens_of<void*>(dy),
                  dgate ? modulation_of<void*>(*dgate) : none};
  return call;
}

}  // namespace detail

void adaln_gate_residual_forward(const ConstTensorView& x, const ConstTensorView& gate,
                                 const ConstTensorView& y, const TensorView& out,
                                 const GateResidualOptions& options,
                                 const ExecutionContext& context) {
  detail::run<OpType::AdaLnGateResidual, Direction::Forward>(
      context, [&] { return detail::gate_residual_forward_call(x, gate, y, out, options); });
}

void adaln_gate_residual_backward(const ConstTensorView& gate, const ConstTensorView& y,
                                  const ConstTensorView& dout, const TensorView& dy,
                                  const std::optional<TensorView>& dgate,
                                  const GateResidualOptions& options,
                                  const ExecutionContext& context) {
  detail::run<OpType::AdaLnGateResidual, Direction::Backward>(context, [&] {
    return detail::gate_residual_backward_call(gate, y, dout, dy, dgate, options);
  });
}

}  // namespace kernel_align
