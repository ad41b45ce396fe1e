// Which backend runs a call, and the record of what ran.
//
// Every call is routed through a registry: for the platform the tensors live on and
// the op, an ordered list of backends (on the CPU: simd, then reference). The first
// one that is available and supports the call (dtypes, layout, pairing, mode, head
// dim, alignment, contiguity) runs it. When that is not the first choice the call is
// a fallback: it fails in strict mode, and otherwise is counted, written to the trace
// record and warned about once per (op, reason) on stderr. Never silent.
//
// Settings start from the environment (read once, at first use; a bad value is an
// Error then): KERNEL_ALIGN_BACKEND=<name>, KERNEL_ALIGN_STRICT=0|1,
// KERNEL_ALIGN_HOST_FALLBACK=0|1, KERNEL_ALIGN_TRACE=<path.jsonl> (docs/trace.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_align/device.hpp"

namespace kernel_align {

enum class OpType : unsigned char { QkRmsNorm, MultiAxisRope, QkNormRope };
enum class Direction : unsigned char { Forward, Backward };

const char* op_type_name(OpType op);
const char* direction_name(Direction d);

// Forces backend `name` as the first choice of every call ("" restores the platform's
// own order). An unknown name is an Error listing the valid ones.
void set_backend(std::string_view name);
std::string backend_override();  // "" when none
// Every registered backend name, in registration order.
std::vector<std::string> backend_names();

// Strict mode: a call its first-choice backend cannot run fails with the reason.
void set_strict(bool on);
bool strict();

// Host fallback for device tensors: a call that no backend of its device can run may then
// run on the CPU reference through host copies of its tensors (the backend "cuda-host"),
// counted, warned about and traced like every fallback. Off by default, so that device
// tensors never silently run on the host: such a call is then an Error with every
// backend's reason. KERNEL_ALIGN_HOST_FALLBACK=0|1 sets it at first use.
void set_host_fallback(bool on);
bool host_fallback();

// Calls that ran on a backend other than their first choice, since the start.
std::uint64_t fallback_count();

// Appends one JSON record per call to `path` (created if absent, never truncated: a
// new session, docs/trace.md); "" stops.
void set_trace_path(const std::string& path);
std::string trace_path();

// What the last call made by this thread ran on, and why.
struct CallReport {
  std::string requested_backend;
  std::string backend;
  std::string isa;
  std::string fallback;  // "" unless it fell back: why the requested backend did not run it
  // Wall time of the backend running the call (its kernels and threads), without
  // validation, the registry's choice and tracing.
  double backend_seconds = 0.0;
  // Wall time of the whole library call, from entering the public function to its
  // return (validation, the registry's choice, the backend, tracing): the raw C++ call
  // that a binding's overhead is measured against, paired call by call.
  double call_seconds = 0.0;
};
CallReport last_call();

// The registry as a table (kernel-align backends): one row per platform and op.
struct BackendStatus {
  std::string name;
  bool available = false;
  std::string unavailable_reason;  // why not, when not available
  std::string isa_paths;           // e.g. "avx2 (best), portable"
  std::string supports;            // the declared capabilities, in words
  std::string fingerprint;
};
struct RegistryRow {
  Platform platform;
  OpType op;
  std::vector<BackendStatus> backends;  // in priority order; empty: none registered
};
std::vector<RegistryRow> registry_table();

}  // namespace kernel_align
