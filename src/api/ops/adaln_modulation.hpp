// The validator of adaln_modulation: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/adaln_modulation.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<AdaLnProblem> adaln_forward_call(const ConstTensorView& x, const ConstTensorView& scale,
                                      const ConstTensorView& shift, const TensorView& y,
                                      const AdaLnOptions& options);

Call<AdaLnBackwardProblem> adaln_backward_call(const ConstTensorView& x,
                                               const ConstTensorView& scale,
                                               const ConstTensorView& dy, const TensorView& dx,
                                               const std::optional<TensorView>& dscale,
                                               const std::optional<TensorView>& dshift,
                                               const AdaLnOptions& options);

}  // namespace kernel_align::detail
