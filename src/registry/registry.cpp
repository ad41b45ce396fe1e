// Backend selection: the registered backends, the override and strict settings, and
// the fallback accounting.
#include "registry/registry.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <list>
#include <mutex>
#include <optional>
#include <set>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "trace/trace.hpp"

namespace kernel_align {
namespace registry {
namespace {

struct State {
  std::mutex mutex;             // guards everything but the atomics
  std::list<Backend> backends;  // a list: entries never move while registered
  std::string override_name;
  std::atomic<bool> strict{false};
  std::atomic<bool> host_fallback{false};
  std::atomic<std::uint64_t> fallbacks{0};
  std::set<std::string> warned;  // "op direction: reason" already logged
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string names_of(const std::list<Backend>& backends) {
  std::string names;
  for (const Backend& b : backends) names += (names.empty() ? "" : ", ") + b.name;
  return names;
}

const Backend* find_locked(const State& s, std::string_view name) {
  for (const Backend& b : s.backends) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

void check_known_locked(const State& s, const std::string& argument, std::string_view name) {
  if (find_locked(s, name) == nullptr) {
    throw Error(argument, "a backend name, one of " + names_of(s.backends),
                "'" + std::string(name) + "'");
  }
}

State& state() {
  static State s;
  static std::once_flag from_environment;
  std::call_once(from_environment, [] {
    // A bad environment value throws, and call_once runs this again at the next use.
    s.backends.clear();
    for (Backend& b : builtin_backends()) s.backends.push_back(std::move(b));
    if (const std::string name = env("KERNEL_ALIGN_BACKEND"); !name.empty()) {
      check_known_locked(s, "KERNEL_ALIGN_BACKEND", name);
      s.override_name = name;
    }
    for (const auto& [name, setting] :
         {std::pair{"KERNEL_ALIGN_STRICT", &s.strict},
          std::pair{"KERNEL_ALIGN_HOST_FALLBACK", &s.host_fallback}}) {
      if (const std::string flag = env(name); !flag.empty()) {
        if (flag != "0" && flag != "1") throw Error(name, "0 or 1", "'" + flag + "'");
        *setting = flag == "1";
      }
    }
    trace::initialize();
  });
  return s;
}

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};

// "fp32, bf16": the names of the dtypes in `set`.
std::string dtype_names(unsigned set) {
  std::string text;
  for (const DType t : kDTypes) {
    if ((set & bit(t)) != 0) text += (text.empty() ? "" : ", ") + std::string(dtype_name(t));
  }
  return text;
}

BackendList candidates_locked(const State& s, Platform platform, OpType op, Direction direction) {
  BackendList list;
  for (const Backend& b : s.backends) {
    if (b.platform == platform && implements(b, op, direction)) list.items[list.count++] = &b;
  }
  // By priority, registration order among equals: an insertion sort, since
  // std::stable_sort allocates a buffer and a call must not allocate.
  for (int i = 1; i < list.count; ++i) {
    for (int j = i; j > 0 && list.items[j - 1]->priority > list.items[j]->priority; --j) {
      std::swap(list.items[j - 1], list.items[j]);
    }
  }
  return list;
}

std::string call_name(const detail::CallRecord& call) {
  return std::string(op_type_name(call.op)) + " " + direction_name(call.direction);
}

// Why `b` cannot run `call` ("" when it can).
std::string cannot_run(const Backend& b, const detail::CallRecord& call) {
  if (b.platform != call.device.platform) {
    return std::string("runs on ") + platform_name(b.platform) + ", the tensors are on " +
           platform_name(call.device.platform);
  }
  if (const std::string why = b.unavailable_reason(); !why.empty()) return "unavailable: " + why;
  if (!implements(b, call.op, call.direction)) return "does not implement " + call_name(call);
  return unsupported_reason(b.capabilities, call);
}

// Whether every tensor of the call has unit stride in its last dim.
bool rows_contiguous(const detail::CallRecord& call) {
  return std::all_of(call.tensors.begin(), call.tensors.end(), [](const detail::TensorArg& t) {
    return t.view.strides[t.view.rank - 1] == 1;
  });
}

// The largest power of two dividing every data address of the call (a page when it has
// no tensor).
std::size_t alignment(const detail::CallRecord& call) {
  std::uintptr_t addresses = 0;
  for (const detail::TensorArg& t : call.tensors) {
    addresses |= reinterpret_cast<std::uintptr_t>(t.view.data);
  }
  constexpr std::size_t kPage = 4096;
  return addresses == 0 ? kPage : std::size_t{1} << std::countr_zero(addresses);
}

}  // namespace

std::string unsupported_reason(const Capabilities& caps, const detail::CallRecord& call) {
  unsigned dtypes = 0;
  for (const detail::TensorArg& t : call.tensors) dtypes |= bit(t.view.dtype);
  for (const DType t : kDTypes) {
    if ((dtypes & bit(t)) != 0 && (caps.dtypes & bit(t)) == 0) {
      return std::string("dtype ") + dtype_name(t) + " is not supported (supports " +
             dtype_names(caps.dtypes) + ")";
    }
  }
  if (caps.unsupported != nullptr) {
    if (std::string why = caps.unsupported(call); !why.empty()) return why;
  }
  if (caps.needs_contiguous_rows && !rows_contiguous(call)) {
    return "needs rows with unit stride in the last dim";
  }
  if (const std::size_t aligned = alignment(call); aligned < caps.min_alignment) {
    return "needs data aligned to " + std::to_string(caps.min_alignment) + " bytes, got " +
           std::to_string(aligned);
  }
  return "";
}

std::string describe(const Capabilities& caps) {
  std::string text = dtype_names(caps.dtypes);
  if (caps.unsupported != nullptr) text += "; options and shapes by its own test";
  text += caps.needs_contiguous_rows ? "; unit-stride rows" : "; any strides";
  if (caps.min_alignment > 1) text += "; " + std::to_string(caps.min_alignment) + "-byte aligned";
  return text;
}

bool implements(const Backend& b, OpType op, Direction direction) {
  return b.kernels.has(op, direction);
}

BackendList candidates(Platform platform, OpType op, Direction direction) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  return candidates_locked(s, platform, op, direction);
}

namespace {
// set_thread_backend's name; ahead of the process-wide override.
thread_local std::string thread_override_name;
}  // namespace

Choice choose(const detail::CallRecord& call) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  BackendList order;
  if (!thread_override_name.empty()) {
    // Checked here, not only when set: ScopedRegistration may have removed it since.
    check_known_locked(s, "backend", thread_override_name);
    order.items[order.count++] = find_locked(s, thread_override_name);
  } else if (!s.override_name.empty()) {
    order.items[order.count++] = find_locked(s, s.override_name);
  }
  for (const Backend* b : candidates_locked(s, call.device.platform, call.op, call.direction)) {
    if (order.count == 0 || b != order.items[0]) order.items[order.count++] = b;
  }
  if (order.count == 0) {
    throw Error("backend",
                std::string("a backend registered for ") + call_name(call) + " on " +
                    platform_name(call.device.platform),
                "none");
  }
  Choice choice;
  choice.requested = order.items[0];
  std::string reasons;
  for (const Backend* b : order) {
    const std::string why = cannot_run(*b, call);
    if (why.empty()) {
      choice.backend = b;
      break;
    }
    if (choice.fallback.empty()) choice.fallback = choice.requested->name + ": " + why;
    reasons += (reasons.empty() ? "" : "; ") + b->name + ": " + why;
  }
  if (choice.backend == nullptr) {
    throw Error("backend",
                std::string("a backend that can run this ") + call_name(call) + " call on " +
                    platform_name(call.device.platform),
                reasons);
  }
  if (choice.backend == choice.requested) return choice;
  if (s.strict) {
    throw Error("backend",
                "'" + choice.requested->name + "' to run this " + call_name(call) +
                    " call (strict mode: no fallback)",
                choice.fallback);
  }
  ++s.fallbacks;
  const std::string key = call_name(call) + ": " + choice.fallback;
  if (s.warned.insert(key).second) {
    std::cerr << "kernel-align: warning: " << call_name(call) << " fell back from "
              << choice.requested->name << " to " << choice.backend->name << " (" << choice.fallback
              << "); every fallback is counted and traced, this warning is shown once\n";
  }
  return choice;
}

ScopedRegistration::ScopedRegistration(Backend backend) : name_(backend.name) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  if (find_locked(s, name_) != nullptr) {
    throw Error("backend", "a name not yet registered", "'" + name_ + "'");
  }
  if (s.backends.size() >= kMaxBackends) {
    throw Error("backend", "at most " + std::to_string(kMaxBackends) + " registered backends",
                std::to_string(s.backends.size() + 1));
  }
  s.backends.push_back(std::move(backend));
}

