// The validator of adaln_modulation: it checks every argument of a call (kernel_align::Error names
// the first bad one) and returns the call the backends run (api/call.hpp). Defined, with
// the op's public functions, in api/ops/adaln_modulation.cpp.
#pragma once

#include <optional>
#include <string_view>

#include "api/call.hpp"

namespace kernel_align::detail {

// The checks and views of the token tensors ([B, S, D]) and a sample's modulation ([B, D]
// or [B, 1, D]), shared by adaln_modulation and adaln_gate_residual.
inline constexpr std::string_view kTokensRank = "rank 3 ([B, S, D])";
inline constexpr std::string_view kModulationRank = "rank 2 or 3 ([B, D] or [B, 1, D])";

// A [B, S, D] tensor: its D (1 to kMaxHeadDim).
int check_tokens(const char* name, const ConstTensorView& t);
// A sample's modulation: [B, D] or [B, 1, D] with the B and D of `tokens`.
void check_modulation(const char* name, const ConstTensorView& t, const char* tokens_name,
                      const ConstTensorView& tokens);

template <class Pointer, class View>
Strided3<Pointer> tokens_of(const View& v) {
  return {v.data, v.dtype, {v.strides[0], v.strides[1], v.strides[2]}};
}

// A [B, D] or [B, 1, D] view as [B, S, D] whose every token reads (or writes) the sample's
// row.
template <class Pointer, class View>
Strided3<Pointer> modulation_of(const View& v) {
  return {v.data, v.dtype, {v.strides[0], 0, v.strides[v.rank - 1]}};
}

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
