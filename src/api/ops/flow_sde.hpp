// The validators of flow_sde_step and flow_sde_logp: they check every argument of a call
// (kernel_align::Error names the first bad one) and return the call the backends run
// (api/call.hpp). Defined, with the ops' public functions, in api/ops/flow_sde.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<FlowSdeStepProblem> flow_sde_step_forward_call(const ConstTensorView& x,
                                                    const ConstTensorView& v,
                                                    const ConstTensorView& noise,
                                                    const TensorView& prev,
                                                    const FlowSdeOptions& options);

Call<FlowSdeStepBackwardProblem> flow_sde_step_backward_call(const ConstTensorView& dprev,
                                                             const std::optional<TensorView>& dx,
                                                             const std::optional<TensorView>& dv,
                                                             const FlowSdeOptions& options);

Call<FlowSdeLogpProblem> flow_sde_logp_forward_call(const ConstTensorView& x,
                                                    const ConstTensorView& v,
                                                    const ConstTensorView& prev,
                                                    const TensorView& logp,
                                                    const FlowSdeOptions& options);

Call<FlowSdeLogpBackwardProblem> flow_sde_logp_backward_call(
    const ConstTensorView& x, const ConstTensorView& v, const ConstTensorView& prev,
    const ConstTensorView& dlogp, const std::optional<TensorView>& dx,
    const std::optional<TensorView>& dv, const FlowSdeOptions& options);

}  // namespace kernel_align::detail
