// The validator of attention: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/attention.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

Call<AttentionProblem> attention_forward_call(const ConstTensorView& q, const ConstTensorView& k,
                                              const ConstTensorView& v,
                                              const std::optional<ConstTensorView>& mask,
                                              const TensorView& out,
                                              const AttentionOptions& options);

Call<AttentionBackwardProblem> attention_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
    const std::optional<ConstTensorView>& mask, const ConstTensorView& out,
    const ConstTensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
    const AttentionOptions& options);

}  // namespace kernel_align::detail
