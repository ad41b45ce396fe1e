// The validator of adaln_gate_residual: it checks every argument of a call
// (kernel_align::Error names the first bad one) and returns the call the backends run
// (api/call.hpp). Defined, with the op's public functions, in
// api/ops/adaln_gate_residual.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<GateResidualProblem> gate_residual_forward_call(const ConstTensorView& x,
                                                     const ConstTensorView& gate,
                                                     const ConstTensorView& y,
                                                     const TensorView& out,
                                                     const GateResidualOptions& options);

Call<GateResidualBackwardProblem> gate_residual_backward_call(
    const ConstTensorView& gate, const ConstTensorView& y, const ConstTensorView& dout,
    const TensorView& dy, const std::optional<TensorView>& dgate,
    const GateResidualOptions& options);

}  // namespace kernel_align::detail
