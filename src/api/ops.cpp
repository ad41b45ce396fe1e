// Public entry points: validate, let the registry choose a backend, run it under the
// contract's floating-point environment, and write the trace record when tracing.
#include "kernel_align/ops.hpp"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "api/float_env.hpp"
#include "api/problems.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/error.hpp"
#include "registry/registry.hpp"
#include "trace/trace.hpp"

namespace kernel_align {
namespace {

using registry::BackendOps;
using trace::CallDescription;
using trace::TensorArg;
using trace::TensorArgs;

// The one device every tensor of the call lives on; an Error names two that differ.
Device device_of(const CallDescription& d) {
  const char* first = nullptr;  // the first tensor's name
  Device device;
  for (const TensorArg& t : d.tensors) {
    if (first == nullptr) {
      first = t.name;
      device = t.view.device;
    } else if (t.view.device != device) {
      throw Error(t.name,
                  "a tensor on " + device_name(device) + ", where '" + first +
                      "' is (every tensor of a call on one device)",
                  "one on " + device_name(t.view.device));
    }
  }
  return device;
}

// The registry's view of a call on `device`.
registry::Call call_of(const CallDescription& d, Device device, int head_dim) {
  registry::Call call;
  call.platform = device.platform;
  call.op = d.op;
  call.direction = d.direction;
  call.d = head_dim;
  call.has_layout = d.layout.has_value();
  call.layout = d.layout.value_or(Layout::BSHD);
  call.has_pairing = d.pairing.has_value();
  call.pairing = d.pairing.value_or(Pairing::Interleaved);
  call.has_mode = d.mode.has_value();
  call.mode = d.mode.value_or(NormMode::Single);
  std::uintptr_t addresses = 0;
  for (const TensorArg& t : d.tensors) {
    call.dtype_set |= 1u << static_cast<unsigned>(t.view.dtype);
    call.rows_contiguous = call.rows_contiguous && t.view.strides[t.view.rank - 1] == 1;
    addresses |= reinterpret_cast<std::uintptr_t>(t.view.data);
  }
  // The largest power of two dividing every address.
  constexpr std::size_t kPage = 4096;
  call.alignment = addresses == 0 ? kPage : std::size_t{1} << std::countr_zero(addresses);
  return call;
}

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// Chooses the backend of the tensors' device, runs its `entry` on the problem (inside
// the contract's floating-point environment), traces the call and reports it
// (last_call), timed from `entered`, when the public function was entered.
template <class Problem, class Entry>
void run(Clock::time_point entered, const CallDescription& description, int head_dim,
         const Problem& problem, Entry BackendOps::*entry, const ExecutionContext& context) {
  const Device device = device_of(description);
  const registry::Choice choice = registry::choose(call_of(description, device, head_dim));
  registry::Execution exec;
  exec.device = device;
  exec.context = context;
  exec.traced = trace::enabled();
  trace::FloatState float_state;
  Seconds backend_time{};
  {
    const detail::ContractFloatEnvironment env;
    float_state = trace::read_float_state();
    const auto start = Clock::now();
    (choice.backend->ops.*entry)(problem, exec);
    backend_time = Clock::now() - start;
  }
  if (exec.traced) trace::write(description, choice, exec, float_state);
  registry::set_last_call({choice.requested->name, choice.backend->name, exec.isa, choice.fallback,
                           backend_time.count(), Seconds(Clock::now() - entered).count()});
}

CallDescription describe(OpType op, Direction direction, DType output_dtype) {
  CallDescription d;
  d.op = op;
  d.direction = direction;
  d.output_dtype = output_dtype;
  return d;
}

CallDescription describe_rmsnorm(Direction direction, DType output_dtype,
                                 const RmsNormOptions& options) {
  CallDescription d = describe(OpType::QkRmsNorm, direction, output_dtype);
  d.mode = options.mode;
  d.eps = options.eps;
  return d;
}

CallDescription describe_rope(Direction direction, DType output_dtype, const RopeOptions& options) {
  CallDescription d = describe(OpType::MultiAxisRope, direction, output_dtype);
  d.layout = options.layout;
  d.pairing = options.pairing;
  return d;
}

CallDescription describe_fused(Direction direction, DType output_dtype,
                               const QkNormRopeOptions& options) {
  CallDescription d = describe(OpType::QkNormRope, direction, output_dtype);
  d.layout = options.layout;
  d.pairing = options.pairing;
  d.mode = options.mode;
  d.eps = options.eps;
  d.text_len = options.text_len;
  return d;
}

void add_weights(TensorArgs& tensors, const QkNormWeights& w) {
  tensors.add("weight_text_q", w.text_q, false);
  tensors.add("weight_text_k", w.text_k, false);
  tensors.add("weight_image_q", w.image_q, false);
  tensors.add("weight_image_k", w.image_k, false);
}

}  // namespace

void qk_rmsnorm_forward(const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
                        const TensorView& y, const RmsNormOptions& options,
                        const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem = detail::make_rmsnorm_forward(x, weight, y, options);
  CallDescription d = describe_rmsnorm(Direction::Forward, y.dtype, options);
  d.tensors.add("x", x, false);
  d.tensors.add("weight", weight, false);
  d.tensors.add("y", y, true);
  run(entered, d, problem.d, problem, &BackendOps::rmsnorm_forward, context);
}

void qk_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                         const std::optional<ConstTensorView>& weight, const TensorView& dx,
                         const std::optional<TensorView>& dw, const RmsNormOptions& options,
                         const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem = detail::make_rmsnorm_backward(x, dy, weight, dx, dw, options);
  CallDescription d = describe_rmsnorm(Direction::Backward, dx.dtype, options);
  d.tensors.add("x", x, false);
  d.tensors.add("dy", dy, false);
  d.tensors.add("weight", weight, false);
  d.tensors.add("dx", dx, true);
  d.tensors.add("dw", problem.dw, true);
  d.computes_dw = problem.dw.has_value();
  run(entered, d, problem.d, problem, &BackendOps::rmsnorm_backward, context);
}

