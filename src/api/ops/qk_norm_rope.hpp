// The validator of qk_norm_rope: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/qk_norm_rope.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<QkNormRopeForwardProblem> qk_norm_rope_forward_call(
    const ConstTensorView& q, const ConstTensorView& k, const QkNormWeights& weights,
    const ConstTensorView& cos, const ConstTensorView& sin, const TensorView& q_out,
    const TensorView& k_out, const QkNormRopeOptions& options);

Call<QkNormRopeBackwardProblem> qk_norm_rope_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options);

}  // namespace kernel_align::detail
