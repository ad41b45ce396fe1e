// activation (contract section 14): x [..., D] elementwise. Its validator (each argument
// checked and named, the call's tensors listed once for the aliasing rule) and its public
// functions (kernel_align/ops.hpp).
#include "api/ops/activation.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {
namespace {

CallRecord activation_record(Direction direction, const ActivationOptions& options,
                             DType output_dtype) {
  CallRecord record = record_of(OpType::Activation, direction, output_dtype);
  add_option(record, choice("activation", activation_name(options.activation)));
  return record;
}

// The public enum and the contract's name the same activations in the same order
// (api/ops/linear.cpp asserts it).
contract::Activation contract_activation(const ActivationOptions& options) {
  return static_cast<contract::Activation>(options.activation);
}

void check_like(const char* name, const ConstTensorView& t, const ConstTensorView& x) {
  check_view(name, t, 1, kMaxRank, {kRowsRank});
  check_same_shape(name, t, "x", x);
}

}  // namespace

Call<ActivationProblem> activation_forward_call(const ConstTensorView& x, const TensorView& y,
                                                const ActivationOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  check_like("y", y, x);
  Call<ActivationProblem> call{activation_record(Direction::Forward, options, y.dtype),
                               {x, y, contract_activation(options)}};
  check_call(call.record, {x, y});
  return call;
}

Call<ActivationBackwardProblem> activation_backward_call(const ConstTensorView& x,
                                                         const ConstTensorView& dy,
                                                         const TensorView& dx,
                                                         const ActivationOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  check_like("dy", dy, x);
  check_like("dx", dx, x);
  Call<ActivationBackwardProblem> call{activation_record(Direction::Backward, options, dx.dtype),
                                       {x, dy, dx, contract_activation(options)}};
  check_call(call.record, {x, dy, dx});
  return call;
}

}  // namespace detail

void activation_forward(const ConstTensorView& x, const TensorView& y,
                        const ActivationOptions& options, const ExecutionContext& context) {
  detail::run<OpType::Activation, Direction::Forward>(
      context, [&] { return detail::activation_forward_call(x, y, options); });
}

void activation_backward(const ConstTensorView& x, const ConstTensorView& dy, const TensorView& dx,
                         const ActivationOptions& options, const ExecutionContext& context) {
  detail::run<OpType::Activation, Direction::Backward>(
      context, [&] { return detail::activation_backward_call(x, dy, dx, options); });
}

}  // namespace kernel_align
