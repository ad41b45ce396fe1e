// true_cfg (contract section 17): cond, uncond [..., D]. Its validator (each argument
// checked and named, the call's tensors listed once for the aliasing rule) and its public
// functions (kernel_align/ops.hpp).
#include "api/ops/true_cfg.hpp"

#include <cmath>
#include <string>

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {
namespace {

void check_like(const char* name, const ConstTensorView& t, const ConstTensorView& cond) {
  check_view(name, t, 1, kMaxRank, {kRowsRank});
  check_same_shape(name, t, "cond", cond);
}

// A finite guidance scale; returns it.
float checked_scale(const TrueCfgOptions& o) {
  if (!std::isfinite(o.scale)) {
    throw Error("scale", "a finite guidance scale", "scale = " + std::to_string(o.scale));
  }
  return o.scale;
}

CallRecord cfg_record(Direction direction, const TrueCfgOptions& o, DType output_dtype) {
  CallRecord record = record_of(OpType::TrueCfg, direction, output_dtype);
  add_option(record, fp32_value("scale", o.scale));
  return record;
}

}  // namespace

Call<TrueCfgProblem> true_cfg_forward_call(const ConstTensorView& cond,
                                           const ConstTensorView& uncond, const TensorView& v,
                                           const TrueCfgOptions& options) {
  check_view("cond", cond, 1, kMaxRank, {kRowsRank});
  check_like("uncond", uncond, cond);
  check_like("v", v, cond);
  const float scale = checked_scale(options);
  Call<TrueCfgProblem> call{cfg_record(Direction::Forward, options, v.dtype),
                            {cond, uncond, v, scale}};
  check_call(call.record, {cond, uncond, v});
  return call;
}

Call<TrueCfgBackwardProblem> true_cfg_backward_call(const ConstTensorView& cond,
                                                    const ConstTensorView& uncond,
                                                    const ConstTensorView& dv,
                                                    const std::optional<TensorView>& dcond,
                                                    const std::optional<TensorView>& duncond,
                                                    const TrueCfgOptions& options) {
  check_view("cond", cond, 1, kMaxRank, {kRowsRank});
  check_like("uncond", uncond, cond);
  check_like("dv", dv, cond);
  if (!dcond && !duncond) throw Error("dcond", "dcond or duncond (at least one output)", "neither");
  if (dcond) check_like("dcond", *dcond, cond);
  if (duncond) check_like("duncond", *duncond, cond);
  const float scale = checked_scale(options);
  Call<TrueCfgBackwardProblem> call{
      cfg_record(Direction::Backward, options, dcond ? dcond->dtype : duncond->dtype),
      {cond, uncond, dv, dcond ? *dcond : TensorView(), duncond ? *duncond : TensorView(), scale}};
  check_call(call.record, {cond, uncond, dv, dcond, duncond});
  return call;
}

}  // namespace detail

void true_cfg_forward(const ConstTensorView& cond, const ConstTensorView& uncond,
                      const TensorView& v, const TrueCfgOptions& options,
                      const ExecutionContext& context) {
  detail::run<OpType::TrueCfg, Direction::Forward>(
      context, [&] { return detail::true_cfg_forward_call(cond, uncond, v, options); });
}

void true_cfg_backward(const ConstTensorView& cond, const ConstTensorView& uncond,
                       const ConstTensorView& dv, const std::optional<TensorView>& dcond,
                       const std::optional<TensorView>& duncond, const TrueCfgOptions& options,
                       const ExecutionContext& context) {
  detail::run<OpType::TrueCfg, Direction::Backward>(context, [&] {
    return detail::true_cfg_backward_call(cond, uncond, dv, dcond, duncond, options);
  });
}

}  // namespace kernel_align
