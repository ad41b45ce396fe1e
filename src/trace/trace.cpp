#include "trace/trace.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "core/json_text.hpp"
#include "core/splitmix64.hpp"
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
  std::string session;  // 16 hex digits, new at every opening and in every forked child
  std::uint64_t next_seq = 0;
  pid_t owner = 0;  // the process whose session `session` is
  // A regular file can be locked and cut back after a failed write; a FIFO or a device
  // cannot.
  bool regular = false;
  // A regular file that had a name when opened: when its last name is gone (the file
  // was removed), the next record creates it again.
  bool recreate_if_removed = false;

  // Opens `path` for appending ("" closes); the caller holds the mutex (so do the
  // members below).
  void open_locked(const std::string& new_path);
  void begin_session();
  // Before a record: a forked child starts a session of its own (it inherited the
  // parent's id and count), and a removed trace file is created again.
  void prepare_locked();
  // Appends `line` whole, or throws Error naming `trace` having cut back what it wrote.
  void append_locked(const std::string& line) const;
  // Why `written` bytes of a failed record do not stay in the file, or where they stay.
  std::string take_back_locked(std::size_t written) const;
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
  struct stat st {};
  regular = ::fstat(opened, &st) == 0 && S_ISREG(st.st_mode);
  // A file opened without a name (/proc/self/fd/N of an O_TMPFILE) has no link to lose.
  recreate_if_removed = regular && st.st_nlink > 0;
  fd = opened;
  path = new_path;
  begin_session();
  detail::enabled = true;
}

void Sink::begin_session() {
  session = new_session_id();
  next_seq = 0;
  owner = ::getpid();
}

void Sink::prepare_locked() {
  if (owner != ::getpid()) begin_session();
  struct stat st {};
  if (recreate_if_removed && ::fstat(fd, &st) == 0 && st.st_nlink == 0) {
    // Its records would go on into the unlinked file, where nothing can read them.
    open_locked(std::string(path));
  }
}

// A whole-file write lock (fcntl; held by this process, so a forked child waits for
// it too) around a record on a regular file: the library's writers in other processes
// wait, so none appends after a record cut short before it is cut back. Where the file
// system has no such locks the record is written all the same.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd), locked_(set(F_WRLCK)) {}
  ~FileLock() {
    if (locked_) set(F_UNLCK);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  bool set(short type) const {
    struct flock whole {};
    whole.l_type = type;
    whole.l_whence = SEEK_SET;  // l_start 0, l_len 0: the whole file, however long
    int result = 0;
    while ((result = ::fcntl(fd_, F_SETLKW, &whole)) != 0 && errno == EINTR) {
    }
    return result == 0;
  }

  int fd_;
  bool locked_;
};

void Sink::append_locked(const std::string& line) const {
  std::optional<FileLock> lock;
  if (regular) lock.emplace(fd);
  // One write in the common case; a regular file's write returns short only when it
  // cannot go on (a full disk, a quota, the file size limit), a pipe's also on a signal.
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const std::string why = n < 0 ? std::strerror(errno) : "no byte written";
    throw Error("trace", "a record appended to " + path,
                "write failed: " + why + take_back_locked(done));
  }
}

std::string Sink::take_back_locked(std::size_t written) const {
  if (written == 0) return "";
  const std::string part = "; " + std::to_string(written) + " of its bytes ";
  if (!regular) return part + "were written";
  // With O_APPEND the offset is the end of what this write appended. The file is cut
  // back only if it still ends there: a writer that takes no lock may have appended
  // after, and cutting would lose its bytes.
  const off_t end = ::lseek(fd, 0, SEEK_CUR);
  const off_t start = end - static_cast<off_t>(written);
  struct stat st {};
  if (end >= 0 && start >= 0 && ::fstat(fd, &st) == 0 && st.st_size == end &&
      ::ftruncate(fd, start) == 0) {
    return part + "were cut off again: the file is as it was before the record";
  }
  return part + "stay at byte " + std::to_string(start) +
         " of the file, a line that trace diff names as cut short";
}

// The sink starts from KERNEL_ALIGN_TRACE, read at its first use (a call's registry
// lookup or a trace control, whichever is first): an explicit set_trace_path is never
// overridden by the environment afterwards.
Sink& sink() {
  static Sink& s = []() -> Sink& {
    static Sink opened;
    const char* path = std::getenv("KERNEL_ALIGN_TRACE");
    if (path != nullptr && *path != '\0') opened.open_locked(path);
    // fork() waits for a record in progress: a child copies only the forking thread, and
    // a lock held by another would be held in the child for ever. Registered once the
    // opening above has not thrown, as a throw makes the next use run this again.
    ::pthread_atfork([] { opened.mutex.lock(); }, [] { opened.mutex.unlock(); },
                     [] { opened.mutex.unlock(); });
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

// An option's value as JSON: a name quoted, an fp32 value with 9 significant digits
// (exact for a float), an integer in full.
std::string json_of(const kernel_align::detail::OptionValue& o) {
  switch (o.kind) {
    case kernel_align::detail::OptionKind::Choice:
      return quoted(o.choice);
    case kernel_align::detail::OptionKind::Float: {
      char text[32];
      std::snprintf(text, sizeof text, "%.9g", static_cast<double>(o.number));
      return text;
    }
    case kernel_align::detail::OptionKind::Integer:
      return std::to_string(o.integer);
  }
  return "null";
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
  for (const kernel_align::detail::OptionValue& o : call.options) r += field(o.name, json_of(o));
  r += field("accumulator", quoted("fp32"));
  r += field("output_dtype", quoted(dtype_name(call.output_dtype)));
  const char* tree = kernel_align::detail::descriptor(call.op).reduction_tree;
  r += field("reduction_tree", tree != nullptr ? quoted(tree) : "null");
  for (const kernel_align::detail::BlockSize& b : call.block_sizes) {
    r += field(b.name, std::to_string(b.value));
  }
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
                      ",\"dynamic_shared_bytes\":" + std::to_string(l.dynamic_shared_bytes) +
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
    if (choice.backend->batch_digests != nullptr) {
      return choice.backend->batch_digests(v, exec);
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
  s.prepare_locked();
  std::string line = "{\"seq\":";
  line.append(std::to_string(s.next_seq))
      .append(",\"session\":")
      .append(quoted(s.session))
      .append(",\"pid\":")
      .append(std::to_string(s.owner))
      .append(body)
      .append("}\n");
  s.append_locked(line);
  ++s.next_seq;  // a record that failed takes no seq: the session's records have no gap
  return true;
}

}  // namespace

void write(const kernel_align::detail::CallRecord& call, const registry::Choice& choice,
           const registry::Execution& exec, const FloatState& float_state) {
  write_record(record_body(call, choice, exec, float_state));
}

}  // namespace trace

void set_trace_path(const std::string& path) {
  // The system reads a path up to its first NUL: "/tmp/a\0/etc/x" would open /tmp/a.
  if (const std::size_t nul = path.find('\0'); nul != std::string::npos) {
    throw Error(
        "path", "a path without NUL characters",
        "a NUL at character " + std::to_string(nul) + ", after '" + path.substr(0, nul) + "'");
  }
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
