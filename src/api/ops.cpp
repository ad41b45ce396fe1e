// Public entry points: validate into one call record, let the registry choose a backend
// from it, run the backend under the contract's floating-point environment, and write
// the trace record from it when tracing.
#include "kernel_align/ops.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/call.hpp"
#include "api/descriptors.hpp"
#include "api/float_env.hpp"
#include "kernel_align/error.hpp"
#include "registry/registry.hpp"
#include "trace/trace.hpp"

namespace kernel_align {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// Chooses the backend from the call's record, runs its (op, direction) kernel on the
// call's problem (inside the contract's floating-point environment), traces the call from
// the record and reports it (last_call), timed from `entered`, when the public function
// was entered.
template <OpType op, Direction direction>
void run(Clock::time_point entered, const detail::Call<detail::Problem<op, direction>>& call,
         const ExecutionContext& context) {
  const registry::Choice choice = registry::choose(call.record);
  registry::Execution exec;
  exec.device = call.record.device;
  exec.context = context;
  exec.traced = trace::enabled();
  trace::FloatState float_state;
  Seconds backend_time{};
  {
    const detail::ContractFloatEnvironment env;
    float_state = trace::read_float_state();
    const auto start = Clock::now();
    choice.backend->kernels.get<op, direction>()(call.problem, exec);
    backend_time = Clock::now() - start;
  }
  if (exec.traced) trace::write(call.record, choice, exec, float_state);
  registry::set_last_call({choice.requested->name, choice.backend->name, exec.isa, choice.fallback,
                           backend_time.count(), Seconds(Clock::now() - entered).count()});
}

}  // namespace

// Each validates its arguments into one call (validate.cpp names them) and runs it.
void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options,
                        const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::QkRmsNorm, Direction::Forward>(
      entered, detail::rmsnorm_forward_call(x, weight, y, options), context);
}

void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options,
                         const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::QkRmsNorm, Direction::Backward>(
      entered, detail::rmsnorm_backward_call(x, dy, weight, dx, dw, options), context);
}

void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::MultiAxisRope, Direction::Forward>(
      entered, detail::rope_call(Direction::Forward, x, cos, sin, y, options), context);
}

void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::MultiAxisRope, Direction::Backward>(
      entered, detail::rope_call(Direction::Backward, dy, cos, sin, dx, options), context);
}

void qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                          const QkNormWeights& weights, const ConstTensorView& cos,
                          const ConstTensorView& sin, const TensorView& q_out,
                          const TensorView& k_out, const QkNormRopeOptions& options,
                          const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::QkNormRope, Direction::Forward>(
      entered, detail::qk_norm_rope_forward_call(q, k, weights, cos, sin, q_out, k_out, options),
      context);
}

void qk_norm_rope_backward(const ConstTensorView& q, const ConstTensorView& k,
                           const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                           const QkNormWeights& weights, const ConstTensorView& cos,
                           const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
                           const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options,
                           const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::QkNormRope, Direction::Backward>(
      entered,
      detail::qk_norm_rope_backward_call(q, k, dq_out, dk_out, weights, cos, sin, dq, dk,
                                         weight_grads, options),
      context);
}

void linear_forward(const ConstTensorView& x, const ConstTensorView& weight,
                    const std::optional<ConstTensorView>& bias, const TensorView& y,
                    const LinearOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::Linear, Direction::Forward>(
      entered, detail::linear_forward_call(x, weight, bias, y, options), context);
}

void linear_backward(const ConstTensorView& x, const ConstTensorView& weight,
                     const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
                     const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
                     const std::optional<TensorView>& db, const LinearOptions& options,
                     const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::Linear, Direction::Backward>(
      entered, detail::linear_backward_call(x, weight, bias, dy, dx, dw, db, options), context);
}

void attention_forward(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       const std::optional<ConstTensorView>& mask, const TensorView& out,
                       const AttentionOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::Attention, Direction::Forward>(
      entered, detail::attention_forward_call(q, k, v, mask, out, options), context);
}

