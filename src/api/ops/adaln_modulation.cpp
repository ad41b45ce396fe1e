// adaln_modulation: x [B, S, D], scale and shift [B, D] or [B, 1, D]. Its validator (each argument
// checked and named, the call's tensors listed once for the aliasing rule) and its public functions
// (kernel_align/ops.hpp).
#include "api/ops/adaln_modulation.hpp"

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {

int check_tokens(const char* name, const ConstTensorView& t) {
  check_view(name, t, 3, 3, {kTokensRank});
  const std::int64_t d = t.shape[2];
  if (d < 1 || d > kMaxHeadDim) {
    throw Error(name, "a last dim D from 1 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(d));
  }
  return static_cast<int>(d);
}

void check_modulation(const char* name, const ConstTensorView& t, const char* tokens_name,
                      const ConstTensorView& tokens) {
  check_view(name, t, 2, 3, {kModulationRank});
  const bool ok = t.shape[0] == tokens.shape[0] && t.shape[t.rank - 1] == tokens.shape[2] &&
                  (t.rank == 2 || t.shape[1] == 1);
  if (!ok) {
    const std::string b = std::to_string(tokens.shape[0]);
    const std::string d = std::to_string(tokens.shape[2]);
    throw Error(name,
                "shape [" + b + ", " + d + "] or [" + b + ", 1, " + d + "] (B and D of " +
                    tokens_name + ")",
                "shape " + shape_string(t));
  }
}

namespace {

CallRecord adaln_record(Direction direction, const AdaLnOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::AdaLnModulation, direction, output_dtype);
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  return record;
}

}  // namespace

Call<AdaLnProblem> adaln_forward_call(const ConstTensorView& x, const ConstTensorView& scale,
                                      const ConstTensorView& shift, const TensorView& y,
                                      const AdaLnOptions& options) {
  const int d = check_tokens("x", x);
  check_modulation("scale", scale, "x", x);
  check_modulation("shift", shift, "x", x);
  check_view("y", y, 3, 3, {kTokensRank});
  check_same_shape("y", y, "x", x);
  Call<AdaLnProblem> call{adaln_record(Direction::Forward, options, y.dtype), {}};
  check_call(call.record, {x, scale, shift, y});
  call.problem = {x.shape[0],
                  x.shape[1],
                  d,
                  options.eps,
                  options.mode,
                  tokens_of<const void*>(x),
                  modulation_of<const void*>(scale),
                  modulation_of<const void*>(shift),
                  tokens_of<void*>(y)};
  return call;
}

Call<AdaLnBackwardProblem> adaln_backward_call(const ConstTensorView& x,
                                               const ConstTensorView& scale,
                                               const ConstTensorView& dy, const TensorView& dx,
                                               const std::optional<TensorView>& dscale,
                                               const std::optional<TensorView>& dshift,
                                               const AdaLnOptions& options) {
  const int d = check_tokens("x", x);
  check_modulation("scale", scale, "x", x);
  check_view("dy", dy, 3, 3, {kTokensRank});
  check_same_shape("dy", dy, "x", x);
  check_view("dx", dx, 3, 3, {kTokensRank});
  check_same_shape("dx", dx, "x", x);
  for (const auto& [name, grad] : {std::pair{"dscale", &dscale}, std::pair{"dshift", &dshift}}) {
    if (*grad) {
      check_view(name, **grad, 2, 3, {kModulationRank});
      check_same_shape(name, **grad, "scale", scale);
    }
  }
  Call<AdaLnBackwardProblem> call{adaln_record(Direction::Backward, options, dx.dtype), {}};
  if (dscale || dshift) record_dw_blocks(call.record);
  check_call(call.record, {x, scale, dy, dx, dscale, dshift});
  const AdaLnOutput none{nullptr, dx.dtype, {0, 0, 0}};
  call.problem = {x.shape[0],
                  x.shape[1],
                  d,
                  options.eps,
                  options.mode,
                  tokens_of<const void*>(x),
                  modulation_of<const void*>(scale),
                  tokens_of<const void*>(dy),
                  tokens_of<void*>(dx),
                  dscale ? modulation_of<void*>(*dscale) : none,
                  dshift ? modulation_of<void*>(*dshift) : none};
  return call;
}

}  // namespace detail

void adaln_modulation_forward(const ConstTensorView& x, const ConstTensorView& scale,
                              const ConstTensorView& shift, const TensorView& y,
                              const AdaLnOptions& options, const ExecutionContext& context) {
  detail::run<OpType::AdaLnModulation, Direction::Forward>(
      context, [&] { return detail::adaln_forward_call(x, scale, shift, y, options); });
}

void adaln_modulation_backward(const ConstTensorView& x, const ConstTensorView& scale,
                               const ConstTensorView& dy, const TensorView& dx,
                               const std::optional<TensorView>& dscale,
                               const std::optional<TensorView>& dshift, const AdaLnOptions& options,
                               const ExecutionContext& context) {
  detail::run<OpType::AdaLnModulation, Direction::Backward>(context, [&] {
    return detail::adaln_backward_call(x, scale, dy, dx, dscale, dshift, options);
  });
}

}  // namespace kernel_align
