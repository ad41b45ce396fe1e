// The validator of linear: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/linear.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<GemmProblem> linear_forward_call(const ConstTensorView& x, const ConstTensorView& weight,
                                      const std::optional<ConstTensorView>& bias,
                                      const TensorView& y, const LinearOptions& options);

Call<LinearBackwardProblem> linear_backward_call(
    const ConstTensorView& x, const ConstTensorView& weight,
    const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
    const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
    const std::optional<TensorView>& db, const LinearOptions& options);

}  // namespace kernel_align::detail