void adaln_modulation_forward(const ConstTensorView& x, const ConstTensorView& scale,
                              const ConstTensorView& shift, const TensorView& y,
                              const AdaLnOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::AdaLnModulation, Direction::Forward>(
      entered, detail::adaln_forward_call(x, scale, shift, y, options), context);
}

void adaln_modulation_backward(const ConstTensorView& x, const ConstTensorView& scale,
                               const ConstTensorView& dy, const TensorView& dx,
                               const std::optional<TensorView>& dscale,
                               const std::optional<TensorView>& dshift, const AdaLnOptions& options,
                               const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::AdaLnModulation, Direction::Backward>(
      entered, detail::adaln_backward_call(x, scale, dy, dx, dscale, dshift, options), context);
}

void attention_backward(const ConstTensorView& q, const ConstTensorView& k,
                        const ConstTensorView& v, const std::optional<ConstTensorView>& mask,
                        const ConstTensorView& out, const ConstTensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  run<OpType::Attention, Direction::Backward>(
      entered, detail::attention_backward_call(q, k, v, mask, out, dout, dq, dk, dv, options),
      context);
}

float fp32_option(const std::string& argument, double value) {
  if (!std::isfinite(value)) throw Error(argument, "a finite number", std::to_string(value));
  const auto rounded = static_cast<float>(value);
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  if (std::isinf(rounded)) {
    throw Error(argument, "a number within the fp32 range (magnitude at most 3.40282347e+38)",
                std::string(text) + ", which overflows fp32 to infinity");
  }
  if (rounded == 0.0f && value != 0.0) {
    throw Error(argument,
                "zero or a number of magnitude at least 1.4e-45 (the smallest fp32 subnormal)",
                std::string(text) + ", which underflows fp32 to 0");
  }
  return rounded;
}

// The descriptors' spellings (api/descriptors.cpp), one list for every front end: an
// option's choices in the order of its enum.
namespace {

const detail::OptionSpec& choice_option(OpType op, const char* name) {
  return *detail::descriptor(op).option(name);
}

template <class Enum>
const char* choice_name(OpType op, const char* option, Enum value) {
  return choice_option(op, option).choices.at(static_cast<std::size_t>(value));
}

template <class Enum>
Enum choice_from_name(OpType op, const char* option, std::string_view text,
                      const std::string& argument) {
  const std::span<const char* const> names = choice_option(op, option).choice_names();
  std::string listed;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<Enum>(i);
    listed += (i == 0 ? "" : ", ") + std::string(names[i]);
  }
  throw Error(argument, "one of " + listed, "'" + std::string(text) + "'");
}

}  // namespace

const char* pairing_name(Pairing p) {
  return choice_name(OpType::MultiAxisRope, "pairing", p);
}
const char* layout_name(Layout l) {
  return choice_name(OpType::MultiAxisRope, "layout", l);
}
const char* norm_mode_name(NormMode m) {
  return choice_name(OpType::QkRmsNorm, "mode", m);
}
const char* activation_name(Activation a) {
  return choice_name(OpType::Linear, "activation", a);
}

std::vector<std::string> option_choices(OpType op, std::string_view option) {
  const detail::OptionSpec* spec = detail::descriptor(op).option(option);
  if (spec == nullptr) return {};
  const std::span<const char* const> names = spec->choice_names();
  return {names.begin(), names.end()};
}

NormMode norm_mode_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<NormMode>(OpType::QkRmsNorm, "mode", text, argument);
}
Pairing pairing_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Pairing>(OpType::MultiAxisRope, "pairing", text, argument);
}
Layout layout_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Layout>(OpType::MultiAxisRope, "layout", text, argument);
}
Activation activation_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Activation>(OpType::Linear, "activation", text, argument);
}

}  // namespace kernel_align
