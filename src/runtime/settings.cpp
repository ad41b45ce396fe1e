// Process-wide choices of instruction-set path and thread count. Each
// starts from its environment variable (read once, at first use; a bad value is
// an Error at that use, never a silent default) and can be overridden by the API.
#include <atomic>
#include <charconv>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "kernel_align/error.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align {
namespace {

struct Settings {
  std::atomic<Isa> isa{Isa::Portable};
  std::atomic<int> threads{1};
};

#if defined(__x86_64__) || defined(__i386__)
// F16C is CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know it);
// the AVX checks below also cover the OS saving the wider registers.
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

Isa detect_best_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && has_f16c();
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::Avx512;
  }
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Portable;
}

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

Isa parse_isa(const std::string& argument, const std::string& text) {
  for (Isa i : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
    if (text == isa_name(i)) return i;
  }
  throw Error(argument, "one of portable, avx2, avx512", "'" + text + "'");
}

void check_isa_supported(const std::string& argument, Isa i) {
  if (i > best_isa()) {
    throw Error(argument,
                std::string("a path this CPU supports (at most ") + isa_name(best_isa()) + ")",
                isa_name(i));
  }
}

void check_threads(const std::string& argument, long long n) {
  if (n < 1 || n > 4096) throw Error(argument, "a thread count from 1 to 4096", std::to_string(n));
}

Settings& settings() {
  static Settings s;
  static std::once_flag from_environment;
  std::call_once(from_environment, [] {
    s.isa = best_isa();
    s.threads = default_threads();
    if (const std::string i = env("KERNEL_ALIGN_ISA"); !i.empty()) {
      const Isa isa = parse_isa("KERNEL_ALIGN_ISA", i);
      check_isa_supported("KERNEL_ALIGN_ISA", isa);
      s.isa = isa;
    }
    if (const std::string t = env("KERNEL_ALIGN_NUM_THREADS"); !t.empty()) {
      s.threads = parse_num_threads("KERNEL_ALIGN_NUM_THREADS", t);
    }
  });
  return s;
}

}  // namespace

const char* isa_name(Isa i) {
  switch (i) {
    case Isa::Portable:
      return "portable";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

Isa best_isa() {
  static const Isa best = detect_best_isa();
  return best;
}

void set_isa(Isa i) {
  check_isa_supported("isa", i);
  settings().isa = i;
}
Isa isa() {
  return settings().isa;
}

void set_num_threads(long long n) {
  check_threads("threads", n);
  settings().threads = static_cast<int>(n);
}

int parse_num_threads(const std::string& argument, std::string_view text) {
  long long n = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, n);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    throw Error(argument, "a thread count from 1 to 4096 (decimal digits only)",
                "'" + std::string(text) + "'");
  }
  if (ec == std::errc::result_out_of_range) {
    throw Error(argument, "a thread count from 1 to 4096", std::string(text));
  }
  check_threads(argument, n);
  return static_cast<int>(n);
}
int num_threads() {
  return settings().threads;
}

}  // namespace kernel_align