ScopedRegistration::~ScopedRegistration() {
  // The constructor initialised state(), and erasing does not throw; only locking could,
  // and a registry that cannot be locked cannot be left consistent.
  try {
    State& s = state();
    const std::lock_guard lock(s.mutex);
    std::erase_if(s.backends, [&](const Backend& b) { return b.name == name_; });
    if (s.override_name == name_) s.override_name.clear();
  } catch (...) {
    std::terminate();
  }
}

namespace {
thread_local CallReport last_report;
}  // namespace

void set_last_call(CallReport report) {
  last_report = std::move(report);
}

}  // namespace registry

const char* op_type_name(OpType op) {
  switch (op) {
#define KERNEL_ALIGN_OP_NAME(op, name) \
  case OpType::op:                     \
    return #name;
    KERNEL_ALIGN_OPS(KERNEL_ALIGN_OP_NAME)
#undef KERNEL_ALIGN_OP_NAME
  }
  return "?";
}

const char* direction_name(Direction d) {
  return d == Direction::Forward ? "forward" : "backward";
}

void set_backend(std::string_view name) {
  registry::State& s = registry::state();
  const std::lock_guard lock(s.mutex);
  if (!name.empty()) registry::check_known_locked(s, "backend", name);
  s.override_name = std::string(name);
}

