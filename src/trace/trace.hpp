// Per-call trace records (docs/trace.md): one JSON line per call, written whole.
#pragma once

#include <atomic>

#include "api/call.hpp"
#include "registry/registry.hpp"

namespace kernel_align::trace {

// Flush-to-zero and denormals-are-zero in effect, where the CPU has such flags.
struct FloatState {
  bool known = false;
  bool ftz = false;
  bool daz = false;
};
FloatState read_float_state();

namespace detail {
extern std::atomic<bool> enabled;
}  // namespace detail

// Whether a trace file is open: the only cost of tracing when it is off.
inline bool enabled() {
  return detail::enabled.load(std::memory_order_relaxed);
}

// Opens the trace named by KERNEL_ALIGN_TRACE, if any and not yet done (the registry
// calls this as it starts, so the environment is read at the first call).
void initialize();

// Appends the record of a completed call, from its call record. Throws Error naming `trace` when
// the write fails.
void write(const kernel_align::detail::CallRecord& call, const registry::Choice& choice,
           const registry::Execution& exec, const FloatState& float_state);

}  // namespace kernel_align::trace
