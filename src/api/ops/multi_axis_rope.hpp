// The validator of multi_axis_rope: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/multi_axis_rope.cpp.
#pragma once

#include <optional>

#include "api/call.hpp"

namespace kernel_align::detail {

// The rotation of `in` into `out` (`in_name`, `out_name` in messages), shared with
// qk_norm_rope: shapes and tables checked; the aliasing rule is checked over the whole
// call.
RopeProblem rope_problem(const ConstTensorView& in, const ConstTensorView& cos,
                         const ConstTensorView& sin, const TensorView& out,
                         const RopeOptions& options, bool transpose, const char* in_name,
                         const char* out_name);

Call<RopeProblem> rope_call(Direction direction, const ConstTensorView& in,
                            const ConstTensorView& cos, const ConstTensorView& sin,
                            const TensorView& out, const RopeOptions& options);

}  // namespace kernel_align::detail
