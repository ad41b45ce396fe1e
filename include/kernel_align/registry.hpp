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
#include "kernel_align/op_list.hpp"

namespace kernel_align {

// The ops of ops.hpp, one enumerator per row of op_list.hpp: the registry's keys, with
// the direction and the platform.
enum class OpType : unsigned char {
// One enumerator per op (a local macro, undefined right after).
#define KERNEL_ALIGN_OP_ENUMERATOR(op, name) op,
  KERNEL_ALIGN_OPS(KERNEL_ALIGN_OP_ENUMERATOR)
#undef KERNEL_ALIGN_OP_ENUMERATOR
};

// The two directions of an op: its forward and its gradient.
enum class Direction : unsigned char { Forward, Backward };

// Every op, in enum order.
inline constexpr OpType kOpTypes[] = {
// One item per op (a local macro, undefined right after).
#define KERNEL_ALIGN_OP_ITEM(op, name) OpType::op,
    KERNEL_ALIGN_OPS(KERNEL_ALIGN_OP_ITEM)
#undef KERNEL_ALIGN_OP_ITEM
};

// The number of ops.
inline constexpr int kOpCount = static_cast<int>(sizeof kOpTypes / sizeof kOpTypes[0]);

// Both directions, forward first.
inline constexpr Direction kDirections[] = {Direction::Forward, Direction::Backward};

// The op's name ("qk_rmsnorm", as op_list.hpp spells it); "forward", "backward" (trace
// records).
const char* op_type_name(OpType op);
const char* direction_name(Direction d);

// The names an enumerated option of `op` accepts, in the order of its enum ("bshd",
// "bhsd" for multi_axis_rope's "layout"); empty when `op` has no such option. From the
// op's descriptor, the one list that the trace, the CLI and the bindings read.
std::vector<std::string> option_choices(OpType op, std::string_view option);

// Forces backend `name` as the first choice of every call ("" restores the platform's
// own order). An unknown name is an Error naming "backend" and listing the valid ones.
// A forced backend that cannot run a call falls back (or fails in strict mode).
void set_backend(std::string_view name);
std::string backend_override();  // the name set_backend forced; "" when none
// The same for the calls made on the calling thread only, ahead of set_backend's choice
// ("" removes it; it ends with the thread), so that two threads can run one op on two
// backends side by side (verify runs the reference beside the backend under test). An
// unknown name is an Error as for set_backend; a backend unregistered since is one at the
// thread's next call.
void set_thread_backend(std::string_view name);
std::string thread_backend_override();  // this thread's forced name; "" when none
// Every registered backend name, in registration order.
std::vector<std::string> backend_names();

// Strict mode: a call its first-choice backend cannot run fails with the reason (an Error
// naming "backend") instead of falling back. Off by default; KERNEL_ALIGN_STRICT=0|1.
void set_strict(bool on);
bool strict();

// Host fallback for device tensors: a call that no backend of its device can run may then
// run on the CPU reference through host copies of its tensors (the backend "cuda-host"),
// counted, warned about and traced like every fallback. Off by default, so that device
// tensors never silently run on the host: such a call is then an Error with every
// backend's reason. KERNEL_ALIGN_HOST_FALLBACK=0|1 sets it at first use.
void set_host_fallback(bool on);
bool host_fallback();

// Calls that ran on a backend other than their first choice, since the start of the
// process (all threads).
std::uint64_t fallback_count();

// Appends one JSON record per call to `path` (created if absent, never truncated: a
// new session, docs/trace.md); "" stops. A file that cannot be opened for appending is an
// Error naming "trace" (tracing is then off); a path holding a NUL is an Error naming
// "path", and the trace open before stays open.
void set_trace_path(const std::string& path);
std::string trace_path();  // the file being traced to; "" when tracing is off

// What the last call made by this thread ran on, and why.
struct CallReport {
  std::string requested_backend;  // the first choice: the forced backend or the platform's first
  std::string backend;            // the backend that ran the call
  std::string isa;                // its path: "avx2", "portable", "scalar", "cuda", ...
  std::string fallback;  // "" unless it fell back: why the requested backend did not run it
  // Wall time of the backend running the call (its kernels and threads), without
  // validation, the registry's choice and tracing.
  double backend_seconds = 0.0;
  // Wall time of the whole library call, from entering the public function to its
  // return (validation, the registry's choice, the backend, tracing): the raw C++ call
  // that a binding's overhead is measured against, paired call by call.
  double call_seconds = 0.0;
};
// The report of the calling thread's last op call (all fields empty or 0 before its
// first); a call that threw leaves the previous report.
CallReport last_call();

// The registry as a table (kernel-align backends): one row per platform and op, each
// listing its backends' status.
struct BackendStatus {
  std::string name;                // as set_backend takes it
  bool available = false;          // whether it can run here (a CUDA device seen, ...)
  std::string unavailable_reason;  // why not, when not available
  std::string isa_paths;           // e.g. "avx2 (best), portable"
  std::string supports;            // the declared capabilities, in words
  std::string fingerprint;         // 16 hex digits of the backend's arithmetic (docs/trace.md)
};
// One row of the registry table: the backends of one platform and op.
struct RegistryRow {
  Platform platform;
  OpType op;
  std::vector<BackendStatus> backends;  // in priority order; empty: none registered
};
// Every platform x op, platforms and ops in enum order (what `kernel-align backends`
// prints); a row whose platform has no backend has none.
std::vector<RegistryRow> registry_table();

}  // namespace kernel_align