void multi_axis_rope_forward(const ConstTensorView& x, const ConstTensorView& cos,
                             const ConstTensorView& sin, const TensorView& y,
                             const RopeOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem = detail::make_rope(x, cos, sin, y, options, false, "x", "y");
  CallDescription d = describe_rope(Direction::Forward, y.dtype, options);
  d.tensors.add("x", x, false);
  d.tensors.add("cos", cos, false);
  d.tensors.add("sin", sin, false);
  d.tensors.add("y", y, true);
  run(entered, d, problem.d, problem, &BackendOps::rope, context);
}

void multi_axis_rope_backward(const ConstTensorView& dy, const ConstTensorView& cos,
                              const ConstTensorView& sin, const TensorView& dx,
                              const RopeOptions& options, const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem = detail::make_rope(dy, cos, sin, dx, options, true, "dy", "dx");
  CallDescription d = describe_rope(Direction::Backward, dx.dtype, options);
  d.tensors.add("dy", dy, false);
  d.tensors.add("cos", cos, false);
  d.tensors.add("sin", sin, false);
  d.tensors.add("dx", dx, true);
  run(entered, d, problem.d, problem, &BackendOps::rope, context);
}

void qk_norm_rope_forward(const ConstTensorView& q, const ConstTensorView& k,
                          const QkNormWeights& weights, const ConstTensorView& cos,
                          const ConstTensorView& sin, const TensorView& q_out,
                          const TensorView& k_out, const QkNormRopeOptions& options,
                          const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem =
      detail::make_qk_norm_rope_forward(q, k, weights, cos, sin, q_out, k_out, options);
  CallDescription d = describe_fused(Direction::Forward, q_out.dtype, options);
  d.tensors.add("q", q, false);
  d.tensors.add("k", k, false);
  add_weights(d.tensors, weights);
  d.tensors.add("cos", cos, false);
  d.tensors.add("sin", sin, false);
  d.tensors.add("q_out", q_out, true);
  d.tensors.add("k_out", k_out, true);
  run(entered, d, static_cast<int>(q.shape[3]), problem, &BackendOps::qk_norm_rope_forward,
      context);
}

void qk_norm_rope_backward(const ConstTensorView& q, const ConstTensorView& k,
                           const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                           const QkNormWeights& weights, const ConstTensorView& cos,
                           const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
                           const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options,
                           const ExecutionContext& context) {
  const auto entered = Clock::now();
  const auto problem = detail::make_qk_norm_rope_backward(q, k, dq_out, dk_out, weights, cos, sin,
                                                          dq, dk, weight_grads, options);
  CallDescription d = describe_fused(Direction::Backward, dq.dtype, options);
  d.tensors.add("q", q, false);
  d.tensors.add("k", k, false);
  d.tensors.add("dq_out", dq_out, false);
  d.tensors.add("dk_out", dk_out, false);
  add_weights(d.tensors, weights);
  d.tensors.add("cos", cos, false);
  d.tensors.add("sin", sin, false);
  d.tensors.add("dq", dq, true);
  d.tensors.add("dk", dk, true);
  d.tensors.add("dw_text_q", weight_grads.text_q, true);
  d.tensors.add("dw_text_k", weight_grads.text_k, true);
  d.tensors.add("dw_image_q", weight_grads.image_q, true);
  d.tensors.add("dw_image_k", weight_grads.image_k, true);
  d.computes_dw =
      weight_grads.text_q || weight_grads.text_k || weight_grads.image_q || weight_grads.image_k;
  run(entered, d, static_cast<int>(q.shape[3]), problem, &BackendOps::qk_norm_rope_backward,
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
