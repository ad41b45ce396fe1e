// The validator of qk_rmsnorm: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/qk_rmsnorm.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<RmsNormForwardProblem> rmsnorm_forward_call(const ConstTensorView& x,
                                                 const std::optional<ConstTensorView>& weight,
                                                 const TensorView& y,
                                                 const RmsNormOptions& options);

Call<RmsNormBackwardProblem> rmsnorm_backward_call(const ConstTensorView& x,
                                                   const ConstTensorView& dy,
                                                   const std::optional<ConstTensorView>& weight,
                                                   const TensorView& dx,
                                                   const std::optional<TensorView>& dw,
                                                   const RmsNormOptions& options);

}  // namespace kernel_align::detail