std::string backend_override() {
  registry::State& s = registry::state();
  const std::lock_guard lock(s.mutex);
  return s.override_name;
}

void set_thread_backend(std::string_view name) {
  registry::State& s = registry::state();
  const std::lock_guard lock(s.mutex);
  if (!name.empty()) registry::check_known_locked(s, "backend", name);
  registry::thread_override_name = std::string(name);
}

std::string thread_backend_override() {
  return registry::thread_override_name;
}

std::vector<std::string> backend_names() {
  registry::State& s = registry::state();
  const std::lock_guard lock(s.mutex);
  std::vector<std::string> names;
  for (const registry::Backend& b : s.backends) names.push_back(b.name);
  return names;
}

void set_strict(bool on) {
  registry::state().strict = on;
}
bool strict() {
  return registry::state().strict;
}

void set_host_fallback(bool on) {
  registry::state().host_fallback = on;
}
bool host_fallback() {
  return registry::state().host_fallback;
}

std::uint64_t fallback_count() {
  return registry::state().fallbacks;
}

CallReport last_call() {
  return registry::last_report;
}

std::vector<RegistryRow> registry_table() {
  registry::State& s = registry::state();
  const std::lock_guard lock(s.mutex);
  std::vector<RegistryRow> rows;
  for (const Platform platform :
       {Platform::Cpu, Platform::Cuda, Platform::Rocm, Platform::Musa, Platform::Npu}) {
    for (const OpType op : kOpTypes) {
      RegistryRow row{platform, op, {}};
      for (const registry::Backend* b :
           registry::candidates_locked(s, platform, op, Direction::Forward)) {
        const std::string why = b->unavailable_reason();
        row.backends.push_back({b->name, why.empty(), why, b->isa_paths(),
                                registry::describe(b->capabilities), b->fingerprint});
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace kernel_align
