// The validator of activation: it checks every argument of a call (kernel_align::Error
// names the first bad one) and returns the call the backends run (api/call.hpp). Defined,
// with the op's public functions, in api/ops/activation.cpp.
#pragma once

#include "api/call.hpp"

namespace kernel_align::detail {

Call<ActivationProblem> activation_forward_call(const ConstTensorView& x, const TensorView& y,
                                                const ActivationOptions& options);

Call<ActivationBackwardProblem> activation_backward_call(const ConstTensorView& x,
                                                         const ConstTensorView& dy,
                                                         const TensorView& dx,
                                                         const ActivationOptions& options);

}  // namespace kernel_align::detail
