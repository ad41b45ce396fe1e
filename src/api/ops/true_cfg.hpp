// The validators of true_cfg: they check every argument of a call (kernel_align::Error
// names the first bad one) and return the call the backends run (api/call.hpp). Defined,
// with the op's public functions, in api/ops/true_cfg.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<TrueCfgProblem> true_cfg_forward_call(const ConstTensorView& cond,
                                           const ConstTensorView& uncond, const TensorView& v,
                                           const TrueCfgOptions& options);

Call<TrueCfgBackwardProblem> true_cfg_backward_call(const ConstTensorView& cond,
                                                    const ConstTensorView& uncond,
                                                    const ConstTensorView& dv,
                                                    const std::optional<TensorView>& dcond,
                                                    const std::optional<TensorView>& duncond,
                                                    const TrueCfgOptions& options);

}  // namespace kernel_align::detail
