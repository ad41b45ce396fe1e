// Per-call trace records (docs/trace.md): one JSON line per call, written whole.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernel_align/ops.hpp"
#include "registry/registry.hpp"

namespace kernel_align::trace {

struct TensorArg {
  const char* name = "";
  ConstTensorView view;
  bool output = false;
};

// A call's tensor arguments in signature order, without allocating (the fused
// backward has the most: 16).
class TensorArgs {
 public:
  static constexpr int kCapacity = 16;
  void add(const char* name, const ConstTensorView& view, bool output) {
    items_[count_++] = {name, view, output};
  }
  template <class View>
  void add(const char* name, const std::optional<View>& view, bool output) {
    if (view) add(name, *view, output);
  }
  const TensorArg* begin() const { return items_.data(); }
  const TensorArg* end() const { return items_.data() + count_; }

 private:
  std::array<TensorArg, kCapacity> items_{};
  int count_ = 0;
};

// What the op layer knows about a call.
struct CallDescription {
  OpType op = OpType::QkRmsNorm;
  Direction direction = Direction::Forward;
  TensorArgs tensors;
  std::optional<Layout> layout;
  std::optional<Pairing> pairing;
  std::optional<NormMode> mode;
  std::optional<float> eps;
  std::optional<std::int64_t> text_len;
  DType output_dtype = DType::F32;
  bool computes_dw = false;
};

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

// Appends the record of a completed call. Throws Error naming `trace` when the write
// fails.
void write(const CallDescription& call, const registry::Choice& choice,
           const registry::Execution& exec, const FloatState& float_state);

}  // namespace kernel_align::trace
