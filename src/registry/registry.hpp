// The registry's data model: what a backend declares, and the choice of one for a call
// (read from the call's record, api/call.hpp). The backends themselves are registered
// in backends.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/call.hpp"
#include "kernel_align/registry.hpp"

namespace kernel_align::registry {

// A set of enumerators (dtypes, layouts, ...) as bits.
template <class Enum>
constexpr unsigned bit(Enum e) {
  return 1u << static_cast<unsigned>(e);
}

// What a backend accepts; a call outside it goes to the next backend in the list.
struct Capabilities {
  unsigned dtypes = bit(DType::F32) | bit(DType::BF16) | bit(DType::F16);
  bool needs_contiguous_rows = false;
  std::size_t min_alignment = 1;  // bytes
  // The backend's own test of a call's options and shapes (ggml's supports_op): why it
  // cannot run `call`, in words, or "" when it can. Null: it runs every valid call. It
  // reads the record's options by name (CallRecord::option) and its tensors' shapes.
  std::string (*unsupported)(const detail::CallRecord& call) = nullptr;
};

// Why `caps` does not cover `call` (its dtypes, the backend's own test, strides and data
// alignment), in words ("" when it does).
std::string unsupported_reason(const Capabilities& caps, const detail::CallRecord& call);
// The capabilities in words, for the backends table.
std::string describe(const Capabilities& caps);

// One kernel launch of a device backend, for the trace record.
struct LaunchRecord {
  std::string kernel;  // e.g. "rmsnorm_forward"
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  int rows_per_block = 0;  // rows a thread block computes (0: not row-based)
  // Shared memory a block gets beyond its kernel's fixed Shared struct, sized by the call
  // (Grid::dynamic_shared()).
  unsigned dynamic_shared_bytes = 0;
  std::string path;  // "fast" (vector loads, D = 128) or "generic"
};

// One call as a backend runs it: where (set by the op layer), and how it ran (set by the
// backend, for the trace record).
struct Execution {
  Device device;             // the device every tensor of the call lives on
  ExecutionContext context;  // where a device backend queues its work
  std::string isa;  // instruction-set path, "scalar" for the reference, "cuda" for sm_XX code
  int threads = 1;  // threads that ran the call: the most of any of its passes
  // Whether the call is traced (set by the op layer): only then do CPU backends fill
  // `partition`, which allocates.
  bool traced = false;
  // Row ranges handed to threads, one list per parallel pass (CPU backends).
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> partition;
  std::vector<LaunchRecord> launches;  // device backends, in launch order
  // Stream-ordered time of the launches (device events), when measured: only while
  // tracing, since reading it waits for the stream.
  std::optional<double> device_milliseconds;
};

// A backend's kernels, keyed by (op, direction): each takes that kernel's problem
// (detail::ProblemOf, api/problems.hpp). An empty slot: the backend does not implement it.
template <OpType op, Direction d>
using KernelFn = void (*)(const detail::Problem<op, d>&, Execution&);

class Kernels {
 public:
  template <OpType op, Direction d>
  void set(KernelFn<op, d> kernel) {
    // Stored type-erased, read back as the same type by get<op, d>().
    slots_[slot(op, d)] = reinterpret_cast<void (*)()>(kernel);
  }
  template <OpType op, Direction d>
  KernelFn<op, d> get() const {
    return reinterpret_cast<KernelFn<op, d>>(slots_[slot(op, d)]);
  }
  bool has(OpType op, Direction d) const { return slots_[slot(op, d)] != nullptr; }

 private:
  static constexpr int slot(OpType op, Direction d) {
    return 2 * static_cast<int>(op) + static_cast<int>(d);
  }
  std::array<void (*)(), 2 * kOpCount> slots_{};
};

// digest-v1 of each batch element of an output (trace/digest.hpp's batch_digests),
// computed where the tensor lives.
using BatchDigestsFn = std::vector<std::uint64_t> (*)(const ConstTensorView&, const Execution&);

struct Backend {
  std::string name;
  Platform platform = Platform::Cpu;
  int priority = 0;  // lower runs first among the platform's backends
  Capabilities capabilities;
  // "" when it can run on this machine, else why not.
  std::string (*unavailable_reason)() = nullptr;
  std::string (*isa_paths)() = nullptr;
  std::string fingerprint;
  Kernels kernels;
  // Null: the backend's tensors are in host memory and the trace digests them there.
  BatchDigestsFn batch_digests = nullptr;
};

// Whether `b` implements (op, direction).
bool implements(const Backend& b, OpType op, Direction direction);

// Backends in priority order, without allocating (a call must not allocate).
inline constexpr int kMaxBackends = 16;
struct BackendList {
  std::array<const Backend*, kMaxBackends> items{};
  int count = 0;
  const Backend* const* begin() const { return items.data(); }
  const Backend* const* end() const { return items.data() + count; }
};

// The backends of the platform that implement the op, in priority order.
BackendList candidates(Platform platform, OpType op, Direction direction);

// The choice for one call, from the platform of its tensors' device: the backend to run
// and the first choice (never null; they differ on a fallback, whose reason is then
// set). Throws Error in strict mode, or when no backend can run the call, with every
// backend's reason. Backends are never freed while registered, so the pointers outlive
// the call. Allocates nothing unless it falls back or throws.
struct Choice {
  const Backend* backend = nullptr;
  const Backend* requested = nullptr;
  std::string fallback;  // "" unless it fell back
};
Choice choose(const detail::CallRecord& call);

// Registers a backend for the life of the object (backends.cpp holds the built-in
// ones; tests add backends with narrow capabilities to exercise the selection).
class ScopedRegistration {
 public:
  explicit ScopedRegistration(Backend backend);
  ~ScopedRegistration();
  ScopedRegistration(const ScopedRegistration&) = delete;
  ScopedRegistration& operator=(const ScopedRegistration&) = delete;

 private:
  std::string name_;
};

// The built-in backends (backends.cpp).
std::vector<Backend> builtin_backends();

// Records what the calling thread's last call ran on (last_call()).
void set_last_call(CallReport report);

}  // namespace kernel_align::registry
