// How every public op function runs (api/ops/<op>.cpp): validate into one call record,
// let the registry choose a backend from it, run the backend's (op, direction) kernel
// under the contract's floating-point environment, and write the trace record from it
// when tracing.
#pragma once

#include <chrono>

#include "api/call.hpp"
#include "api/float_env.hpp"
#include "registry/registry.hpp"
#include "trace/trace.hpp"

namespace kernel_align::detail {

// Validates by make_call() (which throws kernel_align::Error naming a bad argument),
// chooses the backend from the call's record, runs its kernel on the call's problem,
// traces the call and reports it (last_call), timed from entry.
template <OpType op, Direction direction, class MakeCall>
void run(const ExecutionContext& context, const MakeCall& make_call) {
  using Clock = std::chrono::steady_clock;
  using Seconds = std::chrono::duration<double>;
  const auto entered = Clock::now();
  const Call<Problem<op, direction>> call = make_call();
  const registry::Choice choice = registry::choose(call.record);
  registry::Execution exec;
  exec.device = call.record.device;
  exec.context = context;
  exec.traced = trace::enabled();
  trace::FloatState float_state;
  Seconds backend_time{};
  {
    const ContractFloatEnvironment env;
    float_state = trace::read_float_state();
    const auto start = Clock::now();
    choice.backend->kernels.get<op, direction>()(call.problem, exec);
    backend_time = Clock::now() - start;
  }
  if (exec.traced) trace::write(call.record, choice, exec, float_state);
  registry::set_last_call({choice.requested->name, choice.backend->name, exec.isa, choice.fallback,
                           backend_time.count(), Seconds(Clock::now() - entered).count()});
}

}  // namespace kernel_align::detail
