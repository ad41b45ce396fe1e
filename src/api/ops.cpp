// Public entry points: validate, then run the reference backend under the
// contract's floating-point environment. (Backend choice arrives with the
// registry; until then the reference is the only backend.)
#include "kernel_align/ops.hpp"

#include "api/float_env.hpp"
#include "api/problems.hpp"
#include "reference/reference.hpp"

namespace kernel_align {

void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options) {
  const auto problem = detail::make_rmsnorm_forward(x, weight, y, options);
  const detail::ContractFloatEnvironment env;
  reference::qk_rmsnorm_forward(problem);
}

void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options) {
  const auto problem = detail::make_rmsnorm_backward(x, dy, weight, dx, dw, options);
  const detail::ContractFloatEnvironment env;
  reference::qk_rmsnorm_backward(problem);
}

void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options) {
  const auto problem = detail::make_rope(x, cos, sin, y, options, false, "x", "y");
  const detail::ContractFloatEnvironment env;
  reference::multi_axis_rope(problem);
}

void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options) {
  const auto problem = detail::make_rope(dy, cos, sin, dx, options, true, "dy", "dx");
  const detail::ContractFloatEnvironment env;
  reference::multi_axis_rope(problem);
}

const char* pairing_name(Pairing p) {
  return p == Pairing::Half ? "half" : "interleaved";
}
const char* layout_name(Layout l) {
  return l == Layout::BSHD ? "bshd" : "bhsd";
}
const char* norm_mode_name(NormMode m) {
  return m == NormMode::Single ? "single" : "diffusers";
}

}  // namespace kernel_align
