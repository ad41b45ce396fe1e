#include "trace/trace.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "core/json_text.hpp"
#include "core/splitmix64.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/contract/version.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/trace.hpp"
#include "kernel_align/version.hpp"
#include "trace/digest.hpp"

namespace kernel_align {
namespace trace {

std::atomic<bool> detail::enabled{false};

namespace {

struct Sink {
  std::mutex mutex;
  int fd = -1;
  std::string path;
  std::string session;  // 16 hex digits, new at every opening
  std::uint64_t next_seq = 0;

  // Opens `path` for appending ("" closes); the caller holds the mutex.
  void open_locked(const std::string& new_path);
};

// A 64-bit id that no other opening of a trace shares, in this process or another:
// the kernel's randomness (getrandom), the process id and a count of openings.
std::string new_session_id() {
  static std::atomic<std::uint64_t> openings{0};
  std::random_device random;
  const std::uint64_t entropy = (std::uint64_t{random()} << 32) ^ random();
  const auto pid = static_cast<std::uint64_t>(::getpid());
  const std::uint64_t id = SplitMix64(entropy ^ (pid << 32) ^ ++openings).next();
  char text[20];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(id));
  return text;
}

void Sink::open_locked(const std::string& new_path) {
  detail::enabled = false;
  if (fd >= 0) ::close(fd);
  fd = -1;
  path.clear();
  session.clear();
  next_seq = 0;
  if (new_path.empty()) return;
  // Appended, never truncated: processes sharing the file each add whole records.
  const int opened = ::open(new_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (opened < 0) {
    throw Error("trace", "a file that can be opened for appending",
                "'" + new_path + "': " + std::strerror(errno));
  }
  fd = opened;
  path = new_path;
  session = new_session_id();
  detail::enabled = true;
}

// The sink starts from KERNEL_ALIGN_TRACE, read at its first use (a call's registry
// lookup or a trace control, whichever is first): an explicit set_trace_path is never
// overridden by the environment afterwards.
Sink& sink() {
  static Sink& s = []() -> Sink& {
    static Sink opened;
    const char* path = std::getenv("KERNEL_ALIGN_TRACE");
    if (path != nullptr && *path != '\0') opened.open_locked(path);
    return opened;
  }();
  return s;
}

std::string quoted(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

std::string hex64(std::uint64_t v) {
  char text[20];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return quoted(text);
}

// Strings are built with append: g++ 12 reports a false -Wrestrict on
// `"literal" + std::string` chains.
template <class Items, class Format>
std::string array(const Items& items, const Format& format) {
  std::string out = "[";
  for (const auto& item : items) {
    if (out.size() > 1) out += ',';
    out += format(item);
  }
  out += ']';
  return out;
}

std::string dims(const ConstTensorView& v, const std::array<std::int64_t, kMaxRank>& values) {
  return array(std::span(values.data(), static_cast<std::size_t>(v.rank)),
               [](std::int64_t n) { return std::to_string(n); });
}

template <class T, class Name>
std::string optional_name(const std::optional<T>& value, const Name& name) {
  return value ? quoted(name(*value)) : "null";
}

std::string field(const char* key, const std::string& json) {
  std::string out = ",\"";
  out.append(key).append("\":").append(json);
  return out;
}

// The record after its "seq" member.
std::string record_body(const kernel_align::detail::CallRecord& call,
                        const registry::Choice& choice, const registry::Execution& exec,
                        const FloatState& fs) {
  std::string r;
  r += field("contract", quoted(contract::kVersionString));
  r += field("library", quoted(version()));
  r += field("op", quoted(op_type_name(call.op)));
  r += field("direction", quoted(direction_name(call.direction)));
  r += field("platform", quoted(platform_name(choice.backend->platform)));
  r += field("device", quoted(device_name(exec.device)));
  r += field("requested_backend", quoted(choice.requested->name));
  r += field("backend", quoted(choice.backend->name));
  r += field("isa", quoted(exec.isa));
  r += field("fallback", choice.fallback.empty() ? "null" : quoted(choice.fallback));
  r += field("fingerprint", quoted(choice.backend->fingerprint));
  r += field("tensors", array(call.tensors, [](const kernel_align::detail::TensorArg& t) {
               return "{\"name\":" + quoted(t.name) +
                      ",\"dtype\":" + quoted(dtype_name(t.view.dtype)) +
                      ",\"shape\":" + dims(t.view, t.view.shape) +
                      ",\"strides\":" + dims(t.view, t.view.strides) + "}";
             }));
  r += field("layout", optional_name(call.layout, layout_name));
  r += field("pairing", optional_name(call.pairing, pairing_name));
  r += field("mode", optional_name(call.mode, norm_mode_name));
  if (call.eps) {
    char eps[32];
    std::snprintf(eps, sizeof eps, "%.9g", static_cast<double>(*call.eps));
    r += field("eps", eps);
  } else {
    r += field("eps", "null");
  }
  r += field("text_len", call.text_len ? std::to_string(*call.text_len) : "null");
  r += field("accumulator", quoted("fp32"));
  r += field("output_dtype", quoted(dtype_name(call.output_dtype)));
  r += field("reduction_tree", quoted("tree16-v1"));
  r += field("dw_block_rows", call.computes_dw ? std::to_string(contract::kDwBlockRows) : "null");
  r += field("fma_contraction", "false");
  // Device code is built without flush-to-zero (-ftz=false, which the PTX gate checks);
  // host code runs under the MXCSR the call set, read back here.
  const bool on_host = exec.device.platform == Platform::Cpu;
  r += field("ftz", on_host ? (fs.known ? (fs.ftz ? "true" : "false") : "null") : "false");
  r += field("daz", on_host ? (fs.known ? (fs.daz ? "true" : "false") : "null") : "false");
  r += field("threads", std::to_string(exec.threads));
  r += field("partition", array(exec.partition, [](const auto& pass) {
               return array(pass, [](const std::pair<std::int64_t, std::int64_t>& range) {
                 return array(std::array{range.first, range.second},
                              [](std::int64_t n) { return std::to_string(n); });
               });
             }));
  r += field("launches", array(exec.launches, [](const registry::LaunchRecord& l) {
               const auto three = [](const std::array<unsigned, 3>& v) {
                 return array(v, [](unsigned n) { return std::to_string(n); });
               };
               return "{\"kernel\":" + quoted(l.kernel) + ",\"grid\":" + three(l.grid) +
                      ",\"block\":" + three(l.block) +
                      ",\"rows_per_block\":" + std::to_string(l.rows_per_block) +
                      ",\"path\":" + quoted(l.path) + "}";
             }));
  if (exec.device_milliseconds) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.6g", *exec.device_milliseconds);
    r += field("device_ms", ms);
  } else {
    r += field("device_ms", "null");
  }
  // Digests are taken where the tensor lives: a device backend digests on the device, so
  // tracing never copies an output back.
  const auto digests_of = [&](const ConstTensorView& v) {
    if (choice.backend->ops.batch_digests != nullptr) {
      return choice.backend->ops.batch_digests(v, exec);
    }
    if (v.device != Device::cpu()) {
      throw std::logic_error("backend " + choice.backend->name + " gives no digests of " +
                             device_name(v.device) + " tensors");
    }
    return batch_digests(v);
  };
  std::string digests = "{";
  for (const kernel_align::detail::TensorArg& t : call.tensors) {
    if (!t.output) continue;
    if (digests.size() > 1) digests += ',';
    digests.append(quoted(t.name)).append(":").append(array(digests_of(t.view), hex64));
  }
  digests += '}';
  r += field("digests", digests);
  return r;
}

void write_all(const Sink& s, const std::string& line) {
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(s.fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error("trace", "a record appended to " + s.path,
                  std::string("write failed: ") + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

FloatState read_float_state() {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = _mm_getcsr();
  return {true, (csr & 0x8000u) != 0, (csr & 0x40u) != 0};
#else
  return {};
#endif
}

void initialize() {
  sink();
}

namespace {

// Numbers and writes a record whose members after "pid" are `body` (starting with a
// comma). The library's calls and appended records share the one seq counter, so a
// session's records are numbered in the order they were written.
bool write_record(std::string_view body) {
  Sink& s = sink();
  const std::lock_guard lock(s.mutex);
  if (s.fd < 0) return false;  // turned off since the call began
  std::string line = "{\"seq\":";
  line.append(std::to_string(s.next_seq))
      .append(",\"session\":")
      .append(quoted(s.session))
      .append(",\"pid\":")
      .append(std::to_string(::getpid()))
      .append(body)
      .append("}\n");
  write_all(s, line);
  ++s.next_seq;
  return true;
}

}  // namespace

void write(const kernel_align::detail::CallRecord& call, const registry::Choice& choice,
           const registry::Execution& exec, const FloatState& float_state) {
  write_record(record_body(call, choice, exec, float_state));
}

}  // namespace trace

void set_trace_path(const std::string& path) {
  trace::Sink& s = trace::sink();
  const std::lock_guard lock(s.mutex);
  s.open_locked(path);
}

bool append_trace_record(std::string_view members) {
  if (!members.starts_with(',')) {
    throw Error("members", "the members of a record after \"pid\", starting with a comma",
                "'" + std::string(members.substr(0, 40)) + "'");
  }
  if (const std::size_t at = members.find_first_of("\r\n"); at != std::string_view::npos) {
    throw Error("members", "one line (a record is one line of the trace)",
                "a line break at character " + std::to_string(at));
  }
  return trace::write_record(members);
}

std::string trace_path() {
  trace::Sink& s = trace::sink();
  const std::lock_guard lock(s.mutex);
  return s.path;
}

}  // namespace kernel_align
